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
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import torch
from transformers import HfArgumentParser, PretrainedConfig, Trainer, TrainingArguments, set_seed
from transformers.trainer_utils import IntervalStrategy, SaveStrategy, SchedulerType

from ni_hf import (
    MultiTaskViTConfig,
    MultiTaskViTForImageClassification,
    NeuralInterpreterConfig,
    NeuralInterpreterForImageClassification,
    NeuralInterpreterImageProcessor,
)
from ni_hf.data.augmentation import OPERATION_NAMES, BatchRandAugment, select_operations
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
from ni_hf.training.checkpoints import (
    ExactResumeMixin,
    check_weights_readable,
    load_checked,
    output_dir_lock,
    read_checkpoint_config,
    resolve_resume_checkpoint,
)
from ni_hf.training.data_transfer import apply_gpu_loading_defaults, compile_for_static_batches
from ni_hf.training.evaluation import CopiedPredictionsMixin, load_multitask_accuracy, make_compute_metrics
from ni_hf.training.model_cards import DEFAULT_DIGITS_TEMPLATE, digits_task_info, write_digits_model_card
from ni_hf.training.paths import check_model_path
from ni_hf.training.presets import DIGITS_PRESETS, parse_config_overrides, parse_with_presets, preset_field
from ni_hf.training.publishing import hub_repo_id, push_run, reconstruct_command
from ni_hf.training.run_setup import setup_logging

logger = logging.getLogger(__name__)

ARCHITECTURES = {
    "neural_interpreter": (NeuralInterpreterConfig, NeuralInterpreterForImageClassification),
    "vit": (MultiTaskViTConfig, MultiTaskViTForImageClassification),
}
DATA_DEFINED_CONFIG_KEYS = ("task_names", "num_labels", "id2label", "label2id")
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
            "choices": list(ARCHITECTURES),
        },
    )
    config_name: str = field(
        default="digits",
        metadata={
            "help": "Preset of the paper's appendix tables to start the config from.",
            "choices": list(PAPER_PRESETS),
        },
    )
    config_overrides: str | None = field(
        default=None,
        metadata={
            "help": "Config settings changed from --config_name, as key=value pairs with JSON values, e.g. "
            "'num_functions=6,truncation_tau=1.2', merged key by key with the preset's. task_names and num_labels "
            "come from the data."
        },
    )
    attn_implementation: str | None = field(
        default=None,
        metadata={
            "help": "Attention: 'eager' (the literal Eq. 6), 'sdpa' or 'fast' (the package's CPU fast path); "
            "default: the model's choice."
        },
    )


@dataclass
class DataArguments:
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
    randaugment: bool = field(default=True, metadata={"help": "Augment training batches with RandAugment."})
    randaugment_num_ops: int = field(default=2, metadata={"help": "RandAugment: operations per image (n)."})
    randaugment_magnitude: float = field(
        default=9.0,
        metadata={"help": "RandAugment magnitude m on timm's scale, in [0, 10] (paper: rand-m9)."},
    )
    randaugment_operations: list[str] | None = field(
        default=None,
        metadata={"help": "RandAugment operations to draw from (default: all): " + " ".join(OPERATION_NAMES)},
    )
    randaugment_probability: float = field(
        default=0.5,
        metadata={"help": "RandAugment: probability that an image gets a drawn operation (timm: 0.5)."},
    )


@dataclass
class DigitsTrainingArguments(TrainingArguments):
    """TrainingArguments with the paper's recipe as defaults."""

    do_train: bool = field(
        default=True, metadata={"help": "Train (--do_train false: evaluate --model_name_or_path)."}
    )
    do_eval: bool = field(default=True, metadata={"help": "Evaluate on the test sets after training."})
    radam: bool = field(
        default=True,
        metadata={"help": "Optimize with torch.optim.RAdam (the paper's); --radam false uses --optim."},
    )
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
    max_train_minutes: float | None = field(
        default=None, metadata={"help": "Stop training once this many minutes have passed (a guard)."}
    )
    eval_strategy: IntervalStrategy | str = field(default="epoch", metadata={"help": "When to evaluate."})
    save_strategy: SaveStrategy | str = field(
        default="epoch", metadata={"help": "When to save a checkpoint."}
    )
    save_total_limit: int | None = field(default=2, metadata={"help": "Keep at most this many checkpoints."})
    logging_steps: float = field(
        default=50, metadata={"help": "Log the training loss every this many steps."}
    )
    remove_unused_columns: bool = field(
        default=False, metadata={"help": "Must stay false: images are preprocessed on the fly."}
    )
    label_names: list[str] | None = field(
        default_factory=lambda: ["labels", "task_ids"],
        metadata={"help": "What the metrics receive as labels."},
    )
    dataloader_num_workers: int | None = field(
        default=None, metadata={"help": "DataLoader workers (default: a few on a GPU, none on the CPU)."}
    )
    dataloader_pin_memory: bool = field(
        default=torch.cuda.is_available(),
        metadata={"help": "Pin batches (default: where CUDA is available)."},
    )

    def __post_init__(self) -> None:
        apply_gpu_loading_defaults(self)  # before transformers turns accelerator_config into its own class
        if self.dataloader_num_workers == 0:  # no worker to keep alive (the quickstart preset asks for one)
            self.dataloader_persistent_workers = False
        super().__post_init__()


ARGUMENTS = (ModelArguments, DataArguments, DigitsTrainingArguments)


def parse_arguments(argv: list[str]) -> tuple[ModelArguments, DataArguments, DigitsTrainingArguments]:
    """The command line, with ``--preset``'s values as defaults (an explicit flag wins)."""
    return parse_with_presets(HfArgumentParser(ARGUMENTS), PRESETS, argv)


def check_arguments(
    model_args: ModelArguments, data_args: DataArguments, args: DigitsTrainingArguments
) -> None:
    """Refuse what cannot work or would do nothing, before any data or model is loaded."""
    optim = str(getattr(args.optim, "value", args.optim))
    default_optim = TrainingArguments.__dataclass_fields__["optim"].default
    if args.radam and optim != str(getattr(default_optim, "value", default_optim)):
        raise ValueError(
            f"--optim {optim} with --radam true: RAdam would be used; pass --radam false to use --optim."
        )
    if args.do_train and (args.max_steps == 0 or (args.max_steps < 0 and args.num_train_epochs <= 0)):
        what = "--max_steps 0" if args.max_steps == 0 else f"--num_train_epochs {args.num_train_epochs:g}"
        raise ValueError(f"{what}: no training step would run; pass a positive number (or --do_train false).")
    for name in ("max_train_samples", "max_eval_samples"):
        value = getattr(data_args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name} {value}: must be at least 1 (leave it out to use every sample).")
    resolve_dataset_source(data_args.dataset_source, data_args.data_dir)
    if data_args.randaugment and args.do_train:
        BatchRandAugment(
            data_args.randaugment_num_ops,
            data_args.randaugment_magnitude,
            data_args.randaugment_probability,
            policy=select_operations(data_args.randaugment_operations),
        )
    path = model_args.model_name_or_path
    if path is None:
        if not args.do_train:
            raise ValueError("--do_train false evaluates a saved model and needs --model_name_or_path.")
        return
    if args.do_train:
        raise ValueError(
            f"--model_name_or_path {path} evaluates a saved model and needs --do_train false; to continue a "
            "training run, use --resume_from_checkpoint."
        )
    preset = PRESETS[model_args.preset].config
    given = parse_config_overrides(model_args.config_overrides, ARCHITECTURES[model_args.architecture][0])
    if [
        key for key, value in given.items() if key not in preset or preset[key] != value
    ]:  # the user's, not the preset's
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
    model_args.model_name_or_path = check_model_path(path)
    check_weights_readable(model_args.model_name_or_path)


def build_config(model_args: ModelArguments, task_names: list[str]) -> PretrainedConfig:
    """The paper preset, changed by --config_overrides; task names and labels from the data."""
    config_class = ARCHITECTURES[model_args.architecture][0]
    overrides = parse_config_overrides(
        model_args.config_overrides, config_class, reserved=DATA_DEFINED_CONFIG_KEYS
    )
    config = config_class.from_paper(
        model_args.config_name,
        **overrides,
        task_names=task_names,
        num_labels=len(DIGIT_CLASS_NAMES),
        id2label=dict(enumerate(DIGIT_CLASS_NAMES)),
        label2id={name: i for i, name in enumerate(DIGIT_CLASS_NAMES)},
    )
    logger.info(
        f"Config: {model_args.architecture} preset {model_args.config_name!r}, changes {overrides or 'none'}"
    )
    return config


def load_saved_config(model_args: ModelArguments) -> PretrainedConfig:
    """The config of --model_name_or_path; a model this script cannot have written is refused by its model_type."""
    path = model_args.model_name_or_path
    config_dict = read_checkpoint_config(path)
    by_type = {config_class.model_type: name for name, (config_class, _) in ARCHITECTURES.items()}
    model_type = config_dict.get("model_type")
    if model_type not in by_type:
        raise ValueError(
            f"--model_name_or_path {path}: its config.json has model_type {model_type!r}; this script evaluates "
            f"{' or '.join(repr(t) for t in by_type)} models."
        )
    model_args.architecture = by_type[model_type]
    return ARCHITECTURES[model_args.architecture][0].from_pretrained(path)


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


def task_sizes(dataset: datasets.Dataset, task_names: list[str], split: str) -> list[int]:
    """Rows of each task in a split; a task without any is refused by name."""
    counts = np.bincount(
        np.asarray(dataset.with_format(None)["task_id"], dtype=np.int64), minlength=len(task_names)
    )
    empty = [name for name, count in zip(task_names, counts, strict=True) if count == 0]
    if empty:
        raise ValueError(
            f"The {split} split of {', '.join(empty)} holds no samples: nothing to train or evaluate on."
        )
    return [int(count) for count in counts]


class DigitsTrainer(ExactResumeMixin, CopiedPredictionsMixin, Trainer):
    """Trainer that augments training batches on the training device, and leaves the eval loss to compute_metrics."""

    def __init__(self, *args: Any, augmentation: torch.nn.Module | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.augmentation = augmentation

    def training_step(self, model: torch.nn.Module, inputs: dict[str, Any], num_items_in_batch: Any = None):
        """RandAugment ``pixel_values`` once the batch is on the device, then train as usual."""
        if self.augmentation is not None:
            inputs = self._prepare_inputs(inputs)
            inputs["pixel_values"] = self.augmentation(inputs["pixel_values"])
        return super().training_step(model, inputs, num_items_in_batch)

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        """Logits and labels without the batch loss (compute_metrics computes the exact mean over samples)."""
        _, logits, labels = super().prediction_step(model, inputs, False, ignore_keys=ignore_keys)
        return None, logits, labels


def add_routing_to_card(
    model: torch.nn.Module, test: datasets.Dataset, card: Path, num_images: int = 64
) -> None:
    """Append the computational path of a test image and the function usage of a test batch to the model card."""
    try:
        from ni_hf.visualization import write_routing_card_assets
    except ImportError as error:  # matplotlib is the `vis` extra
        logger.warning(f"No routing picture on the model card ({error}); pip install 'ni_hf[vis]' for it")
        return
    batch = test.shuffle(seed=0).select(range(min(num_images, len(test))))[:]
    assets = write_routing_card_assets(
        model,
        torch.as_tensor(np.stack(batch["pixel_values"])).to(model.device),
        torch.as_tensor(batch["task_ids"]),
        card.parent,
        labels=batch["labels"],
    )
    with card.open("a") as f:
        f.write("\n" + assets["markdown"].rstrip() + "\n")
    logger.info(
        f"Routing picture and function usage added to the model card: {', '.join(map(str, assets['files']))}"
    )


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Train and evaluate; return the final metrics (also in <output_dir>/all_results.json)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    model_args, data_args, args = parse_arguments(argv)
    check_arguments(model_args, data_args, args)
    push_to_hub, args.push_to_hub = args.push_to_hub, False  # uploaded at the end, with our model card
    setup_logging(args, logger, transformers_info=True)
    logger.warning(
        f"Process {args.process_index} of world size {args.world_size}: device {args.device}, "
        f"distributed {args.parallel_mode.value}"
    )
    with output_dir_lock(args.output_dir, enabled=args.should_save):
        return run(model_args, data_args, args, argv, push_to_hub)


def run(
    model_args: ModelArguments,
    data_args: DataArguments,
    args: DigitsTrainingArguments,
    argv: list[str],
    push_to_hub: bool,
) -> dict[str, float]:
    """Data, model, Trainer, train, evaluate, card, push."""
    # Config, model, data
    set_seed(args.seed)
    compile_for_static_batches(args)
    callbacks = time_limit_callbacks(args.max_train_minutes)  # refuses a bad value before the data
    resume = args.resume_from_checkpoint if args.do_train else None
    checkpoint = resolve_resume_checkpoint(resume, args.output_dir)
    if model_args.model_name_or_path is not None:
        config = load_saved_config(model_args)
        source, task_names = resolve_tasks(data_args, default=list(config.task_names))
        unknown = [name for name in task_names if name not in config.task_names]
        if unknown:
            raise ValueError(f"--task_names {' '.join(unknown)}: the saved model has no head for them.")
    else:
        source, task_names = resolve_tasks(data_args)
        config = build_config(model_args, task_names)
    # The model before the data: a wrong override or weights that do not fit should not wait.
    config.problem_type = config.problem_type or "single_label_classification"
    model_class = ARCHITECTURES[model_args.architecture][1]
    kwargs = {"attn_implementation": model_args.attn_implementation} if model_args.attn_implementation else {}
    if model_args.model_name_or_path is not None:
        path, allow = model_args.model_name_or_path, model_args.allow_mismatched_weights
        model = load_checked(model_class, path, allow_mismatched_weights=allow, config=config, **kwargs)
    else:
        model = model_class._from_config(config, **kwargs)
    logger.info(f"{type(model).__name__}: {sum(p.numel() for p in model.parameters()):,} parameters")
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

    # Transforms
    model_task_ids = [list(config.task_names).index(name) for name in task_names]
    processor = NeuralInterpreterImageProcessor(
        size={"height": config.image_size, "width": config.image_size}, patch_size=config.patch_size
    )
    raw["train"].set_transform(DigitsTransform(processor, model_task_ids))
    raw["test"].set_transform(DigitsTransform(processor, model_task_ids))
    augmentation = None
    if data_args.randaugment and args.do_train:
        augmentation = BatchRandAugment(
            data_args.randaugment_num_ops,
            data_args.randaugment_magnitude,
            data_args.randaugment_probability,
            image_mean=processor.image_mean,
            image_std=processor.image_std,
            policy=select_operations(data_args.randaugment_operations),
        ).to(args.device)
        logger.info(f"Training batches augmented on {args.device}: RandAugment({augmentation.extra_repr()})")

    # Trainer
    with args.main_process_first(desc="loading the metric"):
        metric = load_multitask_accuracy(keep_in_memory=True)
    optimizer = None
    if args.radam:
        betas = (args.adam_beta1, args.adam_beta2)
        optimizer = (torch.optim.RAdam, {"lr": args.learning_rate, "betas": betas, "eps": args.adam_epsilon})
    trainer = DigitsTrainer(
        model=model,
        args=args,
        train_dataset=raw["train"] if args.do_train else None,
        eval_dataset=raw["test"] if args.do_eval else None,
        processing_class=processor,
        compute_metrics=make_compute_metrics(task_names, model_task_ids, metric),
        optimizer_cls_and_kwargs=optimizer,
        augmentation=augmentation,
        callbacks=callbacks,
    )

    # Train
    train_metrics: dict[str, Any] = {}
    if args.do_train:
        if checkpoint:
            logger.info(f"Resuming from {checkpoint}")
        train_result = trainer.train(resume_from_checkpoint=checkpoint)
        trainer.save_model()  # weights, config (auto_map), model code, preprocessor_config.json
        train_metrics = {
            **train_result.metrics,
            "train_samples": len(raw["train"]),
            "world_size": args.world_size,
            "global_step": trainer.state.global_step,
            "architecture": model_args.architecture,
        }
        trainer.log_metrics("train", train_metrics)
        trainer.save_metrics("train", train_metrics)
        trainer.save_state()

    # Evaluate
    eval_metrics: dict[str, Any] = {}
    if args.do_eval:
        eval_metrics = trainer.evaluate()
        eval_metrics.update(eval_samples=len(raw["test"]), eval_world_size=args.world_size)
        trainer.log_metrics("eval", eval_metrics)
        trainer.save_metrics("eval", eval_metrics)
        for name in [*task_names, None]:
            suffix = f"_{name}" if name else ""
            accuracy = 100 * eval_metrics.get(f"eval_accuracy{suffix}", math.nan)
            samples = int(eval_metrics.get(f"eval_num_samples{suffix}", 0))
            logger.info(f"Test accuracy {name or 'overall'}: {accuracy:.2f}% ({samples} samples)")

    # Model card and Hub
    repo_id = hub_repo_id(args)
    if not args.do_train:
        logger.info(
            f"--do_train false: nothing trained or saved; the evaluation is in {args.output_dir}/eval_results.json"
        )
    elif trainer.is_world_process_zero():
        tasks = [
            digits_task_info(name, source, data_args.data_dir, train_counts[i], eval_counts[i], eval_metrics)
            for i, name in enumerate(task_names)
        ]
        command, launcher_note = reconstruct_command(__file__, argv, args.world_size)
        path = write_digits_model_card(
            args.output_dir,
            template_path=DEFAULT_DIGITS_TEMPLATE,
            repo_id=repo_id,
            model=model,
            tasks=tasks,
            eval_metrics=eval_metrics,
            train_metrics=train_metrics,
            training_args=args,
            optimizer="RAdam (torch.optim.RAdam)"
            if args.radam
            else str(getattr(args.optim, "value", args.optim)),
            command=command,
            launcher_note=launcher_note,
            randaugment=augmentation.extra_repr() if augmentation is not None else None,
            preset=model_args.preset,
            max_eval_samples=data_args.max_eval_samples,
            extra_limitations=[SKLEARN_LIMITATION] if source == "sklearn" else [],
        )
        logger.info(f"Model card written to {path}")
        if model_args.architecture == "neural_interpreter" and args.do_eval:
            add_routing_to_card(model, raw["test"], path)
    trainer.accelerator.wait_for_everyone()
    try:
        if push_to_hub and trainer.is_world_process_zero():
            push_run(args.output_dir, args, commit_message="Trained with examples/run_digits.py")
    finally:
        trainer.end()
    return {**train_metrics, **eval_metrics}


if __name__ == "__main__":
    main()
