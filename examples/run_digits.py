#!/usr/bin/env python
"""Train a Neural Interpreter (or the paper's multi-task ViT baseline) on digit datasets, one CLS token and head each.

    python examples/run_digits.py --preset quickstart --output_dir runs/quickstart     # offline, minutes on a CPU
    accelerate launch examples/run_digits.py --preset paper --output_dir runs/paper --push_to_hub --hub_model_id me/ni

Presets (``--preset``, ``ni_hf.training.presets.DIGITS_PRESETS``): ``paper``, the paper's digits recipe (MNIST,
MNIST-M and SVHN from the Hub, the ``digits`` config, RAdam, cosine decay from 8e-4 to 1e-6, batch 128, 100 epochs,
RandAugment n=2 m=9), and ``quickstart``, a 78k-parameter model on scikit-learn's bundled 8x8 digits for 30 epochs. A
flag given on the command line replaces the preset's value; ``--config_overrides`` changes its config key by key.
Data (``--dataset_source``): ``hub`` (default), ``local`` (Parquet files or image folders under ``--data_dir``, e.g.
``<data_dir>/mnist/train.parquet``) or ``sklearn``. ``--do_train false --model_name_or_path DIR`` evaluates a saved
model (refused if its weights do not fit it, unless ``--allow_mismatched_weights``). A run killed at any moment goes
on with ``--resume_from_checkpoint last`` to the weights of an uninterrupted run. The output folder is a Hub repo
(weights, code, processor, model card); ``--push_to_hub`` uploads it at the end.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import PretrainedConfig
from transformers.trainer_utils import IntervalStrategy, SaveStrategy, SchedulerType

from ni_hf import NeuralInterpreterImageProcessor
from ni_hf.data.digits import (
    DIGIT_CLASS_NAMES,
    HUB_DATASETS,
    LOCAL_FOLDER_NAMES,
    PAPER_TASKS,
    SKLEARN_TASK,
    SOURCES,
    DigitsTransform,
    canonical_task_name,
    load_digits_tasks,
    resolve_dataset_source,
)
from ni_hf.models.neural_interpreter.configuration_neural_interpreter import PAPER_PRESETS
from ni_hf.training.callbacks import time_limit_callbacks
from ni_hf.training.checkpoints import check_weights_readable, read_checkpoint_config, verify_weights_checksum
from ni_hf.training.data_transfer import compile_for_static_batches
from ni_hf.training.evaluation import load_multitask_accuracy, make_compute_metrics
from ni_hf.training.image_classification import (
    DATA_DEFINED_CONFIG_KEYS,
    IMAGE_CLASSIFIERS,
    AugmentationArguments,
    ImageClassificationTrainer,
    build_augmentation,
    check_augmentation,
    check_model_settings,
    saved_architecture,
    task_sizes,
    write_image_classification_card,
)
from ni_hf.training.model_cards import DEFAULT_DIGITS_TEMPLATE, digits_task_info
from ni_hf.training.paths import check_model_path
from ni_hf.training.presets import DIGITS_PRESETS, parse_config_overrides, preset_field
from ni_hf.training.run_flow import ExampleRun, argv_of
from ni_hf.training.run_flow import parse_arguments as parse_script_arguments
from ni_hf.training.run_setup import ExampleTrainingArguments

logger = logging.getLogger(__name__)

SKLEARN_LIMITATION = (
    "scikit-learn's digits are 8x8 images upsampled to 32x32: a check of the pipeline, not a benchmark."
)
PRESETS = DIGITS_PRESETS  # the dataclass defaults below are the paper's recipe


@dataclass
class ModelArguments:
    """Which model to train (or, with --model_name_or_path, to evaluate)."""

    preset: str = preset_field(PRESETS, default="paper")
    model_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "Evaluate this saved model (an output_dir of this script or a Hub repo id) instead of training "
            "one; needs --do_train false. Its config is used as saved."
        },
    )
    allow_mismatched_weights: bool = field(
        default=False,
        metadata={
            "help": "Evaluate --model_name_or_path even when its weights leave parameters of the model missing, "
            "hold others or have other shapes (those parameters are then random)."
        },
    )
    architecture: str = field(
        default="neural_interpreter",
        metadata={
            "help": "'neural_interpreter' or 'vit' (the paper's multi-task ViT baseline of Figure 4a).",
            "choices": list(IMAGE_CLASSIFIERS),
        },
    )
    paper_config: str = field(
        default="digits",
        metadata={
            "help": "Model settings of the paper's appendix tables to start the config from "
            "(NeuralInterpreterConfig.from_paper).",
            "choices": list(PAPER_PRESETS),
        },
    )
    config_overrides: str | None = field(
        default=None,
        metadata={
            "help": "Config settings changed from --paper_config, as key=value pairs with JSON values, e.g. "
            "'num_functions=6,truncation_tau=1.2', merged key by key with the preset's. task_names and num_labels "
            "come from the data."
        },
    )
    attn_implementation: str | None = field(
        default=None,
        metadata={
            "help": "Neural Interpreter only: 'eager' (the literal Eq. 6), 'sdpa' or 'fast' (the package's CPU fast "
            "path); default: the model's choice."
        },
    )


@dataclass
class DataArguments(AugmentationArguments):
    """Which datasets to train and evaluate on, and how to augment them."""

    dataset_source: str | None = field(
        default=None,
        metadata={
            "help": "'hub' ("
            + ", ".join(f"{t}: {HUB_DATASETS[t].repo_id}" for t in PAPER_TASKS)
            + "), 'local' "
            "(Parquet files or image folders under --data_dir) or 'sklearn' (scikit-learn's 8x8 digits, offline). "
            "Default: 'local' if --data_dir is given, else 'hub'.",
            "choices": list(SOURCES),
        },
    )
    task_names: list[str] | None = field(
        default=None,
        metadata={
            "help": f"Datasets to train on together, in this order (default: {' '.join(PAPER_TASKS)}; those found "
            f"under --data_dir for 'local'; {SKLEARN_TASK} for 'sklearn')."
        },
    )
    data_dir: str | None = field(
        default=None,
        metadata={
            "help": "Folder with one sub-folder per dataset: <task>/{train,test}.parquet (columns image, label) or "
            "image folders <task>/{train,test}/<label>/*.png. Folder names: "
            + "; ".join(f"{task}: {'/'.join(names)}" for task, names in LOCAL_FOLDER_NAMES.items())
        },
    )
    max_train_samples: int | None = field(
        default=None,
        metadata={"help": "At most this many training samples per dataset (a seeded random subset)."},
    )
    max_eval_samples: int | None = field(
        default=None,
        metadata={"help": "At most this many test samples per dataset (a seeded random subset)."},
    )


@dataclass
class DigitsTrainingArguments(ExampleTrainingArguments):
    """TrainingArguments with the paper's recipe as defaults."""

    learning_rate: float = field(default=8e-4, metadata={"help": "Peak learning rate (paper: 8e-4)."})
    lr_scheduler_type: SchedulerType | str = field(
        default="cosine_with_min_lr", metadata={"help": "Learning-rate schedule (paper: cosine, no warm-up)."}
    )
    lr_scheduler_kwargs: dict | str | None = field(
        default_factory=lambda: {"min_lr": 1e-6},
        metadata={"help": "Scheduler arguments as JSON (paper: min_lr 1e-6)."},
    )
    per_device_train_batch_size: int = field(
        default=128, metadata={"help": "Training batch per process (paper: 128)."}
    )
    per_device_eval_batch_size: int = field(default=256, metadata={"help": "Evaluation batch per process."})
    num_train_epochs: float = field(default=100.0, metadata={"help": "Training epochs (paper: 100)."})
    eval_strategy: IntervalStrategy | str = field(default="epoch", metadata={"help": "When to evaluate."})
    save_strategy: SaveStrategy | str = field(
        default="epoch", metadata={"help": "When to save a checkpoint."}
    )
    save_total_limit: int | None = field(default=2, metadata={"help": "Keep at most this many checkpoints."})
    dataloader_num_workers: int | None = field(
        default=None, metadata={"help": "DataLoader workers (default: a few on a GPU, none on the CPU)."}
    )
    label_names: list[str] | None = field(
        default_factory=lambda: ["labels", "task_ids"],
        metadata={"help": "What the metrics receive as labels."},
    )

    def __post_init__(self) -> None:
        if self.dataloader_num_workers == 0:  # no worker to keep alive (the quickstart preset asks for one)
            self.dataloader_persistent_workers = False
        super().__post_init__()


ARGUMENTS = (ModelArguments, DataArguments, DigitsTrainingArguments)


def parse_arguments(argv: list[str]) -> tuple[ModelArguments, DataArguments, DigitsTrainingArguments]:
    """The command line, with ``--preset``'s values as defaults (an explicit flag wins), checked before any work."""
    return parse_script_arguments(ARGUMENTS, PRESETS, argv, check=check_arguments)


def check_arguments(
    model_args: ModelArguments,
    data_args: DataArguments,
    args: DigitsTrainingArguments,
    given: frozenset[str] = frozenset(),
) -> None:
    """Refuse what cannot work or would do nothing, before any data or model is loaded."""
    for name in ("max_train_samples", "max_eval_samples"):
        value = getattr(data_args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name} {value}: must be at least 1 (leave it out to use every sample).")
    resolve_dataset_source(data_args.dataset_source, data_args.data_dir)
    check_augmentation(data_args, given, args.do_train)
    check_model_settings(model_args, given)
    path = model_args.model_name_or_path
    if path is None:
        if not args.do_train:
            raise ValueError("--do_train false evaluates a saved model and needs --model_name_or_path.")
        return
    check_evaluation_only(model_args, args, given)
    model_args.model_name_or_path = check_model_path(path)
    read_checkpoint_config(model_args.model_name_or_path)  # a folder without (or with a broken) config.json
    check_weights_readable(model_args.model_name_or_path)
    verify_weights_checksum(model_args.model_name_or_path, "--model_name_or_path")


def check_evaluation_only(
    model_args: ModelArguments, args: DigitsTrainingArguments, given: frozenset[str]
) -> None:
    """--model_name_or_path evaluates a saved model: refuse what would train, change or overwrite something."""
    path = model_args.model_name_or_path
    if args.do_train:
        raise ValueError(
            f"--model_name_or_path {path} evaluates a saved model and needs --do_train false; to continue a "
            "training run, use --resume_from_checkpoint."
        )
    if "config_overrides" in given:
        raise ValueError(
            "--config_overrides: settings of a new model; a saved model's config is used as saved."
        )
    if args.push_to_hub:
        raise ValueError(
            "--push_to_hub with --do_train false: nothing is trained or saved, so nothing to upload."
        )
    if args.resume_from_checkpoint:
        raise ValueError(
            "--resume_from_checkpoint with --do_train false: to evaluate a checkpoint, pass it as --model_name_or_path."
        )
    saved = [name for name in ("config.json", "model.safetensors") if (Path(args.output_dir) / name).exists()]
    if saved:
        raise ValueError(
            f"--output_dir {args.output_dir} holds a saved model ({', '.join(saved)}); --do_train false writes "
            "eval_results.json there: pass an --output_dir of its own."
        )


def build_config(model_args: ModelArguments, task_names: list[str]) -> PretrainedConfig:
    """The paper preset, changed by --config_overrides; task names and labels from the data."""
    config_class = IMAGE_CLASSIFIERS[model_args.architecture][0]
    overrides = parse_config_overrides(
        model_args.config_overrides, config_class, reserved=DATA_DEFINED_CONFIG_KEYS
    )
    config = config_class.from_paper(
        model_args.paper_config,
        **overrides,
        task_names=task_names,
        num_labels=len(DIGIT_CLASS_NAMES),
        id2label=dict(enumerate(DIGIT_CLASS_NAMES)),
        label2id={name: i for i, name in enumerate(DIGIT_CLASS_NAMES)},
    )
    logger.info(
        f"Config: {model_args.architecture} from the paper's {model_args.paper_config!r} settings, changes "
        f"{overrides or 'none'}"
    )
    return config


def load_saved_config(model_args: ModelArguments) -> PretrainedConfig:
    """The config of --model_name_or_path; a model this script cannot have written is refused by its model_type."""
    path = model_args.model_name_or_path
    model_args.architecture = saved_architecture(path, does="evaluates")
    return IMAGE_CLASSIFIERS[model_args.architecture][0].from_pretrained(path)


def resolve_tasks(data_args: DataArguments, default: list[str] | None = None) -> tuple[str, list[str]]:
    """The data source and the task names to load (``default``: a saved model's tasks)."""
    source = resolve_dataset_source(data_args.dataset_source, data_args.data_dir)
    if data_args.task_names:
        names = [name for item in data_args.task_names for name in item.split(",") if name.strip()]
        return source, [canonical_task_name(name) for name in names]
    if default is not None:
        return source, list(default)
    if source == "sklearn":
        return source, [SKLEARN_TASK]
    if source == "local":
        root = Path(data_args.data_dir).expanduser()
        found = [task for task in PAPER_TASKS if any((root / f).is_dir() for f in LOCAL_FOLDER_NAMES[task])]
        if not found:
            raise FileNotFoundError(
                f"None of {', '.join(PAPER_TASKS)} found under {root}; pass --task_names."
            )
        return source, found
    return source, list(PAPER_TASKS)


DigitsTrainer = ImageClassificationTrainer  # the name this script's tests and callers know


def config_and_tasks(
    model_args: ModelArguments, data_args: DataArguments
) -> tuple[PretrainedConfig, str, list[str]]:
    """The model's config (built, or a saved model's) and the data source and tasks to load."""
    if model_args.model_name_or_path is None:
        source, task_names = resolve_tasks(data_args)
        config = build_config(model_args, task_names)
    else:
        config = load_saved_config(model_args)
        source, task_names = resolve_tasks(data_args, default=list(config.task_names))
        unknown = [name for name in task_names if name not in config.task_names]
        if unknown:
            raise ValueError(f"--task_names {' '.join(unknown)}: the saved model has no head for them.")
    config.problem_type = config.problem_type or "single_label_classification"
    return config, source, task_names


def load_data(
    data_args: DataArguments, args: DigitsTrainingArguments, source: str, task_names: list[str]
) -> tuple[Any, list[str], list[int], list[int]]:
    """The datasets (train, test) and each task's training and test sizes, logged."""
    with args.main_process_first(desc="loading the datasets"):
        raw, task_names = load_digits_tasks(
            task_names,
            source=source,
            data_dir=data_args.data_dir,
            max_train_samples=data_args.max_train_samples,
            max_eval_samples=data_args.max_eval_samples,
            seed=args.seed,
        )
    train_counts = task_sizes(raw["train"], task_names, "train") if args.do_train else [0] * len(task_names)
    eval_counts = task_sizes(raw["test"], task_names, "test") if args.do_eval else [0] * len(task_names)
    for name, n_train, n_eval in zip(task_names, train_counts, eval_counts, strict=True):
        logger.info(f"Dataset {name!r} ({source}): {n_train} training samples, {n_eval} test samples")
    return raw, task_names, train_counts, eval_counts


def log_test_accuracies(eval_metrics: dict[str, Any], task_names: list[str]) -> None:
    for name in [*task_names, None]:
        suffix = f"_{name}" if name else ""
        accuracy = 100 * eval_metrics.get(f"eval_accuracy{suffix}", math.nan)
        samples = int(eval_metrics.get(f"eval_num_samples{suffix}", 0))
        logger.info(f"Test accuracy {name or 'overall'}: {accuracy:.2f}% ({samples} samples)")


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Train and evaluate; return the final metrics (also in <output_dir>/all_results.json)."""
    argv = argv_of(argv)
    model_args, data_args, args = parse_arguments(argv)
    with ExampleRun.start(__file__, argv, args, logger) as run:
        return train_and_evaluate(run, model_args, data_args, args)


def train_and_evaluate(
    run: ExampleRun, model_args: ModelArguments, data_args: DataArguments, args: DigitsTrainingArguments
) -> dict[str, float]:
    """Config, model, data, Trainer, train, evaluate, card, push."""
    compile_for_static_batches(args)
    callbacks = time_limit_callbacks(args.max_train_minutes)
    run.resume_checkpoint()  # a bad --resume_from_checkpoint is refused before the data
    config, source, task_names = config_and_tasks(model_args, data_args)
    # The model before the data: a wrong override or weights that do not fit should not wait.
    model = run.model(
        IMAGE_CLASSIFIERS[model_args.architecture][1],
        config=config,
        path=model_args.model_name_or_path,
        allow_mismatched_weights=model_args.allow_mismatched_weights,
        attn_implementation=model_args.attn_implementation,
    )
    raw, task_names, train_counts, eval_counts = load_data(data_args, args, source, task_names)
    model_task_ids = [list(config.task_names).index(name) for name in task_names]
    processor = NeuralInterpreterImageProcessor(
        size={"height": config.image_size, "width": config.image_size}, patch_size=config.patch_size
    )
    for split in ("train", "test"):
        raw[split].set_transform(DigitsTransform(processor, model_task_ids))
    with args.main_process_first(desc="loading the metric"):
        metric = load_multitask_accuracy(keep_in_memory=True)
    trainer = DigitsTrainer(
        model=model,
        args=args,
        train_dataset=raw["train"] if args.do_train else None,
        eval_dataset=raw["test"] if args.do_eval else None,
        processing_class=processor,
        compute_metrics=make_compute_metrics(task_names, model_task_ids, metric),
        optimizer_cls_and_kwargs=run.optimizer(),
        augmentation=build_augmentation(data_args, processor, args.device, args.do_train),
        callbacks=callbacks,
    )
    train_metrics: dict[str, Any] = {}
    if args.do_train:
        train_metrics = run.train(
            trainer, train_samples=len(raw["train"]), architecture=model_args.architecture
        )
    eval_metrics: dict[str, Any] = {}
    if args.do_eval:
        eval_metrics = run.evaluate(trainer, eval_samples=len(raw["test"]), eval_world_size=args.world_size)
        log_test_accuracies(eval_metrics, task_names)
    if not args.do_train:
        logger.info(
            f"--do_train false: nothing trained or saved; the evaluation is in {args.output_dir}/eval_results.json"
        )
    elif run.is_main_process:
        write_card(run, model, trainer, model_args, data_args, source, task_names, train_counts, eval_counts,
                   train_metrics, eval_metrics, raw["test"])  # fmt: skip
    run.finish(trainer, "Trained with examples/run_digits.py")
    return {**train_metrics, **eval_metrics}


def write_card(
    run: ExampleRun,
    model: torch.nn.Module,
    trainer: ImageClassificationTrainer,
    model_args: ModelArguments,
    data_args: DataArguments,
    source: str,
    task_names: list[str],
    train_counts: list[int],
    eval_counts: list[int],
    train_metrics: dict[str, Any],
    eval_metrics: dict[str, Any],
    test: Any,
) -> None:
    """The model card (results per dataset, the command, the hardware) and its routing picture."""
    tasks = [
        digits_task_info(name, source, data_args.data_dir, train_counts[i], eval_counts[i], eval_metrics)
        for i, name in enumerate(task_names)
    ]
    write_image_classification_card(
        run, model, trainer, tasks, (train_metrics, eval_metrics), test,
        draw=model_args.architecture == "neural_interpreter" and run.args.do_eval,
        template_path=DEFAULT_DIGITS_TEMPLATE, preset=model_args.preset, max_eval_samples=data_args.max_eval_samples,
        extra_limitations=[SKLEARN_LIMITATION] if source == "sklearn" else [],
    )  # fmt: skip


if __name__ == "__main__":
    main()
