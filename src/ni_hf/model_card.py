"""Model cards for trained Neural Interpreters: Hub metadata (model-index) plus a Jinja template.

:func:`build_digits_model_card` renders a template (``model_cards/digits_template.md`` in the
repository) with :meth:`huggingface_hub.ModelCard.from_template`. The measured accuracy of every
dataset goes into the card's YAML header as ``model-index`` results (one
:class:`huggingface_hub.EvalResult` per dataset), so the Hub shows them and
``huggingface_hub.ModelCard.load(path).data.eval_results`` reads them back.
"""

from __future__ import annotations

import math
import numbers
import os
import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData

__all__ = [
    "DEFAULT_DIGITS_TEMPLATE",
    "TaskCardInfo",
    "build_digits_model_card",
    "digits_eval_results",
    "describe_hardware",
]

# The template ships with the repository (not with the installed package): ``<repo>/model_cards/``.
DEFAULT_DIGITS_TEMPLATE = Path(__file__).resolve().parents[2] / "model_cards" / "digits_template.md"


@dataclass
class TaskCardInfo:
    """What the card says about one dataset (task).

    Args:
        name: task name, as in ``config.task_names`` (e.g. ``"mnist"``).
        dataset_id: dataset identifier for the model-index (a Hub dataset id such as ``"ylecun/mnist"``
            when the data came from the Hub, else the task name).
        pretty_name: human-readable dataset name.
        source: where the data was read from (Hub id, local folder, or scikit-learn).
        train_samples / eval_samples: number of training / evaluation samples used.
        accuracy: measured test accuracy in [0, 1], or None if not evaluated.
        dataset_config: the dataset's config name on the Hub, if any.
    """

    name: str
    dataset_id: str
    pretty_name: str
    source: str
    train_samples: int | None = None
    eval_samples: int | None = None
    accuracy: float | None = None
    dataset_config: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


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


def digits_eval_results(tasks: Sequence[TaskCardInfo], split: str = "test") -> list[EvalResult]:
    """One model-index ``EvalResult`` (image classification, accuracy) per evaluated task."""
    results = []
    for task in tasks:
        if task.accuracy is None or (isinstance(task.accuracy, numbers.Real) and math.isnan(task.accuracy)):
            continue
        samples = f" ({task.eval_samples} samples)" if task.eval_samples is not None else ""
        results.append(
            EvalResult(
                task_type="image-classification",
                task_name="Image Classification",
                dataset_type=task.dataset_id,
                dataset_name=task.pretty_name,
                dataset_config=task.dataset_config,
                dataset_split=split,
                metric_type="accuracy",
                metric_name=f"Test accuracy{samples}",
                metric_value=round(float(task.accuracy), 6),
            )
        )
    return results


def build_digits_model_card(
    *,
    model_name: str,
    tasks: Sequence[TaskCardInfo],
    template_path: str | os.PathLike | None = None,
    overall_accuracy: float | None = None,
    hub_datasets: Sequence[str] = (),
    license: str | None = "mit",
    tags: Sequence[str] = ("neural-interpreters", "image-classification", "multi-task", "digits", "ni_hf"),
    **template_kwargs: Any,
) -> ModelCard:
    """Render the digits model card: model-index metadata from ``tasks``, text from the Jinja template.

    ``template_kwargs`` are passed to the template as they are (see ``model_cards/digits_template.md`` for
    the variables it reads: ``training_command``, ``hardware``, ``config``, ``hyperparameters``, ...).
    """
    path = Path(template_path) if template_path is not None else DEFAULT_DIGITS_TEMPLATE
    if not path.is_file():
        raise FileNotFoundError(
            f"Model card template {path} not found; pass the path of model_cards/digits_template.md "
            "from the ni_hf repository."
        )
    eval_results = digits_eval_results(tasks)
    card_data = ModelCardData(
        model_name=model_name,
        library_name="transformers",
        pipeline_tag="image-classification",
        license=license,
        tags=list(tags),
        datasets=list(hub_datasets) or None,
        metrics=["accuracy"],
        eval_results=eval_results or None,
    )
    template_kwargs.setdefault("date", datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
    return ModelCard.from_template(
        card_data,
        template_path=str(path),
        model_name=model_name,
        tasks=[_task_row(task) for task in tasks],
        overall_accuracy=_percent(overall_accuracy),
        **template_kwargs,
    )


def _percent(value: float | None) -> str | None:
    """Format an accuracy in [0, 1] as a percentage with two decimals, or None."""
    if value is None or (isinstance(value, numbers.Real) and math.isnan(value)):
        return None
    return f"{100.0 * float(value):.2f}%"


def _task_row(task: TaskCardInfo) -> Mapping[str, Any]:
    """The fields of one task as the template's results and data tables show them."""
    return {
        "name": task.name,
        "dataset_id": task.dataset_id,
        "pretty_name": task.pretty_name,
        "source": task.source,
        "train_samples": "-" if task.train_samples is None else task.train_samples,
        "eval_samples": "-" if task.eval_samples is None else task.eval_samples,
        "accuracy": _percent(task.accuracy) or "not evaluated",
        **task.extra,
    }
