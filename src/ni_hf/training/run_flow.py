"""The run flow every example script shares, as transformers' examples share Trainer and a dozen lines of set-up.

A script parses its arguments (:func:`parse_arguments`), then runs inside :meth:`ExampleRun.start`::

    with ExampleRun.start(__file__, argv, args, logger) as run:
        model = run.model(MODEL_CLASS, config=config)        # or path=... for a saved model that must fit
        trainer = MyTrainer(model=model, args=args, optimizer_cls_and_kwargs=run.optimizer(), ...)
        train_metrics = run.train(trainer, train_samples=len(train))
        eval_metrics = run.evaluate(trainer)
        if run.is_main_process:
            card = write_my_card(...)                          # the script's own results and card
            run.append_routing_picture(card, lambda: write_assets(...))
        run.finish(trainer, "Trained with examples/my_script.py")

The steps are: logging, the seed, the output folder's lock, the resume point, the model (built, or loaded and
checked), RAdam when asked, train and save (weights, their checksum, the metrics of the whole run), evaluate, the
command that reproduces the run, the card's routing picture, and the push at the very end. Each script keeps only
what is its own: its arguments, its data and its results.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import HfArgumentParser, PreTrainedModel, Trainer, TrainingArguments, set_seed

from . import checkpoints, publishing
from .presets import Preset, explicit_arguments, parse_with_presets
from .run_setup import check_training_arguments, exit_on_bad_arguments, setup_logging

__all__ = ["ExampleRun", "argv_of", "parse_arguments", "refuse_unused"]

logger = logging.getLogger(__name__)


def parse_arguments(
    dataclass_types: Sequence[type],
    presets: Mapping[str, Preset],
    argv: Sequence[str],
    check: Callable[..., None] | None = None,
    prog: str | None = None,
) -> tuple[Any, ...]:
    """The script's argument dataclasses with ``--preset``'s values as defaults, checked before any work.

    ``check(*parsed, given)`` refuses what the script cannot do (``given``: the flags written on the command line);
    every script also gets the checks of :func:`ni_hf.training.run_setup.check_training_arguments`. A refused
    command line exits with status 2 and a message that names the flag, as argparse does.
    """
    with exit_on_bad_arguments(prog):
        parser = HfArgumentParser(tuple(dataclass_types))
        given = explicit_arguments(parser, argv)
        parsed = parse_with_presets(parser, presets, argv)
        for arguments in parsed:
            if isinstance(arguments, TrainingArguments):
                check_training_arguments(arguments)
        if check is not None:
            check(*parsed, given)
    return parsed


@dataclass
class ExampleRun:
    """One run of an example script from its start to its push (see the module docstring for the steps)."""

    script: str
    argv: list[str]
    args: TrainingArguments
    push_to_hub: bool = False
    can_draw: bool = field(default_factory=lambda: importlib.util.find_spec("matplotlib") is not None)

    @classmethod
    @contextmanager
    def start(
        cls, script: str, argv: Sequence[str], args: TrainingArguments, *loggers: logging.Logger
    ) -> Iterator[ExampleRun]:
        """Log to stdout, seed, hold the output folder's lock; the Hub upload waits for :meth:`finish`."""
        # Trainer would push its own generic card at every save; the run uploads once, at the end, with its own.
        run = cls(script=str(script), argv=list(argv), args=args, push_to_hub=args.push_to_hub)
        args.push_to_hub = False
        setup_logging(args, *loggers, logging.getLogger(Path(script).stem), transformers_info=True)
        logger.warning(
            f"Process {args.process_index} of world size {args.world_size}: device {args.device}, "
            f"distributed {args.parallel_mode.value}"
        )
        publishing.warn_if_fewer_processes(args.world_size, script)
        if not run.can_draw:
            logger.warning(
                "matplotlib is not installed: the model card will have no routing picture "
                "(pip install 'ni_hf[vis]' for it)"
            )
        set_seed(args.seed)
        with checkpoints.output_dir_lock(args.output_dir, enabled=args.should_save):
            yield run

    @property
    def is_main_process(self) -> bool:
        return self.args.process_index == 0

    def model(
        self,
        model_class: type[PreTrainedModel],
        *,
        config: Any = None,
        path: str | None = None,
        allow_mismatched_weights: bool = False,
        attn_implementation: str | None = None,
        **kwargs: Any,
    ) -> PreTrainedModel:
        """A new model of ``config``, or the saved one at ``path`` (refused if its weights do not fit it)."""
        if attn_implementation:
            kwargs["attn_implementation"] = attn_implementation
        if path is not None:
            if config is not None:  # else load_checked reads the saved config and refuses another model's
                kwargs["config"] = config
            model = checkpoints.load_checked(
                model_class, path, allow_mismatched_weights=allow_mismatched_weights, **kwargs
            )
        else:
            model = model_class._from_config(config, **kwargs)
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        logger.info(
            f"{type(model).__name__}: {sum(p.numel() for p in model.parameters()):,} parameters "
            f"({trainable:,} trainable)" + (f", loaded from {path}" if path else "")
        )
        return model

    def optimizer(
        self, args: TrainingArguments | None = None
    ) -> tuple[type[torch.optim.Optimizer], dict[str, Any]] | None:
        """torch's RAdam (the paper's optimizer) with the learning rate, betas and epsilon of ``args`` (a phase's;
        default the run's) when ``--radam``, else None (Trainer's ``--optim``)."""
        args = self.args if args is None else args
        if not getattr(args, "radam", False):
            return None
        betas = (args.adam_beta1, args.adam_beta2)
        return torch.optim.RAdam, {"lr": args.learning_rate, "betas": betas, "eps": args.adam_epsilon}

    def resume_checkpoint(self, output_dir: str | None = None) -> str | None:
        """The checkpoint ``--resume_from_checkpoint`` names ("last": the newest complete one), or None; a damaged
        checkpoint, or one of a run that has finished, is refused."""
        args = self.args
        return checkpoints.resolve_resume_checkpoint(
            args.resume_from_checkpoint if args.do_train else None, output_dir or args.output_dir, args
        )

    def train(self, trainer: Trainer, resume: str | bool | None = None, **record: Any) -> dict[str, Any]:
        """Train (from ``resume``, default :meth:`resume_checkpoint`), save the model and its weights' checksum to
        the Trainer's output folder, and return the training metrics (``record`` added); with
        ``checkpoints.ExactResumeMixin`` in the Trainer's bases, a finished run is not resumed and ``train_loss`` is
        the mean over the whole run's steps."""
        # None: where --resume_from_checkpoint points in the Trainer's folder; False: from scratch.
        resume = self.resume_checkpoint(trainer.args.output_dir) if resume is None else resume
        if resume:
            logger.info(f"Resuming from {resume}")
        output = trainer.train(resume_from_checkpoint=resume or None)  # (False and "" start afresh)
        trainer.save_model()  # weights, config (auto_map), model code, processor
        if (
            trainer.args.should_save
        ):  # (a Trainer with checkpoints.WeightsChecksumMixin has written it already)
            checkpoints.write_weights_checksum(trainer.args.output_dir)
        metrics = {
            **output.metrics,
            "global_step": trainer.state.global_step,
            "world_size": trainer.args.world_size,
            **record,
        }
        trainer.log_metrics("train", metrics)
        trainer.save_metrics("train", metrics)
        trainer.save_state()
        return metrics

    def evaluate(self, trainer: Trainer, dataset: Any = None, prefix: str = "eval", **record: Any) -> dict:
        """Evaluate (the Trainer's eval set, or ``dataset``), log and save the metrics under ``prefix``."""
        metrics = {**trainer.evaluate(dataset, metric_key_prefix=prefix), **record}
        trainer.log_metrics(prefix, metrics)
        trainer.save_metrics(prefix, metrics)
        return metrics

    def command(self) -> tuple[str, str]:
        """The command that reproduces this run, and a note on how it was launched (processes, launcher)."""
        return publishing.reconstruct_command(self.script, self.argv, self.args.world_size)

    def append_routing_picture(self, card: Path, write_assets: Callable[[], Mapping[str, Any]]) -> None:
        """Append the routing picture and table that ``write_assets()`` writes (``ni_hf.visualization``'s card
        assets) to the model card; without matplotlib the card says nothing of them, as the start of the run said."""
        if not self.can_draw:
            return
        assets = write_assets()
        with card.open("a") as handle:
            handle.write("\n" + assets["markdown"].rstrip() + "\n")
        logger.info(f"Routing picture added to the model card: {', '.join(map(str, assets['files']))}")

    def finish(self, trainer: Trainer | None, commit_message: str, folder: str | None = None) -> None:
        """Wait for every process, then upload the run's folder (``--push_to_hub``) from the main process."""
        if trainer is not None:
            trainer.accelerator.wait_for_everyone()
        try:
            if self.push_to_hub and self.is_main_process:
                publishing.push_run(folder or self.args.output_dir, self.args, commit_message=commit_message)
        finally:
            if trainer is not None:
                trainer.end()


def refuse_unused(given: set[str] | frozenset[str], names: Sequence[str], reason: str) -> None:
    """Refuse flags written on the command line that the run would not read: "--a, --b: <reason>"."""
    unused = [f"--{name}" for name in names if name in given]
    if unused:
        raise ValueError(f"{', '.join(unused)}: {reason}.")


def argv_of(argv: Sequence[str] | None) -> list[str]:
    """The command line's arguments (``sys.argv[1:]`` when None)."""
    return list(sys.argv[1:] if argv is None else argv)
