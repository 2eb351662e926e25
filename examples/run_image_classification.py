#!/usr/bin/env python
"""Train a Neural Interpreter (or the multi-task ViT baseline) on your own images: any classes, any size, one or
several datasets at once (one CLS token and head each, as in the paper's digits experiment).

    python examples/run_image_classification.py --train_dir path/to/train --output_dir runs/mine
    python examples/run_image_classification.py --dataset_name zalando-datasets/fashion_mnist --output_dir runs/fmnist
    accelerate launch examples/run_image_classification.py --dataset_name a/one b/two --output_dir runs/two-tasks

The flags follow transformers' ``examples/pytorch/image-classification/run_image_classification.py``: data from a
Hub dataset (``--dataset_name`` with ``--dataset_config_name``), from image folders ``<dir>/<class>/<image>``
(``--train_dir``, ``--validation_dir``), or from local Parquet/Arrow files or folders (``--dataset_name PATH``);
``--train_val_split`` when the data has no validation split; ``--image_column_name`` and ``--label_column_name``.
Several ``--dataset_name`` / ``--train_dir`` values are several tasks. Label names and their number come from the
data (a ClassLabel feature or the folder names) and go into the config's ``id2label`` and the model card.
``--image_size``, ``--patch_size`` and ``--num_channels`` set what the processor and the model read (logged).
``--model_name_or_path CKPT`` fine-tunes a saved model: on other tasks or labels it gets fresh CLS tokens and heads
(logged); with ``--do_train false`` it is evaluated. The output folder is a Hub repo (weights, code, processor, a
model card with the results and a routing picture); ``--push_to_hub`` uploads it at the end.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from transformers import PretrainedConfig
from transformers.trainer_utils import IntervalStrategy, SaveStrategy, SchedulerType

from ni_hf import (
    NeuralInterpreterForImageClassification,
    NeuralInterpreterImageProcessor,
)
from ni_hf.data.images import ImageClassificationTransform, ImageDatasetSource, ImageTask, load_image_tasks
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
    fit_label_sets,
    saved_architecture,
    write_image_classification_card,
)
from ni_hf.training.model_cards import image_task_info
from ni_hf.training.paths import check_model_path
from ni_hf.training.presets import IMAGE_CLASSIFICATION_PRESETS, parse_config_overrides, preset_field
from ni_hf.training.run_flow import ExampleRun, argv_of
from ni_hf.training.run_flow import parse_arguments as parse_script_arguments
from ni_hf.training.run_setup import ExampleTrainingArguments, check_at_least

logger = logging.getLogger(__name__)

GEOMETRY = ("image_size", "patch_size", "num_channels")  # flags of their own, not --config_overrides
PRESETS = IMAGE_CLASSIFICATION_PRESETS
SCRIPT = "examples/run_image_classification.py"


@dataclass
class ModelArguments:
    """Which model to train: a new one (an architecture and its settings) or a saved one to fine-tune or evaluate."""

    preset: str | None = preset_field(PRESETS, default=None)
    model_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "A saved model (an output folder of this script or run_digits.py, or a Hub repo id) to "
            "fine-tune (on other tasks or labels: fresh CLS tokens and heads) or, with --do_train false, evaluate."
        },
    )
    architecture: str = field(
        default="neural_interpreter",
        metadata={
            "help": "'neural_interpreter' or 'vit' (the multi-task ViT baseline).",
            "choices": list(IMAGE_CLASSIFIERS),
        },
    )
    paper_config: str = field(
        default="digits",
        metadata={
            "help": "The paper's model settings to start a new model from.",
            "choices": list(PAPER_PRESETS),
        },
    )
    config_overrides: str | None = field(
        default=None,
        metadata={"help": "Config settings changed from --paper_config, key=value pairs with JSON values."},
    )
    image_size: int | None = field(
        default=None, metadata={"help": "Images are resized to this square size (default: the config's, 32)."}
    )
    patch_size: int | None = field(
        default=None,
        metadata={"help": "Side of the square patches (tokens); must divide --image_size (default 4)."},
    )
    num_channels: int | None = field(
        default=None,
        metadata={"help": "3: RGB (gray images replicated); 1: grayscale (RGB converted). Default 3."},
    )
    attn_implementation: str | None = field(
        default=None,
        metadata={"help": "Neural Interpreter: 'eager', 'sdpa' (default) or 'fast' (the CPU kernels)."},
    )
    ignore_mismatched_sizes: bool = field(
        default=False,
        metadata={
            "help": "As in transformers' script. A saved classifier gets fresh heads for other labels in any case "
            "(logged); this also accepts other weights of other shapes."
        },
    )
    allow_mismatched_weights: bool = field(
        default=False,
        metadata={
            "help": "Load --model_name_or_path even if its weights leave parameters missing (then random)."
        },
    )
    cache_dir: str | None = field(
        default=None, metadata={"help": "Where Hub datasets and models are cached."}
    )
    token: str | None = field(default=None, metadata={"help": "A Hub token for private datasets or models."})


@dataclass
class DataArguments(AugmentationArguments):
    """Which datasets to train and evaluate on (one task each), and how to augment them."""

    dataset_name: list[str] | None = field(
        default=None,
        metadata={"help": "Hub datasets, or local folders or files of Parquet/Arrow (one task each)."},
    )
    dataset_config_name: list[str] | None = field(
        default=None, metadata={"help": "The config of each --dataset_name (one, or one per dataset)."}
    )
    train_dir: list[str] | None = field(
        default=None, metadata={"help": "Image folders <dir>/<class>/<image> to train on (one task each)."}
    )
    validation_dir: list[str] | None = field(
        default=None, metadata={"help": "Image folders to evaluate on, one per --train_dir."}
    )
    task_names: list[str] | None = field(
        default=None, metadata={"help": "A name for each task (default: the dataset's or folder's name)."}
    )
    train_val_split: float = field(
        default=0.15,
        metadata={"help": "Fraction of the training rows held out where there is no validation split."},
    )
    image_column_name: str = field(default="image", metadata={"help": "The column of the images."})
    label_column_name: str = field(default="label", metadata={"help": "The column of the labels."})
    max_train_samples: int | None = field(
        default=None,
        metadata={"help": "At most this many training images per task (a seeded random subset)."},
    )
    max_eval_samples: int | None = field(
        default=None,
        metadata={"help": "At most this many validation images per task (a seeded random subset)."},
    )
    skip_bad_images: bool = field(
        default=False,
        metadata={"help": "Leave out images that cannot be decoded (counted and named) instead of stopping."},
    )


@dataclass
class ImageClassificationTrainingArguments(ExampleTrainingArguments):
    """TrainingArguments with defaults for a small model trained from scratch."""

    learning_rate: float = field(default=1e-3, metadata={"help": "Peak learning rate."})
    lr_scheduler_type: SchedulerType | str = field(
        default="cosine_with_min_lr", metadata={"help": "Learning-rate schedule."}
    )
    lr_scheduler_kwargs: dict | str | None = field(
        default_factory=lambda: {"min_lr": 1e-6}, metadata={"help": "Scheduler arguments as JSON."}
    )
    warmup_steps: float = field(default=100, metadata={"help": "Linear warm-up steps."})
    per_device_train_batch_size: int = field(default=64, metadata={"help": "Training batch per process."})
    per_device_eval_batch_size: int = field(default=256, metadata={"help": "Evaluation batch per process."})
    num_train_epochs: float = field(default=10.0, metadata={"help": "Training epochs."})
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
        if self.dataloader_num_workers == 0:
            self.dataloader_persistent_workers = False
        super().__post_init__()


ARGUMENTS = (ModelArguments, DataArguments, ImageClassificationTrainingArguments)


def parse_arguments(
    argv: list[str],
) -> tuple[ModelArguments, DataArguments, ImageClassificationTrainingArguments]:
    """The command line, with ``--preset``'s values as defaults (an explicit flag wins), checked before any work."""
    return parse_script_arguments(ARGUMENTS, PRESETS, argv, check=check_arguments)


def check_arguments(
    model_args: ModelArguments,
    data_args: DataArguments,
    args: ImageClassificationTrainingArguments,
    given: frozenset[str] = frozenset(),
) -> None:
    """Refuse, naming the flag, what cannot work or would do nothing, before any data or model is loaded."""
    data_sources(data_args)  # the datasets' flags fit together
    check_at_least("--max_train_samples", data_args.max_train_samples, 1)
    check_at_least("--max_eval_samples", data_args.max_eval_samples, 1)
    for option in GEOMETRY:
        check_at_least(f"--{option}", getattr(model_args, option), 1)
    if model_args.num_channels not in (None, 1, 3):
        raise ValueError(f"--num_channels {model_args.num_channels}: expected 1 (grayscale) or 3 (RGB).")
    if not 0 <= data_args.train_val_split < 1:
        raise ValueError(f"--train_val_split {data_args.train_val_split}: must lie in [0, 1).")
    check_augmentation(data_args, given, args.do_train)
    check_model_settings(model_args, given, own_flags=GEOMETRY)
    if model_args.model_name_or_path is None:
        if not args.do_train:
            raise ValueError("--do_train false evaluates a saved model and needs --model_name_or_path.")
        return
    check_saved_model(model_args, given)


def check_saved_model(model_args: ModelArguments, given: frozenset[str]) -> None:
    """--model_name_or_path: its settings are the model's; a new model's settings are refused, naming them."""
    new_model = [
        f"--{name}"
        for name in ("architecture", "paper_config", "config_overrides", *GEOMETRY)
        if name in given
    ]
    if new_model:
        raise ValueError(
            f"{', '.join(new_model)} with --model_name_or_path: settings of a new model; the saved model's are used."
        )
    model_args.model_name_or_path = check_model_path(model_args.model_name_or_path)
    read_checkpoint_config(model_args.model_name_or_path)  # a folder without (or with a broken) config.json
    check_weights_readable(model_args.model_name_or_path)
    verify_weights_checksum(model_args.model_name_or_path, "--model_name_or_path")


def data_sources(data_args: DataArguments) -> list[ImageDatasetSource]:
    """One ``ImageDatasetSource`` per task: the --dataset_name values, then the --train_dir values."""
    names, configs = data_args.dataset_name or [], data_args.dataset_config_name or []
    train_dirs, validation_dirs = data_args.train_dir or [], data_args.validation_dir or []
    if not names and not train_dirs:
        raise ValueError(
            "No data: pass --dataset_name (a Hub dataset or local files) or --train_dir (image folders)."
        )
    if len(configs) not in (0, 1, len(names)):
        raise ValueError(
            f"--dataset_config_name: give one, or one per --dataset_name ({len(names)}), got {len(configs)}."
        )
    if validation_dirs and len(validation_dirs) != len(train_dirs):
        raise ValueError(
            f"--validation_dir: one per --train_dir ({len(train_dirs)}), got {len(validation_dirs)}."
        )
    if data_args.task_names and len(data_args.task_names) != len(names) + len(train_dirs):
        raise ValueError(
            f"--task_names: one per dataset ({len(names) + len(train_dirs)}), got {len(data_args.task_names)}."
        )
    task_names = data_args.task_names or [None] * (len(names) + len(train_dirs))
    columns = {
        "image_column_name": data_args.image_column_name,
        "label_column_name": data_args.label_column_name,
    }
    sources = [
        ImageDatasetSource(
            name=task,
            dataset_name=name,
            dataset_config_name=(configs * len(names))[i] if configs else None,
            **columns,
        )
        for i, (task, name) in enumerate(zip(task_names, names, strict=False))
    ]
    for i, train_dir in enumerate(train_dirs):
        validation = validation_dirs[i] if validation_dirs else None
        sources.append(
            ImageDatasetSource(
                name=task_names[len(names) + i], train_dir=train_dir, validation_dir=validation, **columns
            )
        )
    return sources


def label_sets(tasks: list[ImageTask]) -> tuple[int, list[str]]:
    """The number of outputs every head gets (the largest task's) and the label names the config carries (the first
    task's, padded with the others' where they have more)."""
    num_labels = max(task.num_labels for task in tasks)
    names = list(tasks[0].label_names)
    for task in tasks[1:]:
        names += [f"{task.name}:{name}" for name in task.label_names[len(names) :]]
    return num_labels, names


def build_config(model_args: ModelArguments, tasks: list[ImageTask]) -> PretrainedConfig:
    """The paper's settings, changed by --config_overrides and the image flags; tasks and labels from the data."""
    config_class = IMAGE_CLASSIFIERS[model_args.architecture][0]
    overrides = parse_config_overrides(
        model_args.config_overrides, config_class, reserved=DATA_DEFINED_CONFIG_KEYS
    )
    overrides.update(
        {key: getattr(model_args, key) for key in GEOMETRY if getattr(model_args, key) is not None}
    )
    num_labels, names = label_sets(tasks)
    config = config_class.from_paper(
        model_args.paper_config,
        **overrides,
        task_names=[task.name for task in tasks],
        num_labels=num_labels,
        id2label=dict(enumerate(names)),
        label2id={name: i for i, name in enumerate(names)},
    )
    logger.info(
        f"Config: {model_args.architecture} from the paper's {model_args.paper_config!r} settings, changes "
        f"{overrides or 'none'}; {num_labels} outputs per head"
    )
    return config


def load_data(
    data_args: DataArguments, args: ImageClassificationTrainingArguments, patch_size: int, cache_dir: str | None,
    token: str | None,
) -> tuple[Any, list[ImageTask]]:  # fmt: skip
    """The datasets (train, validation), one task each; images smaller than a patch are refused by name."""
    with args.main_process_first(desc="loading the datasets"):
        return load_image_tasks(
            data_sources(data_args),
            train_val_split=data_args.train_val_split,
            max_train_samples=data_args.max_train_samples,
            max_eval_samples=data_args.max_eval_samples,
            seed=args.seed,
            skip_bad_images=data_args.skip_bad_images,
            min_image_size=patch_size,
            cache_dir=cache_dir,
            token=token,
        )


def prepare_model(run: ExampleRun, model_args: ModelArguments, tasks: list[ImageTask]) -> Any:
    """A new model for the data's tasks, or the saved one, fitted to the data's tasks and labels (fresh heads)."""
    path = model_args.model_name_or_path
    if path is not None:
        model_args.architecture = saved_architecture(path)
    model_class = IMAGE_CLASSIFIERS[model_args.architecture][1]
    model = run.model(
        model_class,
        config=None if path else build_config(model_args, tasks),
        path=path,
        allow_mismatched_weights=model_args.allow_mismatched_weights or model_args.ignore_mismatched_sizes,
        attn_implementation=model_args.attn_implementation,
    )
    if path is not None and run.args.do_train:
        num_labels, names = label_sets(tasks)
        fit_label_sets(model, [task.name for task in tasks], names[:num_labels])
    elif path is not None:
        unknown = [task.name for task in tasks if task.name not in model.config.task_names]
        if unknown:
            raise ValueError(
                f"Tasks {unknown}: the saved model has no head for them (its tasks: {model.config.task_names})."
            )
    model.config.problem_type = model.config.problem_type or "single_label_classification"
    return model


def processor_for(config: PretrainedConfig) -> NeuralInterpreterImageProcessor:
    """The image processor of the model's geometry: resize to image_size, its channels, patches of patch_size."""
    processor = NeuralInterpreterImageProcessor(
        size={"height": config.image_size, "width": config.image_size},
        patch_size=config.patch_size,
        num_channels=config.num_channels,
    )
    logger.info(
        f"Images are resized to {config.image_size}x{config.image_size}, "
        f"{'RGB' if config.num_channels == 3 else 'grayscale'}, and cut into {config.num_patches} patches of "
        f"{config.patch_size}x{config.patch_size} (--image_size, --num_channels, --patch_size)"
    )
    return processor


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Train and evaluate; return the final metrics (also in <output_dir>/all_results.json)."""
    argv = argv_of(argv)
    model_args, data_args, args = parse_arguments(argv)
    with ExampleRun.start(__file__, argv, args, logger) as run:
        return train_and_evaluate(run, model_args, data_args, args)


def train_and_evaluate(
    run: ExampleRun,
    model_args: ModelArguments,
    data_args: DataArguments,
    args: ImageClassificationTrainingArguments,
) -> dict[str, Any]:
    """Data, model, Trainer, train, evaluate, card, push."""
    compile_for_static_batches(args)
    callbacks = time_limit_callbacks(args.max_train_minutes)
    run.resume_checkpoint()  # a bad --resume_from_checkpoint is refused before the data
    patch = model_args.patch_size or (4 if model_args.model_name_or_path is None else 1)
    raw, tasks = load_data(data_args, args, patch, model_args.cache_dir, model_args.token)
    model = prepare_model(run, model_args, tasks)
    config = model.config
    processor = processor_for(config)
    model_task_ids = [list(config.task_names).index(task.name) for task in tasks]
    for split in raw:
        raw[split].set_transform(ImageClassificationTransform(processor, model_task_ids))
    with args.main_process_first(desc="loading the metric"):
        metric = load_multitask_accuracy(keep_in_memory=True)
    trainer = ImageClassificationTrainer(
        model=model,
        args=args,
        train_dataset=raw["train"] if args.do_train else None,
        eval_dataset=raw["validation"] if args.do_eval else None,
        processing_class=processor,
        compute_metrics=make_compute_metrics(
            [task.name for task in tasks],
            model_task_ids,
            metric,
            num_labels=[task.num_labels for task in tasks],
        ),
        optimizer_cls_and_kwargs=run.optimizer(),
        augmentation=build_augmentation(data_args, processor, args.device, args.do_train),
        callbacks=callbacks,
    )
    train_metrics = run.train(trainer, train_samples=len(raw["train"])) if args.do_train else {}
    eval_metrics = run.evaluate(trainer, eval_samples=len(raw["validation"])) if args.do_eval else {}
    for task in tasks:
        accuracy = eval_metrics.get(f"eval_accuracy_{task.name}")
        if accuracy is not None:
            logger.info(f"Validation accuracy {task.name}: {100 * accuracy:.2f}% ({task.num_eval} images)")
    if args.do_train and run.is_main_process:
        write_card(
            run, model, trainer, model_args, data_args, tasks, train_metrics, eval_metrics, raw["validation"]
        )
    run.finish(trainer, f"Trained with {SCRIPT}")
    return {**train_metrics, **eval_metrics}


def write_card(
    run: ExampleRun,
    model: Any,
    trainer: ImageClassificationTrainer,
    model_args: ModelArguments,
    data_args: DataArguments,
    tasks: list[ImageTask],
    train_metrics: dict[str, Any],
    eval_metrics: dict[str, Any],
    validation: Any,
) -> None:
    """The model card (results and classes per dataset, the command, the hardware) and its routing picture."""
    hub_names = dict(zip([task.name for task in tasks], data_args.dataset_name or [], strict=False))
    infos = [image_task_info(task, eval_metrics, dataset_id=hub_names.get(task.name)) for task in tasks]
    write_image_classification_card(
        run, model, trainer, infos, (train_metrics, eval_metrics), validation,
        draw=isinstance(model, NeuralInterpreterForImageClassification), preset=model_args.preset,
        max_eval_samples=data_args.max_eval_samples, script=SCRIPT, dataset_kind="", recipe_limitations=(),
        eval_split_name="Validation",
    )  # fmt: skip


if __name__ == "__main__":
    main()
