"""What every model card shares: the rendering of a Jinja template with Hub metadata (model-index), the
hardware and hyperparameter lines, and the template checks."""

from __future__ import annotations

import math
import numbers
import os
import platform
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from huggingface_hub import ModelCard, ModelCardData

# The templates ship with the package, beside this file.
TEMPLATES = Path(__file__).resolve().parent

# The config settings a digits card lists, per architecture.
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


def mixed_precision(args: Any) -> str:
    """The autocast of a TrainingArguments run as `describe_hardware` and the results name it: bf16, fp16 or no."""
    return "bf16" if args.bf16 else "fp16" if args.fp16 else "no"


def describe_hardware(device: str | None = None, world_size: int = 1, mixed_precision: str = "no") -> str:
    """One line naming the processors the run used: CPU model and cores, GPUs, processes, precision."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    parts = [f"{cpu} ({os.cpu_count()} logical CPU cores visible)"]
    if device is not None and str(device).startswith("cuda") and torch.cuda.is_available():
        names = sorted({torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())})
        parts.append(f"{torch.cuda.device_count()} x GPU ({', '.join(names)})")
    elif device is not None:
        parts.append(f"device {device}")
    parts.append(f"{world_size} process{'es' if world_size != 1 else ''}")
    parts.append(f"mixed precision: {mixed_precision}")
    parts.append(f"torch {torch.__version__}")
    return "; ".join(parts)


def training_hyperparameters(args: Any, optimizer: str, train_metrics: Mapping[str, Any]) -> dict[str, Any]:
    """The hyperparameter table of a card, from a run's TrainingArguments and train metrics."""
    world_size = getattr(args, "world_size", 1)
    schedule = getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type)
    return {
        "optimizer": optimizer,
        "betas, epsilon": f"({args.adam_beta1}, {args.adam_beta2}), {args.adam_epsilon}",
        "weight decay": args.weight_decay,
        "learning rate": f"{args.learning_rate:g}",
        "schedule": f"{schedule} {args.lr_scheduler_kwargs or ''}, warm-up steps {args.warmup_steps}",
        "batch size (global)": args.per_device_train_batch_size
        * world_size
        * args.gradient_accumulation_steps,
        "epochs": f"{train_metrics.get('epoch', args.num_train_epochs):g}",
        "optimizer steps": train_metrics.get("global_step", "-"),
        "seed": args.seed,
        "processes": world_size,
        "mixed precision": mixed_precision(args),
    }


def render(card_data: ModelCardData, template: Path, **template_kwargs: Any) -> ModelCard:
    """The one rendering path of every card: the template with its variables, dated now unless given a date."""
    template_kwargs.setdefault("date", datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"))
    return ModelCard.from_template(card_data, template_path=str(template), **template_kwargs)


def percent(value: float | None) -> str | None:
    """Format an accuracy in [0, 1] as a percentage with two decimals, or None."""
    if not is_number(value):
        return None
    return f"{100.0 * float(value):.2f}%"


def template(template_path: str | os.PathLike | None, default: Path) -> Path:
    path = Path(template_path) if template_path is not None else default
    if not path.is_file():
        raise FileNotFoundError(
            f"Model card template {path} not found; expected a Jinja template such as {default} (the package's "
            f"{default.name})."
        )
    return path


def check_model_card_template(path: str | os.PathLike, option: str = "--model_card_template") -> None:
    """Refuse a card template that does not exist or does not parse as Jinja, naming ``option`` and the line."""
    import jinja2

    if not Path(path).is_file():
        raise ValueError(f"{option} {path} does not exist.")
    try:
        jinja2.Environment().parse(Path(path).read_text())
    except jinja2.TemplateSyntaxError as error:
        raise ValueError(f"{option} {path}: {error} (line {error.lineno}).") from None


def is_number(value: Any) -> bool:
    """A measured value: a real number, not None and not NaN (what a metric left unevaluated reads as)."""
    return isinstance(value, numbers.Real) and not math.isnan(value)
