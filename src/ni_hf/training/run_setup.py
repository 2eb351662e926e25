"""What every example script does around its work: the exit on arguments that cannot be meant, range checks that
name the flag, the memory a run needs against what the machine has, the global batch over the processes, the
logging set-up, and the environment the results record."""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import math
import os
import platform
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import TrainingArguments

from .data_transfer import PIN_MEMORY_HELP, apply_gpu_loading_defaults

__all__ = [
    "ExampleTrainingArguments",
    "check_at_least",
    "check_fields_left_alone",
    "check_memory",
    "check_positive",
    "check_training_arguments",
    "environment",
    "exit_on_bad_arguments",
    "format_bytes",
    "per_device_batch_size",
    "setup_logging",
    "summarize_runs",
    "total_memory",
    "write_results",
]

logger = logging.getLogger(__name__)


@dataclass
class ExampleTrainingArguments(TrainingArguments):
    """TrainingArguments with the example scripts' shared defaults: a NaN loss logged as NaN, the datasets' own
    batches kept whole, and batches fed to a GPU from pinned memory (``data_transfer.apply_gpu_loading_defaults``)."""

    # A NaN loss must show in the log, not be averaged away (transformers' default filters it, and the check, a
    # device-to-host sync at every step, stalls a GPU).
    logging_nan_inf_filter: bool = field(
        default=False, metadata={"help": "Replace a NaN/inf loss in the log."}
    )
    remove_unused_columns: bool = field(
        default=False,
        metadata={
            "help": "Must stay false: the scripts' datasets build their batches (whole batches, transforms)."
        },
    )
    dataloader_pin_memory: bool = field(default=torch.cuda.is_available(), metadata={"help": PIN_MEMORY_HELP})
    do_train: bool = field(
        default=True, metadata={"help": "Train (--do_train false: evaluate a saved model)."}
    )
    do_eval: bool = field(default=True, metadata={"help": "Evaluate after training."})
    radam: bool = field(
        default=True,
        metadata={"help": "Optimize with torch.optim.RAdam (the paper's); --radam false uses --optim."},
    )
    max_train_minutes: float | None = field(
        default=None, metadata={"help": "Stop training once this many minutes have passed (a guard)."}
    )

    def __post_init__(self) -> None:
        apply_gpu_loading_defaults(
            self
        )  # before transformers turns accelerator_config into an AcceleratorConfig
        super().__post_init__()


@contextmanager
def exit_on_bad_arguments(prog: str | None = None) -> Iterator[None]:
    """Turn a ``ValueError`` raised inside into argparse's exit for a bad argument: its message on stderr, status 2."""
    try:
        yield
    except ValueError as error:
        print(f"{prog or Path(sys.argv[0]).name}: error: {error}", file=sys.stderr)
        raise SystemExit(2) from error


def check_at_least(option: str, values: int | Sequence[int] | None, minimum: int) -> None:
    """Refuse an integer (or any integer of a list) below ``minimum``, naming ``option``; None passes."""
    if values is None:
        return
    listed = values if isinstance(values, Sequence) else [values]
    if isinstance(values, Sequence) and not listed:
        raise ValueError(f"{option} is empty; expected at least one value.")
    bad = [value for value in listed if value < minimum]
    if bad:
        shown = " ".join(map(str, bad))
        raise ValueError(f"{option} must be at least {minimum}, got {shown}.")


def check_positive(option: str, value: float | None) -> None:
    """Refuse a number that is not finite and positive (zero, negative, NaN, inf), naming ``option``; None passes."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise ValueError(f"{option} must be a positive number, got {value}.")


def check_fields_left_alone(args: Any, fields: Mapping[str, str], reason: str) -> None:
    """Refuse a field of ``args`` (a dataclass) that the script sets itself when given other than its default:
    ``fields`` maps each name to what to use instead; the error says "--<name> <value>: <reason>; use <that>"."""
    defaults = {f.name: f.default for f in dataclasses.fields(args)}
    for name, replacement in fields.items():
        value, default = getattr(args, name), defaults[name]
        if getattr(value, "value", value) != getattr(default, "value", default):
            raise ValueError(f"--{name} {getattr(value, 'value', value)}: {reason}; use {replacement}.")


def check_training_arguments(args: Any) -> None:
    """Refuse the TrainingArguments values that transformers accepts but that fail (or do nothing) later."""
    check_steps_and_strategies(args)
    for name in ("seed", "data_seed"):
        value = getattr(args, name)
        if value is not None and not 0 <= value < 2**32:
            raise ValueError(f"--{name} must be between 0 and 2**32 - 1 (a numpy seed), got {value}.")
    for name in ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps"):
        check_at_least(f"--{name}", getattr(args, name), 1)
    for name in ("dataloader_num_workers", "warmup_steps"):
        check_at_least(f"--{name}", getattr(args, name), 0)
    check_at_least("--save_total_limit", args.save_total_limit, 1)
    for name, strategy in (
        ("logging_steps", "logging_strategy"),
        ("save_steps", "save_strategy"),
        ("eval_steps", "eval_strategy"),
    ):
        value = getattr(args, name)
        if (
            getattr(getattr(args, strategy), "value", getattr(args, strategy)) == "steps"
            and value is not None
        ):
            check_positive(f"--{name}", value)
    check_positive("--learning_rate", args.learning_rate)
    check_positive("--adam_epsilon", args.adam_epsilon)
    for name in ("adam_beta1", "adam_beta2"):
        if not 0 <= getattr(args, name) < 1:
            raise ValueError(f"--{name} must lie in [0, 1), got {getattr(args, name)}.")
    for name in ("weight_decay", "max_grad_norm"):
        value = getattr(args, name)
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"--{name} must be a finite number >= 0, got {value}.")
    if args.torch_compile:
        from torch import _dynamo

        if args.torch_compile_backend not in _dynamo.list_backends(exclude_tags=()):
            raise ValueError(
                f"--torch_compile_backend {args.torch_compile_backend!r} is not a backend of torch.compile; "
                f"expected one of {_dynamo.list_backends()}."
            )


def check_steps_and_strategies(args: Any) -> None:
    """Refuse a training run without a step, and options that would be accepted without effect."""
    if getattr(args, "do_train", False) and (
        args.max_steps == 0 or (args.max_steps < 0 and not args.num_train_epochs > 0)
    ):
        what = "--max_steps 0" if args.max_steps == 0 else f"--num_train_epochs {args.num_train_epochs:g}"
        raise ValueError(f"{what}: no training step would run; pass a positive number (or --do_train false).")
    if args.max_steps < -1:
        raise ValueError(
            f"--max_steps {args.max_steps}: must be positive, or -1 to train for --num_train_epochs."
        )
    eval_strategy = getattr(args.eval_strategy, "value", args.eval_strategy)
    if args.load_best_model_at_end and eval_strategy == "no":
        raise ValueError(
            "--load_best_model_at_end true with --eval_strategy no: no evaluation would pick a best model; "
            "pass --eval_strategy epoch (or steps) and a matching --save_strategy."
        )
    optim = str(getattr(args.optim, "value", args.optim))
    default_optim = TrainingArguments.__dataclass_fields__["optim"].default
    if getattr(args, "radam", False) and optim != str(getattr(default_optim, "value", default_optim)):
        raise ValueError(
            f"--optim {optim} with --radam true: RAdam would be used; pass --radam false to use --optim."
        )


def format_bytes(num_bytes: float) -> str:
    """``num_bytes`` in GiB, one decimal."""
    return f"{num_bytes / 2**30:,.1f} GiB"


def total_memory(device: torch.device | str) -> int:
    """Memory of ``device`` in bytes: a GPU's own, or the machine's physical memory for the CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    import psutil  # an accelerate dependency

    return psutil.virtual_memory().total


def check_memory(needed: int, device: torch.device | str, flags: str, holds: str) -> None:
    """Refuse a run whose lower bound of ``needed`` bytes exceeds ``device``'s memory: "<flags> need at least
    <needed> <holds>; <device> has <memory>." (e.g. flags "--batch_size 32 with --num_adapt_functions 10", holds
    "for one batch")."""
    device = torch.device(device)
    available = total_memory(device)
    if needed > available:
        raise ValueError(
            f"{flags} need at least {format_bytes(needed)} {holds}; {device.type} has {format_bytes(available)}."
        )


def per_device_batch_size(batch_size: int, world_size: int, option: str = "--batch_size") -> int:
    """Each process's share of the global batch ``batch_size``; a share that is not whole is refused."""
    if batch_size < 1:
        raise ValueError(f"{option} must be at least 1, got {batch_size}.")
    if batch_size % world_size:
        raise ValueError(
            f"{option} {batch_size} is the global batch; it must be divisible by the number of processes "
            f"({world_size}) so that each takes an equal share."
        )
    return batch_size // world_size


def setup_logging(args: Any, *loggers: logging.Logger, transformers_info: bool = False) -> None:
    """Log to stdout as transformers' examples do: ``loggers`` (the script's) and ni_hf's at INFO on the main
    process and WARNING on the others (or at ``--log_level``/``--log_level_replica`` when given); transformers and
    datasets at their own level, INFO on the main process with ``transformers_info``."""
    import datasets
    import transformers
    from transformers.training_args import trainer_log_levels

    logging.basicConfig(
        format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
        datefmt="%m/%d/%Y %H:%M:%S",
        handlers=[logging.StreamHandler(sys.stdout)],
    )
    if transformers_info and args.should_log:
        transformers.utils.logging.set_verbosity_info()
    library_level = args.get_process_log_level()
    chosen = trainer_log_levels[args.log_level if args.should_log else args.log_level_replica]
    level = chosen if chosen != -1 else logging.INFO if args.should_log else logging.WARNING
    for module_logger in (logging.getLogger("ni_hf"), *loggers):
        module_logger.setLevel(level)
    datasets.utils.logging.set_verbosity(library_level)
    transformers.utils.logging.set_verbosity(library_level)
    transformers.utils.logging.enable_default_handler()
    transformers.utils.logging.enable_explicit_format()


def environment(args: Any) -> dict[str, Any]:
    """Where and with what a run ran, for its results: date (UTC), machine, device, processes, precision, versions."""
    import transformers

    from .. import __version__
    from .model_cards import mixed_precision

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            cpu = next(
                (line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), cpu
            )
    except OSError:
        pass
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": str(args.device),
        "world_size": args.world_size,
        "mixed_precision": mixed_precision(args),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "ni_hf": __version__,
    }


def summarize_runs(values: Sequence[float]) -> dict[str, Any]:
    """The values of several runs (seeds, draws) with their mean, population std and count."""
    return {
        "values": list(values),
        "mean": float(np.mean(values)),
        "std": float(np.std(values)),
        "runs": len(values),
    }


def write_results(
    output_dir: str | os.PathLike, name: str, results: Mapping[str, Any], markdown: str
) -> None:
    """Write a run's ``results`` to ``<output_dir>/<name>.json`` and its tables to ``<name>.md``, print the
    tables and log where they went."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    paths = output_dir / f"{name}.json", output_dir / f"{name}.md"
    paths[0].write_text(json.dumps(results, indent=2) + "\n")
    paths[1].write_text(markdown)
    print(markdown)
    logger.info(f"Results written to {paths[0]} and {paths[1]}")
