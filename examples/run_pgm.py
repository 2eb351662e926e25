#!/usr/bin/env python
"""Train a multiple-choice Neural Interpreter (or the paper's ViT baseline) on PGM abstract reasoning (section 4.3).

    python examples/run_pgm.py --preset cpu --output_dir runs/pgm-cpu          # offline: generated puzzles, minutes
    python examples/run_pgm.py --preset cpu --regime attr.rels --architecture vit --output_dir runs/pgm-vit
    accelerate launch examples/run_pgm.py --preset paper --dataset_source hub --output_dir runs/pgm-neutral

Each puzzle is 8 context panels of an incomplete 3x3 matrix and 8 candidates; the model scores each candidate from
the set (CLS token, context panels, candidate) and a softmax over the 8 scores is its answer. Data
(``--dataset_source``): ``generated`` (default: the package's offline PGM-style generator, any regime),
``deepmind`` (DeepMind's release under ``--data_dir``: a folder of ``PGM_<regime>_<split>_<id>.npz`` or the regime's
``.tar.gz``) or ``hub`` (``HuggingFaceM4/PGM``, the neutral regime). Presets (``--preset``): ``paper`` (the paper's
per-regime model and recipe: batch 72, 30 epochs, RAdam 4e-4 with cosine decay to 1e-4), ``cpu`` (a small model on
generated puzzles of 1 to 4 triples that fits 2 CPU cores) and ``quick`` (a smoke test). Reports in-distribution (val) and
out-of-distribution (test) accuracy, accuracy per relation type, and for a Neural Interpreter the anytime curve
(accuracy against function iterations); writes ``pgm_results.json`` and a model card; ``--push_to_hub`` uploads.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import PretrainedConfig, Trainer

from ni_hf import (
    ContextBlindConfig,
    ContextBlindForMultipleChoice,
    MultiTaskViTConfig,
    MultiTaskViTForMultipleChoice,
    NeuralInterpreterConfig,
    NeuralInterpreterForMultipleChoice,
    NeuralInterpreterPanelProcessor,
)
from ni_hf.data.pgm import (
    META_TARGET_NAMES,
    PGM_SOURCES,
    RELATION_TYPES,
    check_pgm_source,
    first_puzzles,
    load_pgm,
    pgm_num_rows,
    skipped_files,
)
from ni_hf.data.pgm_generator import REGIMES
from ni_hf.models.neural_interpreter.configuration_neural_interpreter import PGM_REGIMES
from ni_hf.training.callbacks import time_limit_callbacks
from ni_hf.training.checkpoints import ExactResumeMixin
from ni_hf.training.model_cards import write_pgm_model_card
from ni_hf.training.presets import PGM_PRESETS, parse_config_overrides, preset_field
from ni_hf.training.publishing import hub_repo_id
from ni_hf.training.run_flow import ExampleRun, argv_of, refuse_unused
from ni_hf.training.run_flow import parse_arguments as parse_script_arguments
from ni_hf.training.run_setup import ExampleTrainingArguments, check_at_least, environment

logger = logging.getLogger(__name__)

ARCHITECTURES = {
    "neural_interpreter": (NeuralInterpreterConfig, NeuralInterpreterForMultipleChoice),
    "vit": (MultiTaskViTConfig, MultiTaskViTForMultipleChoice),
    # The sanity row of the RAVEN literature: the same panel CNN and scorer, seeing the candidates only.
    "candidates_only": (ContextBlindConfig, ContextBlindForMultipleChoice),
}
# Image settings of the configs, which a PGM model (panels through its panel CNN) never reads.
UNREAD_CONFIG_KEYS = ("image_size", "patch_size", "num_channels")
SPLITS = {"val": "in distribution", "test": "out of distribution"}
SKIP_LOG = "pgm_skipped.tsv"  # the files (rows) --skip_bad_files left out, one a line
OTHER_CONTEXT_PUZZLES = 2000  # test puzzles evaluated with another puzzle's context
# Generated training puzzles are prepared once in memory up to this size, else generated anew in every epoch.
PREPARED_BYTES = 2 << 30


@dataclass
class ModelArguments:
    """Which model to train (or, with --model_name_or_path, to evaluate)."""

    preset: str | None = preset_field(PGM_PRESETS, default="paper")
    architecture: str = field(
        default="neural_interpreter",
        metadata={
            "help": "'neural_interpreter', 'vit' (the paper's ViT baseline on the same panel embeddings) or "
            "'candidates_only' (the same panel CNN and scorer seeing only the candidates: what a model reaches "
            "without reading the matrix).",
            "choices": list(ARCHITECTURES),
        },
    )
    model_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "Evaluate this saved model (an output_dir of this script or a Hub repo id); --do_train false."
        },
    )
    allow_mismatched_weights: bool = field(
        default=False,
        metadata={
            "help": "Load --model_name_or_path even if its weights do not fit the model (missing tensors random)."
        },
    )
    config_overrides: str | None = field(
        default=None,
        metadata={
            "help": "Config settings changed from the preset's, key=value pairs with JSON values, e.g. "
            "'truncation_tau=1.5,type_dim=24'; merged key by key with the preset's."
        },
    )
    attn_implementation: str | None = field(
        default=None,
        metadata={
            "help": "Neural Interpreter only: 'eager', 'sdpa' or 'fast' (the CPU kernels); default 'sdpa'."
        },
    )


@dataclass
class DataArguments:
    """Which puzzles to train and evaluate on."""

    dataset_source: str = field(
        default="generated",
        metadata={
            "help": "'generated' (offline PGM-style generator), 'deepmind' (--data_dir) or 'hub' (HuggingFaceM4/PGM, "
            "neutral).",
            "choices": list(PGM_SOURCES),
        },
    )
    regime: str = field(
        default="neutral",
        metadata={"help": "Generalisation regime (DeepMind's names).", "choices": list(REGIMES)},
    )
    data_dir: str | None = field(
        default=None,
        metadata={
            "help": "deepmind: a folder of .npz files or the regime's .tar.gz; hub: a repo id or a Parquet folder."
        },
    )
    num_train_puzzles: int | None = field(
        default=None,
        metadata={"help": "Training puzzles (generated: how many; files: at most; default all)."},
    )
    num_eval_puzzles: int | None = field(
        default=None,
        metadata={"help": "Puzzles of each of val and test (generated: how many; files: at most)."},
    )
    max_triples: int = field(
        default=4,
        metadata={"help": "generated: at most this many (object, attribute, relation) triples per puzzle."},
    )
    free_attributes: str = field(
        default="constant",
        metadata={
            "help": "generated: the attributes in no triple, 'constant' (held fixed in a puzzle) or 'random' "
            "(drawn for every object, Barrett et al.'s distractors).",
            "choices": ["constant", "random"],
        },
    )
    skip_bad_files: bool = field(
        default=False,
        metadata={
            "help": "deepmind, hub: leave out files (rows) that cannot be read, counted in the results and listed in "
            "<output_dir>/pgm_skipped.tsv, instead of stopping at the first."
        },
    )
    check_every_file: bool = field(
        default=True,
        metadata={
            "help": "deepmind folders: check every file's headers before training (about 2 ms a file), not only a "
            "sample read in full."
        },
    )
    generator_seed: int = field(
        default=0, metadata={"help": "generated: the seed of the puzzles (train, val, test)."}
    )


@dataclass
class PGMTrainingArguments(ExampleTrainingArguments):
    """TrainingArguments with the paper's PGM recipe as defaults."""

    learning_rate: float = field(default=4e-4, metadata={"help": "Peak learning rate (paper: 4e-4)."})
    lr_scheduler_type: str = field(
        default="cosine_with_min_lr", metadata={"help": "Schedule (paper: cosine)."}
    )
    lr_scheduler_kwargs: dict | str | None = field(
        default_factory=lambda: {"min_lr": 1e-4}, metadata={"help": "Cosine decay to 1e-4 (the paper's)."}
    )
    per_device_train_batch_size: int = field(default=72, metadata={"help": "Puzzles per batch (paper: 72)."})
    per_device_eval_batch_size: int = field(default=72, metadata={"help": "Puzzles per evaluation batch."})
    num_train_epochs: float = field(default=30.0, metadata={"help": "Epochs (paper: 30)."})
    eval_strategy: str = field(
        default="epoch", metadata={"help": "Evaluate on val during training: 'epoch' or 'no'."}
    )
    save_strategy: str = field(
        default="epoch", metadata={"help": "Checkpoint each epoch ('no': only at the end)."}
    )
    logging_steps: float = field(
        default=50, metadata={"help": "Log the training loss every this many steps."}
    )
    anytime: bool = field(
        default=True,
        metadata={"help": "Neural Interpreter: also evaluate with 1..all function iterations per script."},
    )


def parse_arguments(argv: list[str]) -> tuple[ModelArguments, DataArguments, PGMTrainingArguments]:
    """The command line, with ``--preset``'s values as defaults (an explicit flag wins), checked before any work."""
    return parse_script_arguments(
        (ModelArguments, DataArguments, PGMTrainingArguments), PGM_PRESETS, argv, check=check_arguments
    )


def check_arguments(
    model_args: ModelArguments,
    data_args: DataArguments,
    args: PGMTrainingArguments,
    given: frozenset[str] = frozenset(),
) -> None:
    """Refuse, naming the flag, what would fail or be ignored later, before any data or model is built."""
    check_data_arguments(data_args, given)
    if model_args.model_name_or_path is None and not args.do_train:
        raise ValueError("--do_train false evaluates a saved model: pass --model_name_or_path.")
    if model_args.attn_implementation and model_args.architecture != "neural_interpreter":
        raise ValueError(
            "--attn_implementation is the Neural Interpreter's; the ViT baseline runs transformers' own."
        )
    if args.dataloader_persistent_workers and args.dataloader_num_workers > 0:
        raise ValueError(
            "--dataloader_persistent_workers true: Trainer keeps its first evaluation DataLoader, so test and every "
            "step of the anytime curve would evaluate the val puzzles; leave it off."
        )
    config_class = ARCHITECTURES[model_args.architecture][0]
    overrides = parse_config_overrides(model_args.config_overrides, config_class)
    unread = [key for key in UNREAD_CONFIG_KEYS if key in overrides]
    if unread:
        raise ValueError(
            f"--config_overrides {', '.join(unread)}: a PGM model reads panels through its panel CNN "
            "(panel_size, panel_cnn_*), not image patches."
        )
    if model_args.model_name_or_path is not None and "config_overrides" in given:
        raise ValueError(
            "--config_overrides: settings of a new model; a saved model's config is used as saved."
        )


def check_data_arguments(data_args: DataArguments, given: frozenset[str]) -> None:
    """The puzzles' flags: counts, the source's regimes and folder, and no flag of another source."""
    for option, value in (
        ("--num_train_puzzles", data_args.num_train_puzzles),
        ("--num_eval_puzzles", data_args.num_eval_puzzles),
    ):
        check_at_least(option, value, 1)
    if not 1 <= data_args.max_triples <= 4:
        raise ValueError(
            f"--max_triples must lie in 1..4 (PGM puzzles hold one to four triples), got {data_args.max_triples}."
        )
    if data_args.regime not in PGM_REGIMES:
        raise ValueError(f"--regime {data_args.regime}: expected one of {sorted(PGM_REGIMES)}.")
    if data_args.dataset_source == "hub" and data_args.regime != "neutral":
        raise ValueError(
            f"--regime {data_args.regime} with --dataset_source hub: the Hub holds the neutral regime only; use "
            "--dataset_source deepmind --data_dir <its archive> or --dataset_source generated."
        )
    if data_args.dataset_source == "deepmind" and not data_args.data_dir:
        raise ValueError(
            "--dataset_source deepmind needs --data_dir (a folder of .npz files or the regime's .tar.gz)."
        )
    if data_args.dataset_source == "generated":
        refuse_unused(
            given,
            ["skip_bad_files", "check_every_file"],
            "they apply to files (--dataset_source deepmind, hub)",
        )
    else:
        source = f"--dataset_source {data_args.dataset_source}"
        refuse_unused(
            given, ["max_triples", "free_attributes", "generator_seed"], f"the generator's, not {source}'s"
        )


def build_config(model_args: ModelArguments, regime: str) -> PretrainedConfig:
    """The preset's config for the architecture (the paper's regime selection for a Neural Interpreter), overridden."""
    config_class = ARCHITECTURES[model_args.architecture][0]
    settings = parse_config_overrides(model_args.config_overrides, config_class)
    if model_args.architecture == "vit":
        return MultiTaskViTConfig.from_paper("pgm", **settings)
    if model_args.architecture == "candidates_only":  # the panel CNN and width of the paper's PGM model
        return ContextBlindConfig.from_panel_config(
            NeuralInterpreterConfig.from_paper("pgm", regime=regime), **settings
        )
    return NeuralInterpreterConfig.from_paper("pgm", regime=regime, **settings)


@dataclass
class PGMCollator:
    """Puzzles in the package's schema -> normalised panels, the correct candidates, and the relation types (kept
    for the metrics); puzzles prepared by `prepare_puzzles` are only stacked. A class at module level, so that
    DataLoader workers started by spawn can unpickle it."""

    processor: NeuralInterpreterPanelProcessor

    def __call__(self, puzzles: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        if "pixel_values" in puzzles[0]:
            pixel_values = torch.stack([puzzle["pixel_values"] for puzzle in puzzles])
        else:
            pixel_values = self.processor([puzzle["panels"] for puzzle in puzzles], return_tensors="pt")[
                "pixel_values"
            ]
        return {
            "pixel_values": pixel_values,
            "labels": torch.tensor([int(puzzle["target"]) for puzzle in puzzles]),
            "meta_target": torch.from_numpy(np.stack([np.asarray(p["meta_target"]) for p in puzzles])).long(),
        }


def prepare_puzzles(
    dataset: Any, processor: NeuralInterpreterPanelProcessor, what: str
) -> list[dict[str, Any]]:
    """Every puzzle generated and through the processor once, kept in memory: generated puzzles are the same in
    every epoch and evaluation, so neither is redone."""
    puzzles = []
    for start in tqdm(range(0, len(dataset), 256), desc=f"Preparing the {what} puzzles", unit="batch"):
        batch = [dataset[i] for i in range(start, min(start + 256, len(dataset)))]
        pixel_values = processor([puzzle["panels"] for puzzle in batch], return_tensors="pt")["pixel_values"]
        puzzles += [
            {"pixel_values": pixels, "target": puzzle["target"], "meta_target": puzzle["meta_target"]}
            for pixels, puzzle in zip(pixel_values, batch, strict=True)
        ]
    return puzzles


class PGMTrainer(ExactResumeMixin, Trainer):
    """Trainer whose batches carry each puzzle's relation types (`meta_target`) to compute_metrics, not to the model."""

    def compute_loss(
        self, model: torch.nn.Module, inputs: dict[str, Any], return_outputs: bool = False, **kwargs: Any
    ):
        model_inputs = {key: value for key, value in inputs.items() if key != "meta_target"}
        return super().compute_loss(model, model_inputs, return_outputs=return_outputs, **kwargs)


def compute_metrics(eval_pred: Any) -> dict[str, float]:
    """Accuracy, and the accuracy on the puzzles that hold each relation type (how many, beside it)."""
    logits, (labels, meta_target) = eval_pred.predictions, eval_pred.label_ids
    correct = np.asarray(logits).argmax(-1) == np.asarray(labels)
    metrics = {"accuracy": float(correct.mean()), "num_samples": int(correct.size)}
    meta_target = np.asarray(meta_target).astype(bool)
    for offset, name in enumerate(RELATION_TYPES, start=len(META_TARGET_NAMES) - len(RELATION_TYPES)):
        holds = meta_target[:, offset]
        metrics[f"accuracy_{name}"] = float(correct[holds].mean()) if holds.any() else math.nan
        metrics[f"num_samples_{name}"] = int(holds.sum())
    return metrics


def load_split(
    data_args: DataArguments, split: str, panel_size: int, count: int | None, seed: int, output_dir: str
) -> Any:
    """One split in the package's PGM schema, from the chosen source; files are checked before any training."""
    if data_args.dataset_source == "generated":
        options = {"max_triples": data_args.max_triples, "free_attributes": data_args.free_attributes}
    else:
        options = {"skip_bad_files": data_args.skip_bad_files, "skip_log": str(Path(output_dir) / SKIP_LOG)}
    dataset = load_pgm(
        data_args.dataset_source,
        split=split,
        regime=data_args.regime,
        data_dir=data_args.data_dir,
        max_samples=count,
        seed=seed,
        panel_size=panel_size,
        **options,
    )
    if data_args.dataset_source != "generated":
        report = check_pgm_source(dataset, every_file=data_args.check_every_file)
        logger.info(f"Checked the {split} puzzles before training: {report.to_dict()}")
    return dataset


def evaluate_splits(trainer: Trainer, datasets: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Val (in distribution) and test (out of distribution) metrics, logged."""
    results = {}
    for split, dataset in datasets.items():
        metrics = trainer.evaluate(dataset, metric_key_prefix=split)
        results[split] = {key.removeprefix(f"{split}_"): value for key, value in metrics.items()}
        per_relation = ", ".join(
            f"{name} {100 * results[split][f'accuracy_{name}']:.1f}% ({results[split][f'num_samples_{name}']})"
            for name in RELATION_TYPES
            if results[split][f"num_samples_{name}"]
        )
        logger.info(
            f"{split} ({SPLITS[split]}): accuracy {100 * results[split]['accuracy']:.2f}% of "
            f"{results[split]['num_samples']} puzzles; by relation type: {per_relation}"
        )
    return results


def with_other_context(puzzles: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each puzzle with the 8 context panels of the next one (the last takes the first's): its own candidates and
    answer, a context that says nothing of them. A model that reads the matrix must fall to chance (12.5%)."""
    key = "pixel_values" if "pixel_values" in puzzles[0] else "panels"
    shuffled = []
    for i, puzzle in enumerate(puzzles):
        other = puzzles[(i + 1) % len(puzzles)][key]
        own = puzzle[key]
        panels = (
            torch.cat([other[:8], own[8:]]) if torch.is_tensor(own) else np.concatenate([other[:8], own[8:]])
        )
        shuffled.append({**puzzle, key: panels})
    return shuffled


def evaluate_other_context(trainer: Trainer, test: Any) -> dict[str, float]:
    """Test accuracy with every puzzle's context panels taken from another puzzle (at most OTHER_CONTEXT_PUZZLES)."""
    puzzles = first_puzzles(test, OTHER_CONTEXT_PUZZLES)
    metrics = trainer.evaluate(with_other_context(puzzles), metric_key_prefix="other_context")
    result = {key.removeprefix("other_context_"): value for key, value in metrics.items()}
    logger.info(
        f"test with the context panels of another puzzle: accuracy {100 * result['accuracy']:.2f}% of "
        f"{result['num_samples']} puzzles (chance 12.5%)"
    )
    return result


def anytime_curve(trainer: Trainer, model: torch.nn.Module, datasets: dict[str, Any]) -> list[dict[str, Any]]:
    """Accuracy with k = 1..trained function iterations per script (the paper's Figure 6): anytime inference."""
    config = model.config
    trained, per_script = config.num_function_iterations, config.iterations_per_script
    rows = []
    try:
        for k in range(1, max(per_script) + 1):
            config.num_function_iterations = [min(k, n) for n in per_script]  # read by every forward
            row = {"function_iterations": k}
            for split, dataset in datasets.items():
                row[f"{split}_accuracy"] = trainer.evaluate(dataset, metric_key_prefix=f"{split}_k{k}")[
                    f"{split}_k{k}_accuracy"
                ]
            rows.append(row)
            logger.info("Anytime: %s", ", ".join(f"{key} {value:.4g}" for key, value in row.items()))
    finally:
        config.num_function_iterations = trained
    return rows


def routing_assets_writer(model: torch.nn.Module, dataset: Any, collator: PGMCollator, card: Path) -> Any:
    """What draws the card's routing picture: the computational path of a test puzzle and the function usage of a
    test batch (``ni_hf.visualization.write_pgm_routing_card_assets``)."""

    def write() -> dict[str, Any]:
        from ni_hf.visualization import write_pgm_routing_card_assets

        batch = collator(first_puzzles(dataset, 64))
        return write_pgm_routing_card_assets(
            model,
            batch["pixel_values"].to(model.device),
            batch["labels"],
            card.parent,
            meta_targets=batch["meta_target"],
        )

    return write


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Train and evaluate; return the results (also in <output_dir>/pgm_results.json)."""
    argv = argv_of(argv)
    model_args, data_args, args = parse_arguments(argv)
    with ExampleRun.start(__file__, argv, args, logger) as run:
        return train_and_evaluate(run, model_args, data_args, args)


def load_data(
    data_args: DataArguments, args: PGMTrainingArguments, config: PretrainedConfig, processor: Any
) -> tuple[Any, dict[str, Any], dict[str, int]]:
    """Train, val (in distribution) and test (out of distribution) puzzles; generated ones prepared once."""
    seed, out = data_args.generator_seed, args.output_dir
    if args.should_save:
        (Path(out) / SKIP_LOG).unlink(missing_ok=True)  # the skip log is appended to: this run's alone
    count = data_args.num_train_puzzles
    train = load_split(data_args, "train", config.panel_size, count, seed, out) if args.do_train else None
    evaluation = {
        split: load_split(data_args, split, config.panel_size, data_args.num_eval_puzzles, seed, out)
        for split in SPLITS
    }
    splits = {"train": train, **evaluation}
    sizes = {split: pgm_num_rows(data) for split, data in splits.items() if data is not None}
    logger.info(f"PGM {data_args.regime} from {data_args.dataset_source}: {sizes} puzzles")
    if (
        data_args.dataset_source == "generated"
    ):  # generated once, not again at every evaluation (anytime curve)
        panel_bytes = 4 * config.num_panels * config.panel_size**2  # float32 pixel values of one puzzle
        if train is not None and len(train) * panel_bytes < PREPARED_BYTES:
            train = prepare_puzzles(train, processor, "training")
        evaluation = {
            split: prepare_puzzles(dataset, processor, split) for split, dataset in evaluation.items()
        }
    return train, evaluation, sizes


def train_and_evaluate(
    run: ExampleRun, model_args: ModelArguments, data_args: DataArguments, args: PGMTrainingArguments
) -> dict[str, Any]:
    """Config, model, data, Trainer, train, evaluate, anytime curve, card, push."""
    callbacks = time_limit_callbacks(args.max_train_minutes)
    run.resume_checkpoint()  # a bad --resume_from_checkpoint is refused before the data
    path = model_args.model_name_or_path
    model = run.model(
        ARCHITECTURES[model_args.architecture][1],
        config=None if path else build_config(model_args, data_args.regime),
        path=path,
        allow_mismatched_weights=model_args.allow_mismatched_weights,
        attn_implementation=model_args.attn_implementation,
    )
    config = model.config
    logger.info(f"Panels {config.panel_size}x{config.panel_size}")
    processor = NeuralInterpreterPanelProcessor(
        size={"height": config.panel_size, "width": config.panel_size}
    )
    collator = PGMCollator(processor)
    train, evaluation, sizes = load_data(data_args, args, config, processor)
    args.label_names = ["labels", "meta_target"]
    trainer = PGMTrainer(
        model=model,
        args=args,
        train_dataset=train,
        eval_dataset=evaluation["val"],
        data_collator=collator,
        processing_class=processor,
        compute_metrics=compute_metrics,
        optimizer_cls_and_kwargs=run.optimizer(),
        callbacks=callbacks,
    )
    results: dict[str, Any] = {"train": run.train(trainer) if args.do_train else {}}
    results.update(evaluate_splits(trainer, evaluation))
    results["test_other_context"] = evaluate_other_context(trainer, evaluation["test"])
    results["skipped_files"] = {
        split: len(skipped_files(dataset))
        for split, dataset in {"train": train, **evaluation}.items()
        if dataset
    }
    if args.anytime and model_args.architecture == "neural_interpreter":
        results["anytime"] = anytime_curve(trainer, model, evaluation)
    if run.is_main_process:
        command, launcher_note = run.command()
        results.update(
            architecture=model_args.architecture,
            regime=data_args.regime,
            dataset_source=data_args.dataset_source,
            preset=model_args.preset,
            num_parameters=model.num_parameters(),
            sizes=sizes,
            max_triples=data_args.max_triples if data_args.dataset_source == "generated" else None,
            free_attributes=data_args.free_attributes if data_args.dataset_source == "generated" else None,
            command=command,
            environment=environment(args),
        )
        write_results_and_card(run, model, results, launcher_note, evaluation["test"], collator)
    run.finish(trainer, "Trained with examples/run_pgm.py")
    return results


def write_results_and_card(
    run: ExampleRun,
    model: torch.nn.Module,
    results: dict[str, Any],
    launcher_note: str,
    test: Any,
    collator: PGMCollator,
) -> None:
    """pgm_results.json, and for a trained model its card with a routing picture (a Neural Interpreter's)."""
    args = run.args
    Path(args.output_dir).mkdir(parents=True, exist_ok=True)
    (Path(args.output_dir) / "pgm_results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    logger.info(f"Results written to {args.output_dir}/pgm_results.json")
    if not args.do_train:
        return
    card = write_pgm_model_card(
        args.output_dir,
        results,
        model=model,
        training_args=args,
        repo_id=hub_repo_id(args),
        launcher_note=launcher_note,
    )
    logger.info(f"Model card written to {card}")
    if results["architecture"] == "neural_interpreter":
        run.append_routing_picture(card, routing_assets_writer(model, test, collator, card))


if __name__ == "__main__":
    main()
