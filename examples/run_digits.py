#!/usr/bin/env python
"""Train a Neural Interpreter (or the paper's multi-task ViT baseline) jointly on several digit datasets.

The same command runs on one CPU, one GPU, or several GPUs / processes (the launcher decides)::

    accelerate launch examples/run_digits.py --output_dir out --push_to_hub --hub_model_id me/ni-digits
    python examples/run_digits.py --dataset_source sklearn --output_dir out/sklearn ...   # offline quickstart

Data (``--dataset_source``):

* ``hub`` (default): the paper's MNIST (``ylecun/mnist``), MNIST-M (``Mike0307/MNIST-M``) and SVHN
  cropped digits (``ufldl-stanford/svhn``, config ``cropped_digits``) from the Hugging Face Hub;
* ``local``: Parquet files or image folders under ``--data_dir`` (``<data_dir>/mnist/train.parquet``,
  ``<data_dir>/mnist_m/test.parquet``, ... ; chosen automatically when ``--data_dir`` is given);
* ``sklearn``: scikit-learn's bundled 8x8 digits (offline, one task ``sklearn_digits``).

Every sample carries its task id; the model has one CLS token and one head per dataset. Images go through
``NeuralInterpreterImageProcessor`` (resize to 32x32 RGB, normalize) in a dataset transform; RandAugment
(timm's operations, batched in torch) is applied to each training batch inside the training step, on the training device, and
the model cuts the images into patches itself. Accuracy per dataset and overall comes from the package's
``evaluate`` metric module (loaded by path, offline); the Trainer gathers predictions from all processes
first, so every evaluation sample is counted once.

``--architecture vit`` trains the multi-task ViT of the paper's Figure 4a instead (``MultiTaskViTConfig``'s
``digits`` preset: 8 layers, d = 192, 3 heads, one CLS token and head per dataset) with the same data,
augmentation, optimizer and schedule; ``--config_overrides`` then sets ``MultiTaskViTConfig`` arguments.

``--do_train false --model_name_or_path DIR`` evaluates a saved model (an ``output_dir`` of this script or a
Hub repo) on the test sets instead: nothing is trained, and no model, checkpoint or model card is saved.

Defaults follow the paper: the ``digits`` preset, RAdam, cosine decay without warm-up from 8e-4 to 1e-6,
batch size 128 (per device), 100 epochs. Everything in ``output_dir`` is what a Hub repo should hold; with
``--push_to_hub`` the folder is uploaded at the end with ``huggingface_hub`` (after everything was saved).
"""

from __future__ import annotations

import logging
import math
import os
import sys
from dataclasses import MISSING, dataclass, field
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import torch
import transformers
from transformers import HfArgumentParser, Trainer, TrainingArguments, set_seed
from transformers.trainer_utils import IntervalStrategy, SaveStrategy, SchedulerType

import ni_hf
from ni_hf import (
    MultiTaskViTConfig,
    MultiTaskViTForImageClassification,
    NeuralInterpreterConfig,
    NeuralInterpreterForImageClassification,
    NeuralInterpreterImageProcessor,
)
from ni_hf.augmentation import TIMM_RANDAUGMENT_POLICY, BatchRandAugment
from ni_hf.configuration_multitask_vit import MULTITASK_VIT_PRESETS
from ni_hf.configuration_neural_interpreter import PAPER_PRESETS, config_argument_names
from ni_hf.configuration_neural_interpreter import parse_config_overrides as _parse_config_overrides
from ni_hf.cpu_allocator import KEEP_FREED_MEMORY_HELP, keep_freed_memory
from ni_hf.cpu_bf16 import native_bf16_hint
from ni_hf.data_transfer import (
    DATALOADER_WORKERS_HELP,
    PIN_MEMORY_HELP,
    STATIC_BATCHES_NOTE,
    apply_gpu_loading_defaults,
    batch_transfer_note,
    compile_for_static_batches,
)
from ni_hf.digits_data import (
    DIGIT_CLASS_NAMES,
    HUB_DATASETS,
    LOCAL_FOLDER_NAMES,
    PAPER_TASKS,
    SKLEARN_TASK,
    SOURCES,
    canonical_task_name,
    load_digits_tasks,
    resolve_dataset_source,
)
from ni_hf.evaluation import CopiedPredictionsMixin, load_multitask_accuracy
from ni_hf.mkl_dispatch import slow_mkl_hint
from ni_hf.model_card import TaskCardInfo, build_digits_model_card, describe_hardware, mixed_precision
from ni_hf.modeling_neural_interpreter import EAGER_FORMULATIONS, set_eager_formulation
from ni_hf.paths import check_model_path
from ni_hf.publishing import explain_push_failure, push_folder, reconstruct_command

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TEMPLATE = REPO_ROOT / "model_cards" / "digits_template.md"
PRETTY_NAMES = {
    "mnist": "MNIST",
    "mnistm": "MNIST-M",
    "svhn": "SVHN (cropped digits)",
    "kmnist": "Kuzushiji-MNIST",
    "fashion_mnist": "Fashion-MNIST",
    SKLEARN_TASK: "scikit-learn digits (8x8)",
}
# Config arguments the script sets from the data: they cannot be overridden.
DATA_DEFINED_CONFIG_KEYS = ("task_names", "num_labels", "id2label", "label2id")
# Config fields that also exist as command-line options of their own (see ModelArguments).
COMMON_CONFIG_FIELDS = (
    "hidden_size",
    "code_dim",
    "num_scripts",
    "num_function_iterations",
    "num_loc_layers",
    "num_functions",
    "num_attention_heads",
    "attention_head_size",
    "type_inference_hidden_size",
    "type_dim",
    "truncation_tau",
    "patch_size",
    "share_task_tokens",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
)
# The options of COMMON_CONFIG_FIELDS that a multi-task ViT has too.
VIT_CONFIG_FIELDS = (
    "hidden_size",
    "num_attention_heads",
    "patch_size",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
)
# The config settings the model card lists, per architecture.
NI_SUMMARY_KEYS = (
    "hidden_size",
    "code_dim",
    "num_scripts",
    "num_function_iterations",
    "num_loc_layers",
    "num_functions",
    "num_attention_heads",
    "attention_head_size",
    "type_inference_depth",
    "type_inference_hidden_size",
    "type_dim",
    "truncation_tau",
    "freeze_signatures",
    "freeze_codes",
    "image_size",
    "patch_size",
    "use_relative_positional_bias",
    "share_task_tokens",
)
VIT_SUMMARY_KEYS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "qkv_bias",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "image_size",
    "patch_size",
)
NI_CARD_TAGS = ("neural-interpreters", "image-classification", "multi-task", "digits", "ni_hf")
VIT_CARD_TAGS = (
    "vit",
    "neural-interpreters-baseline",
    "image-classification",
    "multi-task",
    "digits",
    "ni_hf",
)
# --architecture: the config and model class of each choice, and its presets.
ARCHITECTURES = {
    "neural_interpreter": (NeuralInterpreterConfig, NeuralInterpreterForImageClassification, PAPER_PRESETS),
    "vit": (MultiTaskViTConfig, MultiTaskViTForImageClassification, MULTITASK_VIT_PRESETS),
}


# --------------------------------------------------------------------------------------------------------
# Arguments
# --------------------------------------------------------------------------------------------------------


@dataclass
class ModelArguments:
    """Which model to train: a preset of the paper, optionally changed from the command line."""

    model_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "Evaluate this saved model instead of training a new one: an output_dir of run_digits.py (or "
            "one of its checkpoint-* folders) or a Hub repo id. Needs --do_train false; the checkpoint's config "
            "is used (--architecture and --config_name are ignored, --config_overrides and the config options "
            "below are errors). Default --task_names: the checkpoint's tasks; any subset of them can be given."
        },
    )
    architecture: str = field(
        default="neural_interpreter",
        metadata={
            "help": "The model: 'neural_interpreter' (default) or 'vit', the paper's multi-task ViT baseline "
            "(Figure 4a: one CLS token and head per dataset, same data and training protocol). For 'vit', "
            "--config_overrides sets MultiTaskViTConfig arguments (num_hidden_layers, intermediate_size, ...) and "
            "only --hidden_size, --num_attention_heads, --patch_size and the dropout options of the options below "
            "apply.",
            "choices": sorted(ARCHITECTURES),
        },
    )
    config_name: str = field(
        default="digits",
        metadata={
            "help": "Preset of the paper's appendix tables to start from (the digits preset: hidden size 192, "
            "5 functions, 8 function iterations, tau 1.4, frozen signatures, 4x4 patches; for --architecture vit: "
            "8 layers, hidden size 192, 3 heads, MLP 192, 4x4 patches).",
            "choices": sorted(PAPER_PRESETS),
        },
    )
    config_overrides: str | None = field(
        default=None,
        metadata={
            "help": "Override any NeuralInterpreterConfig setting (MultiTaskViTConfig with --architecture vit) of "
            "the preset, as a comma-separated list of "
            'key=value pairs with JSON values, e.g. "num_functions=6,truncation_tau=1.2,initializer_range=null". '
            "The options below (--hidden_size, ...) are applied after it. task_names and num_labels come from "
            "the data."
        },
    )
    hidden_size: int | None = field(
        default=None, metadata={"help": "Dimension d of every token (preset: 192)."}
    )
    code_dim: int | None = field(
        default=None, metadata={"help": "Dimension of each function's code (preset: 192)."}
    )
    num_scripts: int | None = field(default=None, metadata={"help": "Number of scripts (preset: 1)."})
    num_function_iterations: int | None = field(
        default=None, metadata={"help": "Function iterations per script (preset: 8)."}
    )
    num_loc_layers: int | None = field(
        default=None, metadata={"help": "Lines of code per function (preset: 1)."}
    )
    num_functions: int | None = field(default=None, metadata={"help": "Functions per script (preset: 5)."})
    num_attention_heads: int | None = field(
        default=None, metadata={"help": "Attention heads per LOC (preset: 4)."}
    )
    attention_head_size: int | None = field(
        default=None, metadata={"help": "Query/key features per attention head (preset: 128)."}
    )
    type_inference_hidden_size: int | None = field(
        default=None, metadata={"help": "Width of the type-inference MLP (preset: 192)."}
    )
    type_dim: int | None = field(default=None, metadata={"help": "Dimension of the type space (preset: 24)."})
    truncation_tau: float | None = field(
        default=None,
        metadata={"help": "Truncation threshold tau of the type-matching kernel, in [0, 2) (preset: 1.4)."},
    )
    patch_size: int | None = field(
        default=None,
        metadata={
            "help": "Patch side length in pixels; must divide the image size 32 (preset: 4, 64 patches)."
        },
    )
    share_task_tokens: bool | None = field(
        default=None,
        metadata={
            "help": "Share one CLS token and head between all datasets (the reference code) instead of one each."
        },
    )
    hidden_dropout_prob: float | None = field(
        default=None, metadata={"help": "Dropout on LOC outputs (preset: 0)."}
    )
    attention_probs_dropout_prob: float | None = field(
        default=None, metadata={"help": "Dropout on attention weights (preset: 0)."}
    )
    attn_implementation: str | None = field(
        default=None,
        metadata={
            "help": "Attention kernel: 'sdpa' (default, torch scaled_dot_product_attention) or 'eager' (literal Eq. 6).",
            "choices": ["sdpa", "eager"],
        },
    )
    eager_formulation: str = field(
        default="literal",
        metadata={
            "help": "How the 'eager' attention path forms Eq. 6, which a Neural Interpreter compiled on a GPU runs "
            "(with 'sdpa' too): 'literal' (default), or 'fused', 'bilinear', 'columns', 'bilinear-columns': the "
            "same function with fewer bytes per compiled step (GPU experiments, not yet timed on a GPU; "
            "benchmarks/SPEED.md). With 'sdpa', no effect unless compiled on a GPU. Not saved with the model.",
            "choices": list(EAGER_FORMULATIONS),
        },
    )
    token_alignment: int = field(
        default=1,
        metadata={
            "help": "Pad the tokens of the 'eager' attention path to a multiple of this (8: 16-byte bf16 rows for "
            "GPU GEMMs); the same function, a GPU experiment. Not saved with the model."
        },
    )
    model_card_template: str = field(
        default=str(DEFAULT_TEMPLATE),
        metadata={"help": "Jinja template of the model card written to <output_dir>/README.md."},
    )


@dataclass
class DataArguments:
    """Which datasets to train and evaluate on, and how to augment them."""

    dataset_source: str | None = field(
        default=None,
        metadata={
            "help": "Where the data comes from: 'hub' (Hugging Face Hub: "
            + ", ".join(
                f"{task} = {spec.repo_id}" for task, spec in HUB_DATASETS.items() if task in PAPER_TASKS
            )
            + " (config cropped_digits)), 'local' (Parquet files or image folders under --data_dir) or 'sklearn' "
            "(scikit-learn's bundled 8x8 digits, offline: one task, sklearn_digits, 1437 train / 360 test). "
            "Default: 'local' if --data_dir is given, else 'hub'.",
            "choices": list(SOURCES),
        },
    )
    task_names: list[str] | None = field(
        default=None,
        metadata={
            "help": "Datasets to train on together, one CLS token and head each, in this order. Known: "
            f"{', '.join(HUB_DATASETS)} (hub/local) and {SKLEARN_TASK} (sklearn). Default: the paper's "
            f"{' '.join(PAPER_TASKS)} for the Hub; those of them found under --data_dir for 'local'; "
            f"{SKLEARN_TASK} for 'sklearn'."
        },
    )
    data_dir: str | None = field(
        default=None,
        metadata={
            "help": "Only for --dataset_source local, which it selects when --dataset_source is not given (with "
            "'hub' or 'sklearn' it is an error). Folder holding one sub-folder per dataset in the Hub Parquet "
            "layout, e.g. "
            "<data_dir>/mnist/{train,test}.parquet and <data_dir>/mnist_m/{train,test}.parquet (columns image, "
            "label), or image folders <data_dir>/<task>/{train,test}/<label>/*.png. Folder names: "
            + "; ".join(f"{task}: {'/'.join(names)}" for task, names in LOCAL_FOLDER_NAMES.items())
        },
    )
    max_train_samples: int | None = field(
        default=None,
        metadata={"help": "Use at most this many training samples per dataset (a seeded random subset)."},
    )
    max_eval_samples: int | None = field(
        default=None,
        metadata={"help": "Evaluate on at most this many test samples per dataset (a seeded random subset)."},
    )
    randaugment: bool = field(
        default=True,
        metadata={
            "help": "Augment training batches with RandAugment (timm's operations, batched, on the training device). "
            "Pass --randaugment false to switch it off."
        },
    )
    randaugment_where: str = field(
        default="auto",
        metadata={
            "help": "Where RandAugment runs: 'device' (the training device, in the training step), 'workers' (the "
            "DataLoader worker processes, on the CPU, overlapping the training steps) or 'auto' (workers when "
            "--dataloader_num_workers > 0, else the device). On a GPU a batch's augmentation is ~1,900 small "
            "operations, each a kernel launch; in the workers it leaves the GPU's step alone.",
            "choices": ["auto", "device", "workers"],
        },
    )
    randaugment_num_ops: int = field(
        default=2, metadata={"help": "RandAugment: operations applied to each image (n)."}
    )
    randaugment_magnitude: float = field(
        default=9.0,
        metadata={
            "help": "RandAugment magnitude m on timm's scale [0, 10]: each operation at m/10 of its range "
            "(timm's rand-m9)."
        },
    )
    randaugment_operations: list[str] | None = field(
        default=None,
        metadata={
            "help": "RandAugment: the operations to draw from (default: all of timm's: "
            + " ".join(name for name, _, _ in TIMM_RANDAUGMENT_POLICY)
            + ")."
        },
    )
    randaugment_probability: float = field(
        default=0.5,
        metadata={"help": "RandAugment: probability that an image's drawn operation is applied (timm: 0.5)."},
    )


@dataclass
class DigitsTrainingArguments(TrainingArguments):
    """TrainingArguments with the paper's recipe as defaults (every field can still be set on the command line)."""

    do_train: bool = field(
        default=True,
        metadata={
            "help": "Train (default: true). --do_train false trains nothing and saves no model, checkpoint or "
            "model card: it evaluates the saved model of --model_name_or_path (required) and writes only "
            "eval_results.json and all_results.json to --output_dir, which must not hold a saved model."
        },
    )
    do_eval: bool = field(
        default=True, metadata={"help": "Evaluate on the test sets after training (default: true)."}
    )
    radam: bool = field(
        default=True,
        metadata={
            "help": "Optimize with torch.optim.RAdam (the paper's optimizer; uses --learning_rate, --adam_beta1, "
            "--adam_beta2, --adam_epsilon, --weight_decay). --radam false uses the optimizer named by --optim; "
            "setting --optim while this is true is an error."
        },
    )
    keep_freed_memory: bool = field(default=False, metadata={"help": KEEP_FREED_MEMORY_HELP})
    learning_rate: float = field(default=8e-4, metadata={"help": "Peak learning rate (paper: 8e-4)."})
    lr_scheduler_type: SchedulerType | str = field(
        default="cosine_with_min_lr",
        metadata={
            "help": "Learning-rate schedule (paper: cosine decay to --lr_scheduler_kwargs min_lr, no warm-up)."
        },
    )
    lr_scheduler_kwargs: dict | str | None = field(
        default_factory=lambda: {"min_lr": 1e-6},
        metadata={"help": "Extra scheduler arguments as JSON (paper: '{\"min_lr\": 1e-6}')."},
    )
    warmup_steps: float = field(default=0, metadata={"help": "Linear warm-up steps (paper: none)."})
    per_device_train_batch_size: int = field(
        default=128,
        metadata={
            "help": "Training batch size per process (paper: 128 in total; on N processes pass 128/N to keep it)."
        },
    )
    per_device_eval_batch_size: int = field(
        default=256, metadata={"help": "Evaluation batch size per process."}
    )
    num_train_epochs: float = field(default=100.0, metadata={"help": "Training epochs (paper: 100)."})
    eval_strategy: IntervalStrategy | str = field(
        default="epoch", metadata={"help": "When to evaluate during training: 'no', 'steps' or 'epoch'."}
    )
    save_strategy: SaveStrategy | str = field(
        default="epoch", metadata={"help": "When to save a checkpoint: 'no', 'steps', 'epoch' or 'best'."}
    )
    save_total_limit: int | None = field(default=2, metadata={"help": "Keep at most this many checkpoints."})
    logging_steps: float = field(
        default=50, metadata={"help": "Log the training loss every this many steps."}
    )
    logging_nan_inf_filter: bool = field(
        default=False,
        metadata={
            "help": "Replace a NaN or inf training loss by the running mean in the logged loss (transformers' "
            "default: true). False here: a NaN shows in the log instead of being averaged away, and the check, a "
            "device-to-host sync at every step, no longer stalls a GPU."
        },
    )
    remove_unused_columns: bool = field(
        default=False,
        metadata={"help": "Must stay false: the images are preprocessed on the fly by a dataset transform."},
    )
    label_names: list[str] | None = field(
        default_factory=lambda: ["labels", "task_ids"],
        metadata={"help": "Inputs the metrics receive as labels: the class and the task id of every sample."},
    )

    dataloader_num_workers: int | None = field(default=None, metadata={"help": DATALOADER_WORKERS_HELP})
    dataloader_pin_memory: bool = field(default=torch.cuda.is_available(), metadata={"help": PIN_MEMORY_HELP})

    def __post_init__(self) -> None:
        # before transformers turns accelerator_config into an AcceleratorConfig
        apply_gpu_loading_defaults(self)
        super().__post_init__()


# --------------------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------------------


def parse_config_overrides(overrides: str | None, architecture: str = "neural_interpreter") -> dict[str, Any]:
    """--config_overrides as a dict; the data-defined settings (task names, labels) cannot be overridden."""
    config_class = ARCHITECTURES[architecture][0]
    return _parse_config_overrides(overrides, reserved=DATA_DEFINED_CONFIG_KEYS, config_class=config_class)


def check_eager_formulation(model_args: ModelArguments, architecture: str) -> None:
    """--eager_formulation and --token_alignment: valid, and given only for a Neural Interpreter."""
    if model_args.token_alignment < 1:
        raise ValueError(
            f"--token_alignment must be a positive number of tokens, got {model_args.token_alignment}."
        )
    if architecture == "vit" and (
        model_args.eager_formulation != "literal" or model_args.token_alignment != 1
    ):
        raise ValueError(
            "--eager_formulation and --token_alignment choose how a Neural Interpreter forms Eq. 6; a vit model "
            "has no Eq. 6."
        )


def build_config(
    model_args: ModelArguments, task_names: list[str]
) -> NeuralInterpreterConfig | MultiTaskViTConfig:
    """The preset, then --config_overrides, then the individual options; task names and labels from the data."""
    if model_args.architecture not in ARCHITECTURES:
        raise ValueError(
            f"--architecture must be one of {sorted(ARCHITECTURES)}, got {model_args.architecture!r}."
        )
    config_class, _, presets = ARCHITECTURES[model_args.architecture]
    if model_args.config_name not in presets:
        raise ValueError(
            f"--config_name {model_args.config_name!r} has no --architecture {model_args.architecture} preset; "
            f"expected one of {sorted(presets)}."
        )
    overrides = parse_config_overrides(model_args.config_overrides, model_args.architecture)
    options = VIT_CONFIG_FIELDS if model_args.architecture == "vit" else COMMON_CONFIG_FIELDS
    unused = [
        f"--{name}"
        for name in COMMON_CONFIG_FIELDS
        if name not in options and getattr(model_args, name) is not None
    ]
    if unused:
        raise ValueError(
            f"{', '.join(unused)}: Neural Interpreter settings, which --architecture {model_args.architecture} "
            "does not have."
        )
    check_eager_formulation(model_args, model_args.architecture)
    for name in options:
        value = getattr(model_args, name)
        if value is not None:
            if name in overrides and overrides[name] != value:
                logger.warning(f"--{name}={value} replaces {name}={overrides[name]} of --config_overrides.")
            overrides[name] = value
    config = config_class.from_paper(
        model_args.config_name,
        **overrides,
        task_names=task_names,
        num_labels=len(DIGIT_CLASS_NAMES),
        id2label=dict(enumerate(DIGIT_CLASS_NAMES)),
        label2id={name: i for i, name in enumerate(DIGIT_CLASS_NAMES)},
    )
    if model_args.attn_implementation is not None:
        config._attn_implementation = model_args.attn_implementation
    changed = {k: v for k, v in overrides.items() if presets[model_args.config_name].get(k) != v}
    logger.info(
        f"Model config: {model_args.architecture} preset {model_args.config_name!r} with changes {changed or 'none'}"
    )
    return config


def load_checkpoint_config(
    model_args: ModelArguments,
) -> tuple[str, NeuralInterpreterConfig | MultiTaskViTConfig]:
    """The architecture and config of the saved model of --model_name_or_path (no weights loaded yet)."""
    path = model_args.model_name_or_path
    assert path is not None
    config_dict, _ = transformers.PretrainedConfig.get_config_dict(path)
    model_type = config_dict.get("model_type")
    by_type = {classes[0].model_type: name for name, classes in ARCHITECTURES.items()}
    if model_type not in by_type:
        raise ValueError(
            f"--model_name_or_path {path} holds a model of type {model_type!r}; expected a run_digits.py model, "
            f"one of {sorted(by_type)}."
        )
    architecture = by_type[model_type]
    if model_args.architecture not in (argument_default(ModelArguments, "architecture"), architecture):
        raise ValueError(
            f"--architecture {model_args.architecture}: --model_name_or_path {path} is a {architecture} model."
        )
    check_eager_formulation(model_args, architecture)
    config = ARCHITECTURES[architecture][0].from_pretrained(path)
    if model_args.attn_implementation is not None:
        config._attn_implementation = model_args.attn_implementation
    logger.info(
        f"Evaluating the saved {architecture} model {path} (tasks {', '.join(config.task_names)}); its config "
        "is used as saved."
    )
    return architecture, config


# --------------------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------------------


def resolve_data_arguments(
    data_args: DataArguments, default_tasks: list[str] | None = None
) -> tuple[str, list[str]]:
    """The data source and the (canonical) task names to load, with the documented defaults filled in.

    ``default_tasks`` replaces the source's default task list (a saved model's tasks, for evaluating it).
    """
    source = resolve_dataset_source(data_args.dataset_source, data_args.data_dir)
    if data_args.task_names:
        # Accept "--task_names mnist,mnistm" as well as "--task_names mnist mnistm".
        names = [name for item in data_args.task_names for name in item.split(",") if name.strip()]
        return source, [canonical_task_name(name) for name in names]
    if default_tasks is not None:
        return source, list(default_tasks)
    if source == "sklearn":
        return source, [SKLEARN_TASK]
    if source == "local":
        root = Path(data_args.data_dir).expanduser()
        found = [task for task in PAPER_TASKS if any((root / f).is_dir() for f in LOCAL_FOLDER_NAMES[task])]
        if not found:
            raise FileNotFoundError(
                f"None of the paper's datasets ({', '.join(PAPER_TASKS)}) found under {root}; expected folders "
                f"such as {root / 'mnist'} holding train.parquet and test.parquet, or pass --task_names."
            )
        missing = [task for task in PAPER_TASKS if task not in found]
        if missing:
            logger.warning(f"Not found under {root}, trained without: {', '.join(missing)}")
        return source, found
    return source, list(PAPER_TASKS)


@dataclass
class DigitsTransform:
    """Dataset transform: PIL images -> normalized (3, H, W) float arrays, labels and task ids.

    ``model_task_ids[i]``: the model's task id of the data's task ``i`` (a saved model evaluated on some of its
    tasks, or in another order); default: the same ids. ``augmentation``: applied to the batch here, i.e. in the
    DataLoader's worker processes (``--randaugment_where workers``). A class at module level, not a closure, so that
    workers started by spawn or forkserver (macOS, Windows, and Linux from Python 3.14 on) can unpickle it.
    """

    processor: NeuralInterpreterImageProcessor
    model_task_ids: list[int] | None = None
    augmentation: BatchRandAugment | None = None

    def __call__(self, batch: dict[str, list[Any]]) -> dict[str, Any]:
        pixel_values = self.processor(images=batch["image"], do_patchify=False)["pixel_values"]
        if self.augmentation is not None:
            with torch.no_grad():
                pixel_values = self.augmentation(
                    torch.from_numpy(np.stack(pixel_values).astype(np.float32))
                ).numpy()
        task_ids = [int(task_id) for task_id in batch["task_id"]]
        if self.model_task_ids is not None:
            task_ids = [self.model_task_ids[task_id] for task_id in task_ids]
        return {
            "pixel_values": [np.asarray(image, dtype=np.float32) for image in pixel_values],
            "labels": [int(label) for label in batch["label"]],
            "task_ids": task_ids,
        }


def randaugment_in_workers(where: str, num_workers: int) -> bool:
    """Whether RandAugment runs in the DataLoader workers (``--randaugment_where``): 'auto' when there are any."""
    if where not in ("auto", "device", "workers"):
        raise ValueError(f"--randaugment_where must be auto, device or workers, got {where!r}.")
    if where == "workers" and num_workers < 1:
        raise ValueError(
            "--randaugment_where workers needs DataLoader worker processes: pass --dataloader_num_workers N (N >= 1), "
            "or --randaugment_where device."
        )
    return where == "workers" or (where == "auto" and num_workers > 0)


def final_evaluation_done(trainer: Trainer) -> dict[str, float] | None:
    """The metrics of an evaluation the Trainer ran at the last training step, if it did (e.g. the last epoch's).

    Evaluating the same weights again would give the same numbers; not with --load_best_model_at_end, which
    loads other weights after training.
    """
    if trainer.args.load_best_model_at_end or not trainer.args.do_train:
        return None
    for entry in reversed(trainer.state.log_history):
        if "eval_accuracy" in entry:
            if entry.get("step") != trainer.state.global_step:
                return None
            logger.info(f"The evaluation at the last step ({entry['step']}) is the final one: not run again")
            return {key: value for key, value in entry.items() if key.startswith("eval_") or key == "epoch"}
    return None


def select_randaugment_policy(names: list[str] | None) -> list[tuple[str, float, float]] | None:
    """The RandAugment operations named on the command line (None: all of timm's)."""
    if not names:
        return None
    names = [name for item in names for name in item.split(",") if name.strip()]
    known = {entry[0]: entry for entry in TIMM_RANDAUGMENT_POLICY}
    unknown = [name for name in names if name not in known]
    if unknown:
        raise ValueError(f"--randaugment_operations: unknown {unknown}; choose from {list(known)}.")
    return [known[name] for name in names]


def task_sizes(dataset: datasets.Dataset, task_names: list[str]) -> list[int]:
    """Number of rows of each task in a split."""
    counts = np.bincount(np.asarray(dataset.with_format(None)["task_id"]), minlength=len(task_names))
    return [int(c) for c in counts]


# --------------------------------------------------------------------------------------------------------
# Metrics and Trainer
# --------------------------------------------------------------------------------------------------------


def make_compute_metrics(metric: Any, task_names: list[str], model_task_ids: list[int] | None = None):
    """compute_metrics for the Trainer: the evaluate metric per task and overall, plus per-task sample counts.

    The Trainer calls it with the predictions of all processes gathered (and the samples that padded the
    last batches dropped), so the counts prove that every evaluation sample was counted exactly once.
    ``model_task_ids``: as in :class:`DigitsTransform`; the task ids the metric receives are mapped back to
    ``task_names``.
    """
    to_data = None
    if model_task_ids is not None:
        to_data = np.zeros(max(model_task_ids) + 1, dtype=np.int64)
        to_data[model_task_ids] = np.arange(len(model_task_ids))

    def compute_metrics(eval_pred: transformers.EvalPrediction) -> dict[str, float]:
        logits = (
            eval_pred.predictions[0] if isinstance(eval_pred.predictions, tuple) else eval_pred.predictions
        )
        predictions = np.asarray(logits).argmax(axis=-1)
        labels, task_ids = (np.asarray(x).reshape(-1) for x in eval_pred.label_ids)
        if to_data is not None:
            task_ids = to_data[task_ids]
        results = metric.compute(
            predictions=predictions.tolist(),
            references=labels.tolist(),
            task_ids=task_ids.tolist(),
            task_names=task_names,
        )
        results["num_samples"] = len(labels)
        for task_id, name in enumerate(task_names):
            results[f"num_samples_{name}"] = int((task_ids == task_id).sum())
        return results

    return compute_metrics


class DigitsTrainer(CopiedPredictionsMixin, Trainer):
    """Trainer that applies a batched augmentation to the training inputs, on the training device (and whose
    predictions survive a CUDA-graphed model)."""

    def __init__(self, *args: Any, augmentation: torch.nn.Module | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.augmentation = augmentation

    def training_step(
        self,
        model: torch.nn.Module,
        inputs: dict[str, torch.Tensor | Any],
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> torch.Tensor:
        """Augment ``pixel_values`` (RandAugment) once the batch is on the device, then train as usual."""
        if self.augmentation is not None:
            inputs = self._prepare_inputs(inputs)
            with torch.no_grad():
                inputs["pixel_values"] = self.augmentation(inputs["pixel_values"])
        return super().training_step(model, inputs, num_items_in_batch)


# --------------------------------------------------------------------------------------------------------
# Model card and Hub
# --------------------------------------------------------------------------------------------------------


def write_model_card(
    *,
    output_dir: str,
    model_name: str,
    repo_id: str,
    template: str,
    config: NeuralInterpreterConfig,
    model: torch.nn.Module,
    source: str,
    data_dir: str | None,
    task_names: list[str],
    train_counts: list[int] | None,
    eval_counts: list[int] | None,
    eval_metrics: dict[str, float],
    train_metrics: dict[str, float],
    training_args: DigitsTrainingArguments,
    data_args: DataArguments,
    argv: list[str],
) -> Path:
    """Render model_cards/digits_template.md with the measured numbers into <output_dir>/README.md."""
    tasks = []
    hub_ids = []
    for i, name in enumerate(task_names):
        spec = HUB_DATASETS.get(name)
        if source == "hub" and spec is not None:
            dataset_id, config_name, origin = spec.repo_id, spec.config, f"Hub: `{spec.repo_id}`"
            hub_ids.append(spec.repo_id)
        elif source == "sklearn":
            dataset_id, config_name = name, None
            origin = "scikit-learn `load_digits` (stratified 80/20 split, seed 0)"
        else:
            dataset_id, config_name, origin = name, None, f"local files under `{data_dir}`"
        accuracy = eval_metrics.get(f"eval_accuracy_{name}")
        tasks.append(
            TaskCardInfo(
                name=name,
                dataset_id=dataset_id,
                pretty_name=PRETTY_NAMES.get(name, name),
                source=origin,
                train_samples=train_counts[i] if train_counts else None,
                eval_samples=int(eval_metrics[f"eval_num_samples_{name}"])
                if f"eval_num_samples_{name}" in eval_metrics
                else (eval_counts[i] if eval_counts else None),
                accuracy=accuracy,
                dataset_config=config_name,
            )
        )
    world_size = training_args.world_size
    command, launcher_note = reconstruct_command(__file__, argv, world_size)
    mixed = mixed_precision(training_args)
    hyperparameters = {
        "optimizer": "RAdam (torch.optim.RAdam)"
        if training_args.radam
        else str(getattr(training_args.optim, "value", training_args.optim)),
        "betas, epsilon": f"({training_args.adam_beta1}, {training_args.adam_beta2}), {training_args.adam_epsilon}",
        "weight decay": training_args.weight_decay,
        "learning rate": f"{training_args.learning_rate:g}",
        "schedule": f"{getattr(training_args.lr_scheduler_type, 'value', training_args.lr_scheduler_type)} "
        f"{training_args.lr_scheduler_kwargs or ''}, "
        f"warm-up steps {training_args.warmup_steps}",
        "batch size (global)": training_args.per_device_train_batch_size
        * world_size
        * training_args.gradient_accumulation_steps,
        "epochs": f"{train_metrics.get('epoch', training_args.num_train_epochs):g}",
        "optimizer steps": train_metrics.get("global_step", "-"),
        "seed": training_args.seed,
        "processes": world_size,
        "mixed precision": mixed,
    }
    architecture = "vit" if isinstance(config, MultiTaskViTConfig) else "neural_interpreter"
    summary_keys = VIT_SUMMARY_KEYS if architecture == "vit" else NI_SUMMARY_KEYS
    config_summary = {key: getattr(config, key) for key in summary_keys}
    subsets = []
    if data_args.max_eval_samples is not None:
        subsets.append(
            f"at most {data_args.max_eval_samples} test samples per dataset (a seeded random subset)"
        )
    eval_subset_note = (
        f"Evaluated on {subsets[0]}, not the full test sets: the accuracies are estimates with a sampling error."
        if subsets
        else ""
    )
    recipe_note = _recipe_note(
        source=source,
        data_dir=data_dir,
        task_names=task_names,
        config=config,
        data_args=data_args,
        train_metrics=train_metrics,
        args=training_args,
    )
    extra = []
    if source == "sklearn":
        extra.append(
            "scikit-learn's digits are 8x8 images upsampled to 32x32: a quick check of the pipeline, not a "
            "benchmark; the model was not evaluated on any other digit data set."
        )
    runtime = train_metrics.get("train_runtime")
    card = build_digits_model_card(
        template_path=template,
        model_name=model_name,
        tasks=tasks,
        overall_accuracy=eval_metrics.get("eval_accuracy"),
        hub_datasets=hub_ids,
        repo_id=repo_id,
        config=config,
        eval_samples_total=int(eval_metrics.get("eval_num_samples", 0)),
        eval_subset_note=eval_subset_note,
        randaugment=(
            f"n={data_args.randaugment_num_ops}, m={data_args.randaugment_magnitude:g} on timm's 0-10 scale, "
            f"each operation applied with probability {data_args.randaugment_probability:g}, drawn per image from "
            + (", ".join(data_args.randaugment_operations or []) or "timm's 15 operations")
            + (
                "; in the DataLoader's worker processes, on the CPU"
                if randaugment_in_workers(data_args.randaugment_where, training_args.dataloader_num_workers)
                else "; inside the training step, on the training device"
            )
            if data_args.randaugment
            else None
        ),
        training_command=command,
        launcher_note=launcher_note,
        hyperparameters=hyperparameters,
        config_summary=config_summary,
        architecture=architecture,
        model_class=type(model).__name__,
        tags=VIT_CARD_TAGS if architecture == "vit" else NI_CARD_TAGS,
        num_parameters=f"{sum(p.numel() for p in model.parameters()):,}",
        num_trainable_parameters=f"{sum(p.numel() for p in model.parameters() if p.requires_grad):,}",
        hardware=describe_hardware(str(training_args.device), world_size, mixed),
        train_runtime=f"{runtime:.0f} s" if runtime is not None else "not trained in this run",
        transformers_version=transformers.__version__,
        ni_hf_version=ni_hf.__version__,
        recipe_note=recipe_note,
        extra_limitations=extra,
    )
    path = Path(output_dir) / "README.md"
    card.save(path)
    return path


def argument_default(cls: type, name: str) -> Any:
    """The default of a field of an argument dataclass (for this script's options: the paper's recipe)."""
    spec = cls.__dataclass_fields__[name]
    return spec.default_factory() if spec.default is MISSING else spec.default


def _recipe_note(
    *,
    source: str,
    data_dir: str | None,
    task_names: list[str],
    config: NeuralInterpreterConfig | MultiTaskViTConfig,
    data_args: DataArguments,
    train_metrics: dict[str, float],
    args: DigitsTrainingArguments,
) -> str:
    """The card's sentence on the paper's recipe: that this run followed it (in everything the card lists), or
    every deviation from it (the recipe's values: the defaults of the argument dataclasses)."""
    deviations = []

    def differs(what: str, value: Any, recipe: Any, text: str | None = None, recipe_text: str | None = None):
        if value != recipe:
            deviations.append(f"{what} {text or value} (recipe {recipe_text or recipe})")

    architecture = "vit" if isinstance(config, MultiTaskViTConfig) else "neural_interpreter"
    differs("architecture", architecture, argument_default(ModelArguments, "architecture"))
    differs("datasets", list(task_names), PAPER_TASKS, ", ".join(task_names), ", ".join(PAPER_TASKS))
    if source != "hub":
        where = f"local files under {data_dir}" if source == "local" else "scikit-learn's bundled 8x8 digits"
        hub_ids = ", ".join(HUB_DATASETS[task].repo_id for task in PAPER_TASKS)
        deviations.append(f"data from {where} (recipe: the Hub datasets {hub_ids})")
    if data_args.max_train_samples is not None:
        deviations.append(
            f"at most {data_args.max_train_samples} training images per dataset (recipe: the full training sets)"
        )

    preset = argument_default(ModelArguments, "config_name")
    reference = type(config).from_paper(
        preset,
        task_names=list(config.task_names),
        num_labels=config.num_labels,
        id2label=config.id2label,
        label2id=config.label2id,
    )
    # The model's own settings only: not what every config carries (auto_map, use_cache, versions, ...).
    settings = config_argument_names(type(config)) - {"task_names", "default_task"}
    ours, theirs = config.to_dict(), reference.to_dict()
    changed = [
        f"{key}={ours.get(key)!r} (recipe {theirs.get(key)!r})"
        for key in sorted(settings)
        if ours.get(key) != theirs.get(key)
    ]
    if changed:
        deviations.append(f"config (the {preset} preset changed): {', '.join(changed)}")

    def recipe(name: str) -> Any:
        return argument_default(DigitsTrainingArguments, name)

    optimizer = "RAdam" if args.radam else str(getattr(args.optim, "value", args.optim))
    differs("optimizer", optimizer, "RAdam")
    differs("betas", (args.adam_beta1, args.adam_beta2), (recipe("adam_beta1"), recipe("adam_beta2")))
    differs("epsilon", args.adam_epsilon, recipe("adam_epsilon"))
    differs("weight decay", args.weight_decay, recipe("weight_decay"))
    recipe_lr = recipe("learning_rate")
    differs("learning rate", args.learning_rate, recipe_lr, f"{args.learning_rate:g}", f"{recipe_lr:g}")
    differs(
        "schedule",
        str(getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type)),
        recipe("lr_scheduler_type"),
    )
    differs("schedule arguments", args.lr_scheduler_kwargs, recipe("lr_scheduler_kwargs"))
    differs("warm-up steps", args.warmup_steps, recipe("warmup_steps"))
    batch = args.per_device_train_batch_size * args.world_size * args.gradient_accumulation_steps
    # The recipe's batch is global (the paper's 128); the per-device default is it on one process.
    differs("global batch size", batch, recipe("per_device_train_batch_size"))
    recipe_epochs = recipe("num_train_epochs")
    if not train_metrics:
        deviations.append(f"no training in this run (recipe: {recipe_epochs:g} epochs)")
    else:
        epochs = train_metrics.get("epoch", args.num_train_epochs)
        differs("epochs", epochs, recipe_epochs, f"{epochs:g}", f"{recipe_epochs:g}")

    recipe_augment = (
        f"RandAugment n={argument_default(DataArguments, 'randaugment_num_ops')}, "
        f"m={argument_default(DataArguments, 'randaugment_magnitude'):g}, "
        f"p={argument_default(DataArguments, 'randaugment_probability'):g}, all of timm's operations"
    )
    if not data_args.randaugment:
        deviations.append(f"no augmentation (recipe: {recipe_augment})")
    else:
        policy = select_randaugment_policy(data_args.randaugment_operations)
        operations = [name for name, _, _ in policy or TIMM_RANDAUGMENT_POLICY]
        augment = (
            f"RandAugment n={data_args.randaugment_num_ops}, m={data_args.randaugment_magnitude:g}, "
            f"p={data_args.randaugment_probability:g}, "
            + (
                "all of timm's operations"
                if sorted(operations) == sorted(name for name, _, _ in TIMM_RANDAUGMENT_POLICY)
                else "operations " + " ".join(operations)
            )
        )
        if augment != recipe_augment:
            deviations.append(f"augmentation {augment} (recipe: {recipe_augment})")

    if not deviations:
        return "This run followed that recipe."
    return "This run deviates from that recipe: " + "; ".join(deviations) + "."


# --------------------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------------------


def parse_arguments(argv: list[str]) -> tuple[ModelArguments, DataArguments, DigitsTrainingArguments]:
    """Parse the command line (or a single .json file of arguments) into the three dataclasses."""
    parser = HfArgumentParser((ModelArguments, DataArguments, DigitsTrainingArguments))
    if len(argv) == 1 and argv[0].endswith(".json"):
        return parser.parse_json_file(json_file=os.path.abspath(argv[0]))
    return parser.parse_args_into_dataclasses(args=argv)


def check_arguments(
    model_args: ModelArguments, data_args: DataArguments, training_args: DigitsTrainingArguments
) -> None:
    """Refuse contradictory or ineffective options before anything is loaded."""
    if training_args.do_train and not Path(model_args.model_card_template).is_file():
        raise ValueError(
            f"--model_card_template {model_args.model_card_template} does not exist: pass the path of "
            "model_cards/digits_template.md from the ni_hf repository."
        )
    optim = str(getattr(training_args.optim, "value", training_args.optim))
    default_optim = argument_default(TrainingArguments, "optim")
    default_optim = str(getattr(default_optim, "value", default_optim))
    if training_args.radam and optim != default_optim:
        raise ValueError(
            f"--optim {optim} with --radam true: RAdam would be used and --optim ignored. Pass --radam false to "
            f"train with --optim {optim}, or leave --optim at its default ({default_optim}) to train with RAdam."
        )
    resolve_dataset_source(data_args.dataset_source, data_args.data_dir)
    select_randaugment_policy(data_args.randaugment_operations)
    randaugment_in_workers(data_args.randaugment_where, training_args.dataloader_num_workers)

    path = model_args.model_name_or_path
    if path is not None:
        if training_args.do_train:
            raise ValueError(
                f"--model_name_or_path {path} evaluates a saved model and needs --do_train false; got --do_train "
                "true. To continue an interrupted training run, use --resume_from_checkpoint."
            )
        options = ["--config_overrides"] if model_args.config_overrides is not None else []
        options += [f"--{name}" for name in COMMON_CONFIG_FIELDS if getattr(model_args, name) is not None]
        if options:
            raise ValueError(
                f"{', '.join(options)}: settings of a new model; with --model_name_or_path the saved model's "
                "config is used as it is."
            )
        model_args.model_name_or_path = check_model_path(path)
    if training_args.do_train:
        return
    if path is None:
        raise ValueError(
            "--do_train false evaluates a saved model and needs --model_name_or_path (an output_dir of this "
            "script or a Hub repo id); got none. Nothing is trained or saved with --do_train false."
        )
    if not training_args.do_eval:
        raise ValueError("--do_train false with --do_eval false: nothing to do; pass --do_eval true.")
    if training_args.push_to_hub:
        raise ValueError(
            "--push_to_hub with --do_train false: nothing is trained or saved, so there is nothing to upload."
        )
    if training_args.resume_from_checkpoint:
        raise ValueError(
            f"--resume_from_checkpoint {training_args.resume_from_checkpoint} with --do_train false: resuming "
            "continues training; to evaluate a checkpoint, pass it as --model_name_or_path."
        )
    output_dir = Path(training_args.output_dir)
    saved = [
        name for name in ("config.json", "model.safetensors", "README.md") if (output_dir / name).exists()
    ]
    if saved:
        raise ValueError(
            f"--output_dir {output_dir} holds a saved model ({', '.join(saved)}); --do_train false writes "
            "eval_results.json and all_results.json there, which would replace that run's: pass an --output_dir "
            "of its own."
        )


def setup_logging(training_args: TrainingArguments) -> None:
    """Log like the transformers examples: INFO on the main process, warnings on the others."""
    logging.basicConfig(
        format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
        datefmt="%m/%d/%Y %H:%M:%S",
        handlers=[logging.StreamHandler(sys.stdout)],
    )
    if training_args.should_log:
        transformers.utils.logging.set_verbosity_info()
    log_level = training_args.get_process_log_level()
    logger.setLevel(log_level)
    datasets.utils.logging.set_verbosity(log_level)
    transformers.utils.logging.set_verbosity(log_level)
    transformers.utils.logging.enable_default_handler()
    transformers.utils.logging.enable_explicit_format()


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Train and evaluate; return the final metrics (also in <output_dir>/all_results.json)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    model_args, data_args, training_args = parse_arguments(argv)
    check_arguments(model_args, data_args, training_args)
    push_to_hub = training_args.push_to_hub
    # The upload happens at the very end, after everything was saved locally: keep the Trainer from
    # creating the repo at start-up and from regenerating README.md with its own card.
    training_args.push_to_hub = False
    setup_logging(training_args)

    world_size = training_args.world_size
    logger.warning(
        f"Process {training_args.process_index} of world size {world_size}: device {training_args.device}, "
        f"distributed {training_args.parallel_mode.value}, mixed precision "
        f"{'bf16' if training_args.bf16 else 'fp16' if training_args.fp16 else 'no'}"
    )
    if training_args.device.type == "cuda" and (training_args.bf16 or training_args.torch_compile):
        logger.warning(
            "On an H200 with torch 2.11 (2026-11-26), bf16 torch.compile gave logits up to 1.1 away from eager's; "
            "float32 eager is the GPU execution verified against the CPU. `python benchmarks/diagnose_compile.py "
            "--device cuda` says which execution departs from float32 on this machine (benchmarks/RESULTS.md)."
        )
    repo_id = training_args.hub_model_id or Path(training_args.output_dir).absolute().name
    if push_to_hub:
        from huggingface_hub.constants import HF_HUB_OFFLINE

        if HF_HUB_OFFLINE:
            logger.warning("HF_HUB_OFFLINE is set: --push_to_hub will fail after training (files are kept).")

    if training_args.keep_freed_memory and training_args.device.type == "cpu":
        keep_freed_memory()
    if training_args.should_log and training_args.device.type == "cpu" and (hint := slow_mkl_hint()):
        logger.warning(hint)
    if (
        training_args.should_log
        and training_args.device.type == "cpu"
        and (hint := native_bf16_hint(training_args.bf16))
    ):
        logger.info(hint)
    set_seed(training_args.seed)
    if compile_for_static_batches(training_args):
        logger.info(STATIC_BATCHES_NOTE)
    if model_args.model_name_or_path is not None:
        model_args.architecture, config = load_checkpoint_config(model_args)
        source, requested = resolve_data_arguments(data_args, default_tasks=list(config.task_names))
        unknown = [name for name in requested if name not in config.task_names]
        if unknown:
            raise ValueError(
                f"--task_names {' '.join(unknown)}: --model_name_or_path {model_args.model_name_or_path} has no "
                f"head for them; its tasks are {', '.join(config.task_names)}."
            )
    else:
        source, requested = resolve_data_arguments(data_args)
        # Before the data are loaded: a wrong --config_overrides should not wait for downloads.
        config = build_config(model_args, requested)
    with training_args.main_process_first(desc="loading the datasets"):
        raw, task_names = load_digits_tasks(
            requested,
            source=source,
            data_dir=data_args.data_dir,
            max_train_samples=data_args.max_train_samples,
            max_eval_samples=data_args.max_eval_samples,
            seed=training_args.seed,
        )
    train_counts = task_sizes(raw["train"], task_names)
    eval_counts = task_sizes(raw["test"], task_names)
    for name, n_train, n_eval in zip(task_names, train_counts, eval_counts, strict=True):
        logger.info(f"Dataset {name!r} ({source}): {n_train} training samples, {n_eval} test samples")

    if config.problem_type is None:
        # Set here rather than inferred in the first forward, where transformers' classifiers write it into the
        # config: under --torch_compile that change would recompile the model at its second step.
        config.problem_type = "single_label_classification"
    model_class = ARCHITECTURES[model_args.architecture][1]
    if model_args.model_name_or_path is not None:
        model = model_class.from_pretrained(model_args.model_name_or_path, config=config)
    else:
        model = model_class(config)
    if model_args.eager_formulation != "literal" or model_args.token_alignment != 1:
        set_eager_formulation(model, model_args.eager_formulation, model_args.token_alignment)
        logger.info(
            f"Eq. 6 in the 'eager' path: {model_args.eager_formulation} formulation, tokens padded to a multiple of "
            f"{model_args.token_alignment}; it runs with attn_implementation='eager', and with 'sdpa' only when "
            "compiled on a GPU (this run: "
            f"attn_implementation={model.config._attn_implementation!r}, torch_compile={training_args.torch_compile})."
        )
    model_task_ids = [list(config.task_names).index(name) for name in task_names]
    num_params = sum(p.numel() for p in model.parameters())
    num_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    logger.info(f"{type(model).__name__}: {num_params:,} parameters ({num_trainable:,} trainable)")
    if note := batch_transfer_note(training_args):
        logger.info(note)
    processor = NeuralInterpreterImageProcessor(
        size={"height": config.image_size, "width": config.image_size}, patch_size=config.patch_size
    )
    raw["test"].set_transform(DigitsTransform(processor, model_task_ids))

    augmentation = None
    if data_args.randaugment and training_args.do_train:
        augmentation = BatchRandAugment(
            num_ops=data_args.randaugment_num_ops,
            magnitude=data_args.randaugment_magnitude,
            probability=data_args.randaugment_probability,
            policy=select_randaugment_policy(data_args.randaugment_operations),
            image_mean=processor.image_mean,
            image_std=processor.image_std,
            image_size=config.image_size,
            patch_size=config.patch_size,
        )
    in_workers = augmentation is not None and randaugment_in_workers(
        data_args.randaugment_where, training_args.dataloader_num_workers
    )
    raw["train"].set_transform(
        DigitsTransform(processor, model_task_ids, augmentation if in_workers else None)
    )
    if augmentation is not None:
        where = (
            f"in the {training_args.dataloader_num_workers} DataLoader workers (CPU)"
            if in_workers
            else f"on {training_args.device}"
        )
        logger.info(f"Training batches are augmented {where}: RandAugment({augmentation.extra_repr()})")
        if in_workers:
            augmentation = None  # the trainer's training step leaves the batches as the workers made them

    with training_args.main_process_first(desc="loading the metric"):
        metric = load_multitask_accuracy(keep_in_memory=True)

    optimizer_cls_and_kwargs = None
    if training_args.radam:
        optimizer_cls_and_kwargs = (
            torch.optim.RAdam,
            {
                "lr": training_args.learning_rate,
                "betas": (training_args.adam_beta1, training_args.adam_beta2),
                "eps": training_args.adam_epsilon,
            },
        )
    trainer = DigitsTrainer(
        model=model,
        args=training_args,
        train_dataset=raw["train"] if training_args.do_train else None,
        eval_dataset=raw["test"] if training_args.do_eval else None,
        processing_class=processor,
        compute_metrics=make_compute_metrics(metric, task_names, model_task_ids),
        optimizer_cls_and_kwargs=optimizer_cls_and_kwargs,
        augmentation=augmentation,
    )

    train_metrics: dict[str, float] = {}
    if training_args.do_train:
        checkpoint = training_args.resume_from_checkpoint
        if checkpoint is not None and checkpoint.lower() in ("true", "last", "latest"):
            checkpoint = True  # the last checkpoint in output_dir
        if checkpoint:
            logger.info(
                f"Resuming from checkpoint {checkpoint if checkpoint is not True else '(last in output_dir)'}"
            )
        train_result = trainer.train(resume_from_checkpoint=checkpoint)
        ni_hf.release_workspace()  # the CPU buffers that training steps reuse; evaluation needs far less
        trainer.save_model()  # model.safetensors, config.json (auto_map), code files, preprocessor_config.json
        train_metrics = dict(train_result.metrics)
        train_metrics["train_samples"] = len(raw["train"])
        train_metrics["world_size"] = world_size
        train_metrics["global_step"] = trainer.state.global_step
        train_metrics["architecture"] = model_args.architecture
        trainer.log_metrics("train", train_metrics)
        trainer.save_metrics("train", train_metrics)
        trainer.save_state()

    eval_metrics: dict[str, float] = {}
    if training_args.do_eval:
        eval_metrics = final_evaluation_done(trainer) or trainer.evaluate()
        eval_metrics["eval_samples"] = len(raw["test"])
        eval_metrics["eval_world_size"] = world_size
        trainer.log_metrics("eval", eval_metrics)
        trainer.save_metrics("eval", eval_metrics)
        for name in task_names:
            accuracy = eval_metrics.get(f"eval_accuracy_{name}", math.nan)
            counted = int(eval_metrics.get(f"eval_num_samples_{name}", 0))
            logger.info(f"Test accuracy {name}: {100 * accuracy:.2f}% ({counted} samples)")
        logger.info(
            f"Test accuracy overall: {100 * eval_metrics.get('eval_accuracy', math.nan):.2f}% "
            f"({int(eval_metrics.get('eval_num_samples', 0))} samples)"
        )

    if not training_args.do_train:
        logger.info(
            f"--do_train false: nothing was trained, so no model, checkpoint or model card was saved; the "
            f"evaluation of {model_args.model_name_or_path} is in {training_args.output_dir}/eval_results.json"
        )
    elif trainer.is_world_process_zero():
        card_path = write_model_card(
            output_dir=training_args.output_dir,
            model_name=repo_id.split("/")[-1],
            repo_id=repo_id,
            template=model_args.model_card_template,
            config=config,
            model=model,
            source=source,
            data_dir=data_args.data_dir,
            task_names=task_names,
            train_counts=train_counts,
            eval_counts=eval_counts,
            eval_metrics=eval_metrics,
            train_metrics=train_metrics,
            training_args=training_args,
            data_args=data_args,
            argv=argv,
        )
        logger.info(
            f"Model card written to {card_path}; the model, code and processor are in {training_args.output_dir}"
        )
    trainer.accelerator.wait_for_everyone()

    results = {**train_metrics, **eval_metrics}
    if push_to_hub and trainer.is_world_process_zero():
        logger.info(f"Uploading {training_args.output_dir} to the Hub repo {repo_id}")
        try:
            description = "Multi-task ViT" if model_args.architecture == "vit" else "Neural Interpreter"
            url = push_folder(
                training_args.output_dir,
                repo_id,
                commit_message=f"{description} trained with examples/run_digits.py",
                token=training_args.hub_token,
                private=training_args.hub_private_repo,
                revision=training_args.hub_revision,
            )
        except Exception as error:  # noqa: BLE001 - any failure gets the same explanation
            logger.error(explain_push_failure(error, training_args.output_dir, repo_id))
            trainer.end()
            raise SystemExit(1) from error
        logger.info(f"Pushed to {url}")
    trainer.end()
    return results


if __name__ == "__main__":
    main()
