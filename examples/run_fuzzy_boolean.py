#!/usr/bin/env python
"""Fuzzy Boolean expressions with Neural Interpreters: pre-training and adaptation (paper Table 1).

Rahaman et al., "Dynamic Inference with Neural Interpreters" (NeurIPS 2021), section 4.1 and the appendix
"Learning Fuzzy Boolean Expressions". A Neural Interpreter (the paper's ``fuzzy_boolean`` preset) is pre-trained
to regress 20 random fuzzy Boolean functions of 5 variables at once (one CLS token per function, a shared
regression head), then adapted to 10 new functions with 10 fresh CLS tokens in three settings, each starting from
the same pre-trained checkpoint:

* ``cls_tokens``: only the new CLS tokens are trained;
* ``type_inference``: + the type-inference MLPs and the function signatures of every script (type matching);
* ``all``: + all remaining parameters (the whole model).

Metric: R^2 = 1 - SSE/SST of every function on its test split, mean and population std over the functions, beside
the paper's values. Protocols (``--protocol``): ``full`` is the paper's (163840 points per function, 80/20 split,
batch 128, 20 + 3 epochs, RAdam 6e-3 / 5e-2, constant learning rate); ``reduced`` keeps its epochs on a tenth of
the points; ``quick`` is a smoke test of a few seconds. Every size can be overridden.

Outputs in ``--output_dir``: ``pretrain/``, ``adapt-<setting>/``, ``fuzzy_boolean_results.{json,md}``, the model
code, and ``README.md``, a model card with the measured R^2 as Hub ``model-index`` results and each saved model's
function usage on held-out points (``routing_<folder>_usage.json``, and with matplotlib, the `vis` extra, the
pictures ``routing_<folder>_{path,usage}.png``); ``--push_to_hub`` uploads the folder at the very end.

Examples::

    python examples/run_fuzzy_boolean.py --protocol quick --output_dir /tmp/fb-quick
    python examples/run_fuzzy_boolean.py --protocol full --output_dir runs/fb-full
    # the full protocol in pieces: checkpoint every 1024 steps; rerun the same command to continue
    python examples/run_fuzzy_boolean.py --protocol full --output_dir runs/fb-full \
        --save_strategy steps --save_steps 1024 --save_total_limit 2 --resume_from_checkpoint last
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib.util
import json
import logging
import math
import os
import platform
import re
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import jinja2
import numpy as np
import torch
from transformers import EvalPrediction, HfArgumentParser, Trainer, TrainingArguments, set_seed
from transformers.trainer import TRAINER_STATE_NAME

try:
    import ni_hf
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    import ni_hf

from ni_hf import NeuralInterpreterConfig, NeuralInterpreterForSetRegression
from ni_hf.data.fuzzy_boolean import make_fuzzy_boolean_tensors
from ni_hf.training.data_transfer import (
    PIN_MEMORY_HELP,
    apply_gpu_loading_defaults,
    compile_for_static_batches,
)
from ni_hf.training.evaluation import CopiedPredictionsMixin, routing_density
from ni_hf.training.model_card import (
    DEFAULT_FUZZY_BOOLEAN_TEMPLATE,
    build_fuzzy_boolean_model_card,
    describe_hardware,
    mixed_precision,
)
from ni_hf.training.paths import check_model_path
from ni_hf.training.publishing import explain_push_failure, push_folder, reconstruct_command

logger = logging.getLogger("run_fuzzy_boolean")

# Paper, Table 1: mean and std of R^2 over the functions.
PAPER_PRETRAINING_R2 = (0.9983, 0.0005)
ADAPTATION_SETTINGS: dict[str, dict[str, Any]] = {
    "cls_tokens": {"label": "Finetuning CLS tokens", "paper": (0.9202, 0.0198)},
    "type_inference": {"label": "+ type-inference parameters (and signatures)", "paper": (0.9857, 0.0034)},
    "all": {"label": "+ remaining parameters (all)", "paper": (0.9953, 0.0013)},
}
# Parameter groups (see parameter_group) that each setting trains.
SETTING_GROUPS: dict[str, set[str]] = {
    "cls_tokens": {"task_tokens"},
    "type_inference": {"task_tokens", "type_matching"},
    "all": {"task_tokens", "type_matching", "other"},
}
# max_steps -1: train for the epochs.
PROTOCOLS: dict[str, dict[str, Any]] = {
    "full": dict(points_per_function=163840, batch_size=128, pretrain_epochs=20.0, adapt_epochs=3.0,
                 pretrain_max_steps=-1, adapt_max_steps=-1),
    "reduced": dict(points_per_function=16384, batch_size=128, pretrain_epochs=20.0, adapt_epochs=3.0,
                    pretrain_max_steps=-1, adapt_max_steps=-1),
    "quick": dict(points_per_function=320, batch_size=32, pretrain_epochs=1.0, adapt_epochs=1.0,
                  pretrain_max_steps=4, adapt_max_steps=2),
}  # fmt: skip
PROTOCOL_NOTES = {
    "reduced": "a tenth of the points per function, a check of the pipeline",
    "quick": "a few steps on a few hundred points, a smoke test",
}
# The paper's values of the options that change the protocol beyond its sizes.
PAPER_SETTINGS = {
    "test_fraction": 0.2,
    "num_pretrain_functions": 20,
    "num_adapt_functions": 10,
    "pretrain_learning_rate": 0.006,
    "adapt_learning_rate": 0.05,
    "adapt_pretrained_learning_rate": None,
}
# TrainingArguments that the protocol sets for each phase, with the option to use instead.
PHASE_FIELDS = {
    "learning_rate": "--pretrain_learning_rate / --adapt_learning_rate",
    "num_train_epochs": "--pretrain_epochs / --adapt_epochs",
    "max_steps": "--pretrain_max_steps / --adapt_max_steps",
    "per_device_train_batch_size": "--batch_size (the global batch)",
    "gradient_accumulation_steps": "--batch_size (the global batch)",
    "lr_scheduler_type": "nothing: the paper's rate is constant",
    "warmup_steps": "nothing: the paper uses no warm-up",
    "optim": "nothing: both phases use RAdam, as the paper (betas --adam_beta1/--adam_beta2, eps --adam_epsilon)",
}
NUM_VARIABLES = 5
RESULTS_JSON = "fuzzy_boolean_results.json"
RESULTS_MD = "fuzzy_boolean_results.md"
DENSITY_POINTS = 4096
"""Test points on which each model's routing density is measured."""
DEFAULT_TEMPLATE = DEFAULT_FUZZY_BOOLEAN_TEMPLATE
ROUTING_POINTS = 256
"""Held-out test points on which the model card shows each saved model's function usage."""


@dataclass
class FuzzyBooleanArguments:
    """The experiment: protocol, data, and the two phases; `None` means "the protocol's value"."""

    protocol: Literal["full", "reduced", "quick"] = field(
        default="full",
        metadata={
            "help": "full: the paper's (163840 points per function, batch 128, 20 pre-training epochs = 20480 "
            "steps, 3 adaptation epochs = 3072 steps per setting). reduced: the same on 16384 points per function "
            "(2060 + 309 steps). quick: 320 points, batch 32, 4 + 2 steps (a smoke test)."
        },
    )
    points_per_function: int | None = field(
        default=None,
        metadata={"help": "Points (train + test) of each group of functions; default: protocol's."},
    )
    test_fraction: float = field(
        default=0.2, metadata={"help": "Fraction of the points held out for testing."}
    )
    num_pretrain_functions: int = field(default=20, metadata={"help": "Functions of the pre-training task."})
    num_adapt_functions: int = field(default=10, metadata={"help": "New functions of the adaptation task."})
    dataset_seed: int = field(default=0, metadata={"help": "Seed of the truth tables and the input points."})
    adapt_dataset_seed: int | None = field(
        default=None,
        metadata={
            "help": "Draw the adaptation functions and points from this seed instead (the pre-training data stay "
            "those of --dataset_seed): another draw of the new functions."
        },
    )
    batch_size: int | None = field(
        default=None,
        metadata={
            "help": "Global training batch of both phases (paper: 128); with several processes each takes an "
            "equal share. Default: protocol's."
        },
    )
    pretrain_epochs: float | None = field(default=None, metadata={"help": "Pre-training epochs (paper: 20)."})
    adapt_epochs: float | None = field(
        default=None, metadata={"help": "Adaptation epochs per setting (paper: 3)."}
    )
    pretrain_max_steps: int | None = field(
        default=None,
        metadata={"help": "Pre-train for this many steps instead of the epochs (-1: the epochs)."},
    )
    adapt_max_steps: int | None = field(
        default=None,
        metadata={"help": "Adapt for this many steps per setting instead of the epochs (-1: the epochs)."},
    )
    pretrain_learning_rate: float = field(
        default=6e-3, metadata={"help": "RAdam learning rate of pre-training (paper: 6e-3, constant)."}
    )
    adapt_learning_rate: float = field(
        default=5e-2,
        metadata={
            "help": "RAdam learning rate of adaptation (paper: 5e-2, constant). At 5e-2 the 'all' setting collapses "
            "to a constant prediction in our runs; see examples/README.md."
        },
    )
    adapt_pretrained_learning_rate: float | None = field(
        default=None,
        metadata={
            "help": "A rate of their own for the pre-trained parameters a setting adapts, the new CLS tokens keeping "
            "--adapt_learning_rate (the paper's table does not say which parameters its fine-tuning rate applies "
            "to; 0.006 reads it as the pre-training rate). Default: --adapt_learning_rate for every parameter."
        },
    )
    settings: str = field(
        default="cls_tokens,type_inference,all",
        metadata={
            "help": "Comma-separated adaptation settings (cls_tokens, type_inference, all), or 'none'."
        },
    )
    pretrained_model: str | None = field(
        default=None,
        metadata={
            "help": "Skip pre-training and adapt this saved pre-trained model (a folder of save_pretrained)."
        },
    )
    model_card_template: str = field(
        default=str(DEFAULT_TEMPLATE),
        metadata={"help": "Jinja template of the model card written to <output_dir>/README.md."},
    )

    def resolved(self) -> dict[str, Any]:
        """The protocol's sizes with this run's explicit values applied."""
        sizes = dict(PROTOCOLS[self.protocol], protocol=self.protocol)
        for key in PROTOCOLS[self.protocol]:
            if getattr(self, key) is not None:
                sizes[key] = getattr(self, key)
        return sizes

    def setting_names(self) -> list[str]:
        """The adaptation settings to run, in the given order."""
        if self.settings.strip().lower() == "none":
            return []
        return [name.strip() for name in self.settings.split(",")]


@dataclass
class FuzzyBooleanTrainingArguments(TrainingArguments):
    """TrainingArguments with this experiment's defaults; the fields in PHASE_FIELDS are set per phase."""

    output_dir: str | None = field(
        default="runs/fuzzy_boolean", metadata={"help": "Where the models and results are written."}
    )
    per_device_eval_batch_size: int = field(default=1024, metadata={"help": "Evaluation batch size."})
    logging_steps: float = field(
        default=50, metadata={"help": "Log the training loss every this many steps."}
    )
    # A NaN loss must show in the log, not be averaged away (transformers' default filters it).
    logging_nan_inf_filter: bool = field(
        default=False, metadata={"help": "Replace a NaN/inf loss in the log."}
    )
    save_strategy: str = field(
        default="no", metadata={"help": "Intermediate checkpoints (the final models are always saved)."}
    )
    max_grad_norm: float = field(default=0.0, metadata={"help": "Gradient clipping (0: none, as the paper)."})
    remove_unused_columns: bool = field(
        default=False, metadata={"help": "Must stay False: the dataset builds whole batches."}
    )
    report_to: None | str | list[str] = field(default="none", metadata={"help": "Logging integrations."})
    dataloader_pin_memory: bool = field(default=torch.cuda.is_available(), metadata={"help": PIN_MEMORY_HELP})

    def __post_init__(self) -> None:
        apply_gpu_loading_defaults(
            self
        )  # before transformers turns accelerator_config into an AcceleratorConfig
        super().__post_init__()


# --- argument checks ----------------------------------------------------------------------------------------


def _gib(num_bytes: float) -> str:
    return f"{num_bytes / 2**30:,.1f} GiB"


def memory_needed(exp: FuzzyBooleanArguments, sizes: dict[str, Any], eval_batch: int) -> dict[str, int]:
    """Lower bounds of the bytes a run needs: the data (host) and the model with one batch (device).

    Data: both groups' float32 inputs and targets, plus the larger group's float64 targets while they are made.
    Model: the CLS tokens with their gradients and RAdam's two moments; batch: the set of the largest batch
    (5 + functions tokens of width hidden_size), which every layer holds.
    """
    points = sizes["points_per_function"]
    num_test = round(points * exp.test_fraction)
    functions = max(exp.num_pretrain_functions, exp.num_adapt_functions)
    data = points * (
        4 * (2 * NUM_VARIABLES + exp.num_pretrain_functions + exp.num_adapt_functions) + 8 * functions
    )
    hidden = NeuralInterpreterConfig.from_paper("fuzzy_boolean").hidden_size
    batch = max(min(sizes["batch_size"], points - num_test), min(eval_batch, num_test))
    return {
        "data": data,
        "model": 4 * 4 * functions * hidden + 4 * batch * (NUM_VARIABLES + functions) * hidden,
    }


def total_memory(device: torch.device) -> int:
    """Memory of ``device`` in bytes (physical memory for the CPU)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_push(args: TrainingArguments) -> None:
    """Refuse --push_to_hub where the upload at the end of the run cannot work: offline, no token, a bad repo id."""
    from huggingface_hub import constants, get_token
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if constants.HF_HUB_OFFLINE:
        raise ValueError(
            "--push_to_hub: HF_HUB_OFFLINE is set, so the upload would fail; unset it, or drop --push_to_hub and "
            "upload the output folder later with `hf upload`."
        )
    if not (args.hub_token or get_token()):
        raise ValueError(
            "--push_to_hub needs a write token: run `hf auth login`, set HF_TOKEN, or pass --hub_token."
        )
    repo_id = args.hub_model_id or Path(args.output_dir).absolute().name
    try:
        validate_repo_id(repo_id)
    except HFValidationError as error:
        option = "--hub_model_id" if args.hub_model_id else "--output_dir's name (pass --hub_model_id)"
        raise ValueError(f"{option} {repo_id!r} is not a Hub repo id: {error}") from None


def check_arguments(exp: FuzzyBooleanArguments, args: TrainingArguments) -> dict[str, Any]:
    """Refuse, naming the option, every value that would fail or be ignored later; return the protocol's sizes."""
    sizes = exp.resolved()
    defaults = {f.name: f.default for f in dataclasses.fields(FuzzyBooleanTrainingArguments)}
    for name, replacement in PHASE_FIELDS.items():
        value, default = getattr(args, name), defaults[name]
        if getattr(value, "value", value) != getattr(default, "value", default):
            raise ValueError(
                f"--{name} {getattr(value, 'value', value)}: the protocol sets it for each phase; use {replacement}."
            )
    for name in ("points_per_function", "batch_size"):
        if sizes[name] < 1:
            raise ValueError(f"--{name} must be at least 1, got {sizes[name]}.")
    for name in ("num_pretrain_functions", "num_adapt_functions"):
        if getattr(exp, name) < 1:
            raise ValueError(f"--{name} must be at least 1, got {getattr(exp, name)}.")
    for name in ("dataset_seed", "adapt_dataset_seed"):
        if (getattr(exp, name) or 0) < 0:
            raise ValueError(f"--{name} must be >= 0 (a numpy seed), got {getattr(exp, name)}.")
    if not 0 < exp.test_fraction < 1:
        raise ValueError(f"--test_fraction must lie strictly between 0 and 1, got {exp.test_fraction}.")
    num_test = round(sizes["points_per_function"] * exp.test_fraction)
    if num_test < 2 or sizes["points_per_function"] - num_test < 1:
        raise ValueError(
            f"--points_per_function {sizes['points_per_function']} with --test_fraction {exp.test_fraction} leaves "
            f"{sizes['points_per_function'] - num_test} training and {num_test} test points; R^2 needs at least "
            "1 and 2."
        )
    for phase in ("pretrain", "adapt"):
        epochs, steps = sizes[f"{phase}_epochs"], sizes[f"{phase}_max_steps"]
        if steps == 0 or steps < -1:
            raise ValueError(
                f"--{phase}_max_steps must be -1 (train for the epochs) or at least 1, got {steps}."
            )
        if steps == -1 and not (math.isfinite(epochs) and epochs > 0):
            raise ValueError(
                f"--{phase}_epochs must be positive (or give --{phase}_max_steps), got {epochs}."
            )
    for name in ("pretrain_learning_rate", "adapt_learning_rate", "adapt_pretrained_learning_rate"):
        value = getattr(exp, name)
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ValueError(f"--{name} must be a positive number, got {value}.")
    if exp.adapt_pretrained_learning_rate is not None and args.weight_decay:
        raise ValueError(
            f"--adapt_pretrained_learning_rate builds RAdam groups without weight decay; --weight_decay "
            f"{args.weight_decay} would be ignored there, so drop one of the two."
        )
    settings = exp.setting_names()
    unknown = [name for name in settings if name not in ADAPTATION_SETTINGS]
    if unknown or len(set(settings)) != len(settings):
        raise ValueError(
            f"--settings {exp.settings!r}: expected distinct names among {list(ADAPTATION_SETTINGS)}, or 'none'."
        )
    if sizes["batch_size"] % args.world_size:
        raise ValueError(
            f"--batch_size {sizes['batch_size']} is the global batch; it must be divisible by the number of "
            f"processes ({args.world_size}) so that each takes an equal share."
        )
    if not Path(exp.model_card_template).is_file():
        raise ValueError(f"--model_card_template {exp.model_card_template} does not exist.")
    try:
        jinja2.Environment().parse(Path(exp.model_card_template).read_text())
    except jinja2.TemplateSyntaxError as error:
        raise ValueError(
            f"--model_card_template {exp.model_card_template}: {error} (line {error.lineno})."
        ) from None
    if args.torch_compile:
        from torch import _dynamo

        if args.torch_compile_backend not in _dynamo.list_backends(exclude_tags=()):
            raise ValueError(
                f"--torch_compile_backend {args.torch_compile_backend!r} is not a backend of torch.compile; "
                f"expected one of {_dynamo.list_backends()}."
            )
    if args.push_to_hub:
        check_push(args)
    resume = args.resume_from_checkpoint
    if exp.pretrained_model:
        if resume:
            raise ValueError(
                "--resume_from_checkpoint continues a pre-training; --pretrained_model skips it: drop one."
            )
        exp.pretrained_model = check_model_path(exp.pretrained_model, "--pretrained_model")
        config = NeuralInterpreterConfig.from_pretrained(exp.pretrained_model)
        if config.num_tasks != exp.num_pretrain_functions:
            raise ValueError(
                f"--pretrained_model {exp.pretrained_model} regresses {config.num_tasks} functions; pass "
                f"--num_pretrain_functions {config.num_tasks} so that its test data match."
            )
    elif resume and resume.lower() not in ("true", "last", "false", "none"):
        if not (Path(resume) / TRAINER_STATE_NAME).is_file():
            raise ValueError(
                f"--resume_from_checkpoint {resume}: not a complete checkpoint (no {TRAINER_STATE_NAME}); pass a "
                "checkpoint-* folder, or 'last' for the newest complete one."
            )
    if args.per_device_eval_batch_size < 1:
        raise ValueError(
            f"--per_device_eval_batch_size must be at least 1, got {args.per_device_eval_batch_size}."
        )
    needed = memory_needed(exp, sizes, args.per_device_eval_batch_size)
    functions = f"--num_pretrain_functions {exp.num_pretrain_functions} and --num_adapt_functions {exp.num_adapt_functions}"
    if needed["data"] > total_memory(torch.device("cpu")):
        raise ValueError(
            f"--points_per_function {sizes['points_per_function']} with {functions} need at least "
            f"{_gib(needed['data'])} for the data; this machine has {_gib(total_memory(torch.device('cpu')))}."
        )
    if needed["model"] > total_memory(args.device):
        raise ValueError(
            f"--batch_size {sizes['batch_size']} (evaluation: --per_device_eval_batch_size "
            f"{args.per_device_eval_batch_size}) with {functions} need at least {_gib(needed['model'])} for one "
            f"batch; {args.device.type} has {_gib(total_memory(args.device))}."
        )
    return sizes


# --- data and metric ----------------------------------------------------------------------------------------


class TensorBatchDataset(torch.utils.data.Dataset):
    """In-memory (inputs, labels) tensors; ``__getitems__`` serves a whole batch with one tensor index."""

    def __init__(self, inputs: torch.Tensor, labels: torch.Tensor) -> None:
        if inputs.shape[0] != labels.shape[0]:
            raise ValueError(f"inputs and labels differ in length: {inputs.shape[0]} vs {labels.shape[0]}")
        self.inputs = inputs.contiguous()
        self.labels = labels.contiguous()

    def __len__(self) -> int:
        return self.inputs.shape[0]

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"inputs": self.inputs[index], "labels": self.labels[index]}

    def __getitems__(self, indices: Sequence[int]) -> dict[str, torch.Tensor]:
        index = torch.as_tensor(indices, dtype=torch.long)
        return {"inputs": self.inputs[index], "labels": self.labels[index]}


def batch_collator(batch: dict[str, torch.Tensor] | list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Pass a whole batch through; stack a list of samples (a sampler that bypasses ``__getitems__``)."""
    if isinstance(batch, dict):
        return batch
    return {key: torch.stack([sample[key] for sample in batch]) for key in batch[0]}


def r2_per_function(predictions: np.ndarray | torch.Tensor, targets: np.ndarray | torch.Tensor) -> np.ndarray:
    """R^2_f = 1 - SSE_f / SST_f of every column (float64), shape (F,).

    A constant target column (SST = 0) gives 1 for a perfect prediction and -inf otherwise.
    """
    p = np.asarray(predictions, dtype=np.float64)
    y = np.asarray(targets, dtype=np.float64)
    if p.shape != y.shape:
        raise ValueError(f"predictions {p.shape} and targets {y.shape} differ in shape")
    if p.ndim == 1:
        p, y = p[:, None], y[:, None]
    sse = ((y - p) ** 2).sum(axis=0)
    sst = ((y - y.mean(axis=0)) ** 2).sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        r2 = 1.0 - sse / sst
    return np.where(sst > 0, r2, np.where(sse > 0, -np.inf, 1.0))


def summarize_r2(r2: np.ndarray) -> dict[str, Any]:
    """Mean, population std, min and the per-function values of an R^2 vector."""
    return {
        "r2_mean": float(np.mean(r2)),
        "r2_std": float(np.std(r2)),
        "r2_min": float(np.min(r2)),
        "r2_per_function": [float(v) for v in r2],
    }


def compute_metrics(eval_pred: EvalPrediction) -> dict[str, float]:
    """Trainer metrics: mean and min R^2 over the functions."""
    r2 = r2_per_function(eval_pred.predictions, eval_pred.label_ids)
    return {"r2_mean": float(np.mean(r2)), "r2_min": float(np.min(r2))}


# --- adaptation settings ------------------------------------------------------------------------------------


def parameter_group(name: str) -> str:
    """``task_tokens`` (the CLS tokens), ``type_matching`` (type-inference MLPs and signatures), ``unused`` (the
    patch embedding, which sets never read) or ``other`` (LOCs, codes, sigma, input embedding, head, ...)."""
    if name.startswith("neural_interpreter.patch_embedding."):
        return "unused"
    if name == "neural_interpreter.task_tokens":
        return "task_tokens"
    if re.fullmatch(r"neural_interpreter\.scripts\.\d+\.(type_inference\..+|signatures)", name):
        return "type_matching"
    return "other"


def set_adaptation_trainable(model: torch.nn.Module, setting: str) -> dict[str, int]:
    """Make exactly the parameters of ``setting``'s groups trainable; return the trainable count per group."""
    counts = {"task_tokens": 0, "type_matching": 0, "other": 0}
    for name, param in model.named_parameters():
        group = parameter_group(name)
        param.requires_grad_(group in SETTING_GROUPS[setting])
        if param.requires_grad:
            counts[group] += param.numel()
    return counts


def adaptation_param_groups(
    model: torch.nn.Module, token_learning_rate: float, pretrained_learning_rate: float
) -> list[dict[str, Any]]:
    """RAdam groups: the CLS tokens at one rate, the other trainable (pre-trained) parameters at another."""
    tokens, pretrained = [], []
    for name, param in model.named_parameters():
        if param.requires_grad:
            (tokens if parameter_group(name) == "task_tokens" else pretrained).append(param)
    groups = [
        {"params": tokens, "lr": token_learning_rate},
        {"params": pretrained, "lr": pretrained_learning_rate},
    ]
    return [group for group in groups if group["params"]]


# --- training -----------------------------------------------------------------------------------------------


class FuzzyBooleanTrainer(CopiedPredictionsMixin, Trainer):
    """Trainer whose predictions survive a CUDA-graphed model (dynamo's cudagraphs backend on a GPU)."""


def phase_arguments(
    base: TrainingArguments,
    output_dir: Path,
    learning_rate: float,
    batch_size: int,
    epochs: float,
    max_steps: int,
) -> TrainingArguments:
    """A copy of ``base`` for one phase: its folder, learning rate (constant), batch size and length."""
    return dataclasses.replace(
        base,
        output_dir=str(output_dir),
        learning_rate=learning_rate,
        per_device_train_batch_size=batch_size,
        num_train_epochs=epochs,
        max_steps=max_steps,
        lr_scheduler_type="constant",
    )


def make_trainer(
    model: torch.nn.Module,
    args: TrainingArguments,
    train: TensorBatchDataset,
    test: TensorBatchDataset,
    param_groups: list[dict[str, Any]] | None = None,
) -> Trainer:
    """A Trainer with RAdam (betas and eps of ``args``), the whole-batch collator and R^2 metrics.

    ``param_groups`` (each with its own ``lr``) replace the Trainer's single group.
    """
    optimizer_kwargs: dict[str, Any] = {
        "lr": args.learning_rate,
        "betas": (args.adam_beta1, args.adam_beta2),
        "eps": args.adam_epsilon,
    }
    if param_groups is not None:
        optimizer_kwargs["params"] = param_groups
    return FuzzyBooleanTrainer(
        model=model,
        args=args,
        data_collator=batch_collator,
        train_dataset=train,
        eval_dataset=test,
        compute_metrics=compute_metrics,
        optimizer_cls_and_kwargs=(torch.optim.RAdam, optimizer_kwargs),
    )


def pretraining_resume_point(resume_from_checkpoint: str | None, pretrain_dir: Path) -> str | None:
    """The checkpoint pre-training resumes from: a path as given, or for "true"/"last" the newest
    ``checkpoint-*`` in ``pretrain_dir``, or None when there is none yet (so one command starts and continues)."""
    if not resume_from_checkpoint or resume_from_checkpoint.lower() in ("false", "none"):
        return None
    if resume_from_checkpoint.lower() not in ("true", "last"):
        return resume_from_checkpoint
    # A process killed while saving leaves a checkpoint without trainer_state.json (written last): skip it.
    checkpoints = sorted(
        (p for p in pretrain_dir.glob("checkpoint-*") if p.is_dir() and p.name[11:].isdigit()),
        key=lambda p: int(p.name[11:]),
        reverse=True,
    )
    for checkpoint in checkpoints:
        if (checkpoint / TRAINER_STATE_NAME).is_file():
            return str(checkpoint)
        logger.warning("Skipped %s: no %s, an incomplete checkpoint", checkpoint, TRAINER_STATE_NAME)
    logger.info("No complete checkpoint-* in %s yet: pre-training starts from scratch", pretrain_dir)
    return None


def evaluate(
    trainer: Trainer, model: torch.nn.Module, dataset: TensorBatchDataset, batch_size: int
) -> dict[str, Any]:
    """R^2 per function on ``dataset`` (Trainer.predict) and the routing density of ``model`` (the uncompiled
    module) on its first ``DENSITY_POINTS`` points."""
    output = trainer.predict(dataset, metric_key_prefix="test")
    inputs = dataset.inputs[:DENSITY_POINTS]
    batches = ({"inputs": inputs[i : i + batch_size]} for i in range(0, inputs.shape[0], batch_size))
    density = routing_density(model, batches)
    keys = ("per_iteration", "mean", "functions_per_token_mean", "num_samples")
    return {
        **summarize_r2(r2_per_function(output.predictions, output.label_ids)),
        "num_functions": output.label_ids.shape[1],
        "routing_density": {key: density[key] for key in keys},
    }


def train_phase(trainer: Trainer, resume: str | None = None) -> dict[str, Any]:
    """Train, save the model to the phase's folder, and return what the results record of the training."""
    output = trainer.train(resume_from_checkpoint=resume)
    trainer.save_model(trainer.args.output_dir)
    return {
        "checkpoint": trainer.args.output_dir,
        "train_steps": output.global_step,
        "train_runtime_s": output.metrics.get("train_runtime"),
        "final_train_loss": output.training_loss,
    }


# --- results and model card ---------------------------------------------------------------------------------


def environment(args: TrainingArguments) -> dict[str, Any]:
    """Date, CPU, threads and library versions for the results."""
    import transformers

    cpu = platform.processor()
    if Path("/proc/cpuinfo").is_file():
        names = [
            line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")
        ]
        cpu = names[0].split(":", 1)[1].strip() if names else cpu
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device": str(args.device),
        "cpu": cpu,
        "nproc": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "mixed_precision": mixed_precision(args),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }


def _fmt(mean: float | None, std: float | None) -> str:
    if mean is None or not math.isfinite(mean):
        return "n/a"
    return f"{mean:.4f} ± {std:.4f}"


def describe_rates(sizes: dict[str, Any]) -> str:
    """'0.05' or '0.05 (pre-trained parameters 0.006)' for the adaptation's rates."""
    rate = f"{sizes['adapt_learning_rate']}"
    if sizes.get("adapt_pretrained_learning_rate") is not None:
        rate += f" (pre-trained parameters {sizes['adapt_pretrained_learning_rate']})"
    return rate


def results_markdown(results: dict[str, Any]) -> str:
    """The results as a Markdown table beside the paper's Table 1."""
    sizes, pre, env = results["protocol"], results["pretraining"], results["environment"]
    pretraining = (
        f"pre-training {pre['train_steps']} steps"
        if "train_steps" in pre
        else f"pre-trained model loaded from {pre['checkpoint']}"
    )
    processes = (
        f" ({sizes['world_size']} processes x {sizes['per_device_batch_size']})"
        if sizes["world_size"] > 1
        else ""
    )
    lines = [
        f"## Fuzzy Boolean results ({sizes['protocol']} protocol)",
        "",
        f"{sizes['points_per_function']} points per function (test fraction {sizes['test_fraction']}), batch "
        f"{sizes['batch_size']}{processes}, {pretraining}, adaptation {sizes['adapt_length']} per setting; RAdam "
        f"{sizes['pretrain_learning_rate']} / {describe_rates(sizes)}, constant. R^2 = 1 - SSE/SST per function "
        "on its test split; mean ± population std over the functions.",
        "",
        "| Parameter set | R^2 (this run) | R^2 (paper) |",
        "|---|---|---|",
        f"| All parameters (pre-training, {pre['num_functions']} functions) | "
        f"{_fmt(pre.get('r2_mean'), pre.get('r2_std'))} | {_fmt(*PAPER_PRETRAINING_R2)} |",
    ]
    for name, info in ADAPTATION_SETTINGS.items():
        res = results["adaptation"].get(name)
        lines.append(
            f"| {info['label']} | {_fmt(res['r2_mean'], res['r2_std']) if res else 'not run'} | {_fmt(*info['paper'])} |"
        )
    densities = [("pre-trained", pre)] + list(results["adaptation"].items())
    lines += [
        "",
        "Routing density (fraction of (function, token) pairs with C > 0, mean over the function iterations; "
        f"first {pre['routing_density']['num_samples']} test points): "
        + ", ".join(f"{name} {res['routing_density']['mean']:.3f}" for name, res in densities)
        + ".",
        "",
        f"Run on {env['date']}: {env['device']}, {env['cpu']} ({env['nproc']} cores, {env['torch_threads']} torch "
        "threads), "
        + (f"{env['mixed_precision']} autocast, " if env["mixed_precision"] != "no" else "")
        + f"torch {env['torch']}, transformers {env['transformers']}; wall time {results['wall_time_s']:.0f} s.",
    ]
    if pre.get("train_runtime_s"):
        lines.append(
            f"Pre-training steps: {pre['train_steps']} in {pre['train_runtime_s']:.1f} s "
            f"({pre['train_steps'] / pre['train_runtime_s']:.1f} steps/s, the Trainer's train_runtime)."
        )
    return "\n".join(lines) + "\n"


def protocol_deviations(results: dict[str, Any]) -> list[str]:
    """How a run differs from the paper's protocol, one item each."""
    sizes, arguments = results["protocol"], results["arguments"]
    full = PROTOCOLS["full"]
    deviations = [
        f"{key} {sizes[key]} (paper: {full[key]})"
        for key in ("points_per_function", "batch_size", "pretrain_epochs", "adapt_epochs")
        if sizes[key] != full[key]
    ]
    deviations += [
        f"{key} {sizes[key]} (paper: the epochs)"
        for key in ("pretrain_max_steps", "adapt_max_steps")
        if sizes[key] > 0
    ]
    deviations += [
        f"{key} {arguments[key]} (paper: {'not set' if paper is None else paper})"
        for key, paper in PAPER_SETTINGS.items()
        if arguments[key] != paper
    ]
    return deviations


def routing_section(output_dir: Path, test_inputs: dict[str, torch.Tensor]) -> str:
    """The card's "Routing" section: the function usage (C of Eq. 4) of every model saved in ``output_dir``
    (folder -> its held-out test inputs), its JSON and, with matplotlib (the `vis` extra), its pictures."""
    from ni_hf.visualization import write_set_routing_card_assets

    draw = importlib.util.find_spec("matplotlib") is not None
    if not draw:
        logger.warning(
            "No routing pictures on the model card (no matplotlib); pip install 'ni_hf[vis]' for them"
        )
    sections = []
    for folder, inputs in test_inputs.items():
        if not (output_dir / folder / "config.json").is_file():
            continue
        model = NeuralInterpreterForSetRegression.from_pretrained(output_dir / folder)
        assets = write_set_routing_card_assets(
            model, inputs[:ROUTING_POINTS], output_dir, f"routing_{folder}", f"### `{folder}/`", draw=draw
        )
        sections.append(assets["markdown"].strip())
        logger.info("Function usage of %s/ for the model card: %s", folder, ", ".join(assets["files"]))
    if not sections:
        return ""
    intro = (
        "## Routing\n\nWhich functions each saved model uses: the compatibility C of Eq. 4 (how much function u "
        f"processes token i; over u it sums to at most 1) on the first (at most {ROUTING_POINTS}) held-out test "
        "points of its functions. Tokens are the CLS token of every function to regress, then the 5 input variables."
    )
    return "\n\n".join([intro, *sections]) + "\n"


def write_model_card(
    output_dir: Path,
    results: dict[str, Any],
    markdown: str,
    repo_id: str,
    argv: Sequence[str],
    template: str,
    routing: str = "",
) -> Path:
    """README.md: the run's model card, with the model code copied to the top of ``output_dir`` so that the card's
    snippet loads the model of every folder without ni_hf; ``routing`` (Markdown) goes at its end."""
    sizes, arguments, pre = results["protocol"], results["arguments"], results["pretraining"]
    folders = [
        name
        for name in ("pretrain", *(f"adapt-{setting}" for setting in results["adaptation"]))
        if (output_dir / name / "config.json").is_file()
    ]
    for source in (output_dir / folders[0]).glob("*.py") if folders else ():  # the model's remote code
        shutil.copyfile(source, output_dir / source.name)
    settings = [
        {"name": name, "label": info["label"], "trainable": f"{sum(info['trainable_parameters'].values()):,}"}
        for name, info in results["adaptation"].items()
    ]
    per_function = [("pretrain", pre)] + [
        (f"adapt-{name}", info) for name, info in results["adaptation"].items()
    ]
    trained_here = "train_steps" in pre
    deviations = protocol_deviations(results)
    if sizes["protocol"] != "full":
        recipe_note = ""  # the template says so in bold
    elif deviations:
        recipe_note = "This run deviates from the paper's protocol: " + "; ".join(deviations) + "."
    else:
        recipe_note = (
            "This run followed the paper's protocol (section 4.1 and its appendix's hyperparameter table)."
        )
    command, launcher_note = reconstruct_command(__file__, list(argv), sizes["world_size"])
    env = results["environment"]
    card = build_fuzzy_boolean_model_card(
        template_path=template,
        routing=routing,
        model_name=f"Neural Interpreter, fuzzy-Boolean experiment ({sizes['protocol']} protocol)",
        results=results,
        repo_id=repo_id,
        example_folder=folders[0] if folders else "pretrain",
        protocol=sizes["protocol"],
        protocol_note=PROTOCOL_NOTES.get(sizes["protocol"], ""),
        recipe_note=recipe_note,
        num_pretrain_functions=arguments["num_pretrain_functions"],
        num_adapt_functions=arguments["num_adapt_functions"],
        settings=settings,
        has_pretrain="pretrain" in folders,
        results_markdown=markdown.strip(),
        per_function=[
            {"name": name, "r2": ", ".join(f"{v:.4f}" for v in info["r2_per_function"])}
            for name, info in per_function
        ],
        dataset_seed=arguments["dataset_seed"],
        adapt_dataset_seed=arguments["adapt_dataset_seed"],
        function_form="canonical",
        points_per_function=sizes["points_per_function"],
        test_percent=f"{100 * sizes['test_fraction']:g}",
        training_command=command,
        launcher_note=launcher_note,
        hyperparameters={
            "protocol": sizes["protocol"],
            "batch (global)": sizes["batch_size"],
            "processes x batch per process": f"{sizes['world_size']} x {sizes['per_device_batch_size']}",
            "pre-training": f"{pre['train_steps']} steps, RAdam lr {sizes['pretrain_learning_rate']}, constant"
            if trained_here
            else f"loaded from {pre['checkpoint']} (not trained here)",
            "adaptation": f"{sizes['adapt_length']} per setting, RAdam lr {describe_rates(sizes)}, constant",
            "seed (model, CLS tokens, data order)": results["seed"],
        },
        model_changes="",
        hardware=describe_hardware(env["device"], sizes["world_size"], env["mixed_precision"]),
        wall_time=f"{results['wall_time_s']:.0f} s",
        transformers_version=env["transformers"],
        ni_hf_version=ni_hf.__version__,
        extra_limitations=[]
        if trained_here
        else [f"The pre-trained model was loaded from `{pre['checkpoint']}`; it is not part of this folder."],
    )
    path = output_dir / "README.md"
    card.save(str(path))
    return path


def push(output_dir: Path, repo_id: str, args: TrainingArguments) -> None:
    """Upload ``output_dir`` (without checkpoints); offline or on failure, say how to upload it later, exit 1."""
    logger.info("Uploading %s to the Hub repo %s", output_dir, repo_id)
    try:
        url = push_folder(
            output_dir,
            repo_id,
            commit_message="Neural Interpreter fuzzy-Boolean experiment (examples/run_fuzzy_boolean.py)",
            token=args.hub_token,
            private=args.hub_private_repo,
            revision=args.hub_revision,
        )
    except Exception as error:  # noqa: BLE001 - any failure gets the same explanation
        logger.error(explain_push_failure(error, output_dir, repo_id))
        raise SystemExit(1) from error
    logger.info("Pushed to %s", url)


# --- main ---------------------------------------------------------------------------------------------------


def parse_args(
    args: Sequence[str] | None = None,
) -> tuple[FuzzyBooleanArguments, FuzzyBooleanTrainingArguments]:
    """Parse the command line (``args``; default sys.argv) into the two dataclasses."""
    parser = HfArgumentParser((FuzzyBooleanArguments, FuzzyBooleanTrainingArguments))
    return parser.parse_args_into_dataclasses(args=list(args) if args is not None else None)


def main(args: Sequence[str] | None = None) -> dict[str, Any]:
    """Pre-train, adapt in each setting, evaluate; write the results and the model card; return the results."""
    argv = list(sys.argv[1:] if args is None else args)
    exp, base_args = parse_args(argv)
    logging.basicConfig(
        format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO, stream=sys.stdout
    )
    logger.setLevel(logging.INFO if base_args.should_log else logging.WARNING)
    sizes = check_arguments(exp, base_args)
    settings = exp.setting_names()
    # Only the end of the run uploads: no phase's Trainer may push its own folder with a generic card.
    push_to_hub, base_args.push_to_hub = base_args.push_to_hub, False
    repo_id = base_args.hub_model_id or Path(base_args.output_dir).absolute().name
    world_size = base_args.world_size
    per_device_batch = sizes["batch_size"] // world_size
    sizes.update(
        world_size=world_size,
        per_device_batch_size=per_device_batch,
        test_fraction=exp.test_fraction,
        pretrain_learning_rate=exp.pretrain_learning_rate,
        adapt_learning_rate=exp.adapt_learning_rate,
        adapt_pretrained_learning_rate=exp.adapt_pretrained_learning_rate,
        adapt_length=f"{sizes['adapt_max_steps']} steps"
        if sizes["adapt_max_steps"] > 0
        else f"{sizes['adapt_epochs']:g} epochs",
    )
    logger.warning(
        "Process %d of world size %d: device %s", base_args.process_index, world_size, base_args.device
    )
    if compile_for_static_batches(base_args):
        logger.info("torch.compile for static shapes: an epoch's last, smaller batch gets a graph of its own")
    logger.info("Protocol %s: %s", sizes["protocol"], sizes)
    start_time = time.perf_counter()
    output_dir = Path(base_args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)

    # --- data -------------------------------------------------------------------------------------------
    data = make_fuzzy_boolean_tensors(
        num_pretrain_functions=exp.num_pretrain_functions,
        num_adapt_functions=exp.num_adapt_functions,
        points_per_function=sizes["points_per_function"],
        test_fraction=exp.test_fraction,
        seed=exp.dataset_seed,
        adapt_seed=exp.adapt_dataset_seed,
    )
    datasets = {
        group: {split: TensorBatchDataset(*data[group][split]) for split in ("train", "test")}
        for group in ("pretrain", "adapt")
    }
    pretrain_names = [f"f{i}" for i in range(exp.num_pretrain_functions)]
    adapt_names = [f"f{exp.num_pretrain_functions + i}" for i in range(exp.num_adapt_functions)]
    results: dict[str, Any] = {
        "protocol": sizes,
        "arguments": dataclasses.asdict(exp),
        "seed": base_args.seed,
        "adaptation": {},
    }

    # --- pre-training -----------------------------------------------------------------------------------
    pre_args = phase_arguments(
        base_args,
        output_dir / "pretrain",
        exp.pretrain_learning_rate,
        per_device_batch,
        sizes["pretrain_epochs"],
        sizes["pretrain_max_steps"],
    )
    if exp.pretrained_model:
        logger.info("Pre-trained model loaded from %s (pre-training skipped)", exp.pretrained_model)
        model = NeuralInterpreterForSetRegression.from_pretrained(exp.pretrained_model)
        pretrain_dir = exp.pretrained_model
        trainer = make_trainer(model, pre_args, datasets["pretrain"]["train"], datasets["pretrain"]["test"])
        pretraining: dict[str, Any] = {"checkpoint": pretrain_dir}
    else:
        set_seed(base_args.seed)
        config = NeuralInterpreterConfig.from_paper("fuzzy_boolean", task_names=pretrain_names)
        model = NeuralInterpreterForSetRegression(config)
        trainer = make_trainer(model, pre_args, datasets["pretrain"]["train"], datasets["pretrain"]["test"])
        resume = pretraining_resume_point(base_args.resume_from_checkpoint, Path(pre_args.output_dir))
        logger.info(
            "Pre-training %d parameters on %d functions%s", model.num_parameters(), len(pretrain_names),
            f", resumed from {resume}" if resume else "",
        )  # fmt: skip
        pretraining = {**train_phase(trainer, resume), "resumed_from": resume}
        pretrain_dir = pre_args.output_dir
    results["pretraining"] = {
        **pretraining,
        **evaluate(trainer, model, datasets["pretrain"]["test"], sizes["batch_size"]),
        "paper_r2_mean": PAPER_PRETRAINING_R2[0],
        "paper_r2_std": PAPER_PRETRAINING_R2[1],
    }
    logger.info(
        "Pre-training R^2 over %d functions: %s (paper %s)",
        exp.num_pretrain_functions,
        _fmt(results["pretraining"]["r2_mean"], results["pretraining"]["r2_std"]),
        _fmt(*PAPER_PRETRAINING_R2),
    )
    del trainer, model

    # --- adaptation -------------------------------------------------------------------------------------
    for setting in settings:
        model = NeuralInterpreterForSetRegression.from_pretrained(pretrain_dir)
        torch.manual_seed(base_args.seed + 1)  # the same fresh CLS tokens in every setting
        model.neural_interpreter.reset_task_tokens(adapt_names)
        counts = set_adaptation_trainable(model, setting)
        param_groups = None
        if exp.adapt_pretrained_learning_rate is not None:
            param_groups = adaptation_param_groups(
                model, exp.adapt_learning_rate, exp.adapt_pretrained_learning_rate
            )
        logger.info("Adaptation %r: trainable parameters %s", setting, counts)
        set_seed(base_args.seed)
        adapt_args = phase_arguments(
            base_args,
            output_dir / f"adapt-{setting}",
            exp.adapt_learning_rate,
            per_device_batch,
            sizes["adapt_epochs"],
            sizes["adapt_max_steps"],
        )
        trainer = make_trainer(
            model, adapt_args, datasets["adapt"]["train"], datasets["adapt"]["test"], param_groups
        )
        info = ADAPTATION_SETTINGS[setting]
        results["adaptation"][setting] = {
            "label": info["label"],
            "trainable_parameters": counts,
            **train_phase(trainer),
            **evaluate(trainer, model, datasets["adapt"]["test"], sizes["batch_size"]),
            "paper_r2_mean": info["paper"][0],
            "paper_r2_std": info["paper"][1],
        }
        logger.info(
            "Adaptation %r: R^2 over %d new functions: %s (paper %s)",
            setting,
            len(adapt_names),
            _fmt(results["adaptation"][setting]["r2_mean"], results["adaptation"][setting]["r2_std"]),
            _fmt(*info["paper"]),
        )
        del trainer, model

    # --- results, model card, upload --------------------------------------------------------------------
    results["environment"] = environment(base_args)
    results["wall_time_s"] = time.perf_counter() - start_time
    if base_args.process_index != 0:
        return results
    (output_dir / RESULTS_JSON).write_text(json.dumps(results, indent=2) + "\n")
    markdown = results_markdown(results)
    (output_dir / RESULTS_MD).write_text(markdown)
    print(markdown)
    logger.info("Results written to %s and %s", output_dir / RESULTS_JSON, output_dir / RESULTS_MD)
    test_inputs = {"pretrain": datasets["pretrain"]["test"].inputs}
    test_inputs.update({f"adapt-{setting}": datasets["adapt"]["test"].inputs for setting in settings})
    routing = routing_section(output_dir, test_inputs)
    card_path = write_model_card(
        output_dir, results, markdown, repo_id, argv, exp.model_card_template, routing
    )
    logger.info("Model card written to %s", card_path)
    if push_to_hub:
        push(output_dir, repo_id, base_args)
    return results


if __name__ == "__main__":
    main()
