"""Model cards for trained Neural Interpreters: Hub metadata (model-index) plus a Jinja template.

:func:`build_digits_model_card` and :func:`build_fuzzy_boolean_model_card` render templates
(``ni_hf/training/model_cards/*_template.md``) with :meth:`huggingface_hub.ModelCard.from_template`. The
measured numbers go into the card's YAML header as ``model-index`` results (one
:class:`huggingface_hub.EvalResult` per dataset, or per phase of the fuzzy-Boolean experiment), so the Hub shows
them and ``huggingface_hub.ModelCard.load(path).data.eval_results`` reads them back.
"""

from __future__ import annotations

import math
import numbers
import os
import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData

__all__ = [
    "DEFAULT_DIGITS_TEMPLATE",
    "DEFAULT_FUZZY_BOOLEAN_TEMPLATE",
    "TaskCardInfo",
    "build_digits_model_card",
    "build_fuzzy_boolean_model_card",
    "describe_hardware",
    "digits_task_info",
    "digits_eval_results",
    "fuzzy_boolean_eval_results",
    "mixed_precision",
    "training_hyperparameters",
    "write_digits_model_card",
]

# The templates ship with the package (the repository's top-level ``model_cards/`` links to this folder).
TEMPLATES = Path(__file__).resolve().parent / "model_cards"
DEFAULT_DIGITS_TEMPLATE = TEMPLATES / "digits_template.md"
DEFAULT_FUZZY_BOOLEAN_TEMPLATE = TEMPLATES / "fuzzy_boolean_template.md"
NI_CARD_TAGS = ("neural-interpreters", "image-classification", "multi-task", "digits", "ni_hf")
VIT_CARD_TAGS = (
    "vit",
    "neural-interpreters-baseline",
    "image-classification",
    "multi-task",
    "digits",
    "ni_hf",
)
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


DIGITS_PRETTY_NAMES = {
    "mnist": "MNIST",
    "mnistm": "MNIST-M",
    "svhn": "SVHN (cropped digits)",
    "kmnist": "Kuzushiji-MNIST",
    "fashion_mnist": "Fashion-MNIST",
    "sklearn_digits": "scikit-learn digits (8x8)",
}


def digits_task_info(
    name: str, source: str, data_dir: str | None, n_train: int, n_eval: int, eval_metrics: Mapping[str, Any]
) -> TaskCardInfo:
    """What a digits card says about one dataset: where it came from, its sizes, its measured accuracy."""
    from ..data.digits import HUB_DATASETS

    spec = HUB_DATASETS.get(name)
    if source == "hub" and spec is not None:
        dataset_id, config_name, origin = spec.repo_id, spec.config, f"Hub: `{spec.repo_id}`"
    elif source == "sklearn":
        dataset_id, config_name, origin = (
            name,
            None,
            "scikit-learn `load_digits` (stratified 80/20 split, seed 0)",
        )
    else:
        dataset_id, config_name, origin = name, None, f"local files under `{data_dir}`"
    return TaskCardInfo(
        name=name,
        dataset_id=dataset_id,
        pretty_name=DIGITS_PRETTY_NAMES.get(name, name),
        source=origin,
        train_samples=n_train,
        eval_samples=int(eval_metrics.get(f"eval_num_samples_{name}", n_eval)),
        accuracy=eval_metrics.get(f"eval_accuracy_{name}"),
        dataset_config=config_name,
    )


def digits_eval_results(tasks: Sequence[TaskCardInfo], split: str = "test") -> list[EvalResult]:
    """One model-index ``EvalResult`` (image classification, accuracy) per evaluated task."""
    results = []
    for task in tasks:
        if not _is_number(task.accuracy):
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
    """Render the digits card: model-index metadata from ``tasks``, text from the template (it lists its variables)."""
    card_data = ModelCardData(
        model_name=model_name,
        library_name="transformers",
        pipeline_tag="image-classification",
        license=license,
        tags=list(tags),
        datasets=list(hub_datasets) or None,
        metrics=["accuracy"],
        eval_results=digits_eval_results(tasks) or None,
    )
    return _render(
        card_data,
        _template(template_path, DEFAULT_DIGITS_TEMPLATE),
        model_name=model_name,
        tasks=[_task_row(task) for task in tasks],
        overall_accuracy=_percent(overall_accuracy),
        **template_kwargs,
    )


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


def write_digits_model_card(
    output_dir: str | os.PathLike,
    *,
    repo_id: str,
    model: Any,
    tasks: Sequence[TaskCardInfo],
    eval_metrics: Mapping[str, Any],
    train_metrics: Mapping[str, Any],
    training_args: Any,
    optimizer: str,
    command: str,
    launcher_note: str,
    randaugment: str | None,
    preset: str | None = None,
    max_eval_samples: int | None = None,
    template_path: str | os.PathLike | None = None,
    extra_limitations: Sequence[str] = (),
) -> Path:
    """Write ``<output_dir>/README.md`` for a digits run of ``examples/run_digits.py``; return its path."""
    import transformers

    from .. import __version__

    config = model.config
    vit = config.model_type == "ni_multitask_vit"
    runtime = train_metrics.get("train_runtime")
    card = build_digits_model_card(
        template_path=template_path,
        model_name=repo_id.split("/")[-1],
        tasks=tasks,
        overall_accuracy=eval_metrics.get("eval_accuracy"),
        hub_datasets=[task.dataset_id for task in tasks if "/" in task.dataset_id],
        tags=VIT_CARD_TAGS if vit else NI_CARD_TAGS,
        repo_id=repo_id,
        config=config,
        architecture="vit" if vit else "neural_interpreter",
        model_class=type(model).__name__,
        eval_samples_total=int(eval_metrics.get("eval_num_samples", 0)),
        eval_subset_note=(
            f"Evaluated on at most {max_eval_samples} test samples per dataset (a seeded random subset), not the "
            "full test sets: the accuracies are estimates."
            if max_eval_samples is not None
            else ""
        ),
        randaugment=randaugment,
        preset=preset,
        training_command=command,
        launcher_note=launcher_note,
        hyperparameters=training_hyperparameters(training_args, optimizer, train_metrics),
        config_summary={key: getattr(config, key) for key in (VIT_SUMMARY_KEYS if vit else NI_SUMMARY_KEYS)},
        num_parameters=f"{sum(p.numel() for p in model.parameters()):,}",
        num_trainable_parameters=f"{sum(p.numel() for p in model.parameters() if p.requires_grad):,}",
        hardware=describe_hardware(
            str(training_args.device), training_args.world_size, mixed_precision(training_args)
        ),
        train_runtime=f"{runtime:.0f} s" if runtime is not None else "not trained in this run",
        transformers_version=transformers.__version__,
        ni_hf_version=__version__,
        extra_limitations=list(extra_limitations),
    )
    path = Path(output_dir) / "README.md"
    card.save(path)
    return path


def _render(card_data: ModelCardData, template: Path, **template_kwargs: Any) -> ModelCard:
    """The one rendering path of every card: the template with its variables, dated now unless given a date."""
    template_kwargs.setdefault("date", datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"))
    return ModelCard.from_template(card_data, template_path=str(template), **template_kwargs)


def _percent(value: float | None) -> str | None:
    """Format an accuracy in [0, 1] as a percentage with two decimals, or None."""
    if not _is_number(value):
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


def _template(template_path: str | os.PathLike | None, default: Path) -> Path:
    path = Path(template_path) if template_path is not None else default
    if not path.is_file():
        raise FileNotFoundError(
            f"Model card template {path} not found; expected a Jinja template such as {default} (the package's "
            f"{default.name})."
        )
    return path


def _is_number(value: Any) -> bool:
    """A measured value: a real number, not None and not NaN (what a metric left unevaluated reads as)."""
    return isinstance(value, numbers.Real) and not math.isnan(value)


def fuzzy_boolean_eval_results(results: Mapping[str, Any]) -> list[EvalResult]:
    """One model-index ``EvalResult`` (mean R^2 over its functions) per phase of a run_fuzzy_boolean.py run."""
    arguments = results.get("arguments", {})
    form = arguments.get("function_form", "canonical")
    seed = arguments.get("dataset_seed", 0)
    adapt_seed = arguments.get("adapt_dataset_seed")
    # The Hub groups model-index results by task and dataset (type, config, split): one group for the
    # pre-training functions, one for the new functions, whose metrics name the adaptation setting.
    phases = [("pretraining", "pre-training functions", seed, "", results.get("pretraining", {}))]
    for info in results.get("adaptation", {}).values():
        group_seed = seed if adapt_seed is None else adapt_seed
        phases.append(("new", "new functions", group_seed, f"; adapted: {info['label']}", info))
    evaluated = []
    for kind, group, group_seed, setting, info in phases:
        if not _is_number(info.get("r2_mean")):
            continue
        evaluated.append(
            EvalResult(
                task_type="tabular-regression",
                task_name="Set regression of fuzzy Boolean functions",
                dataset_type=f"fuzzy-boolean-functions-{kind}",
                dataset_name=f"Fuzzy Boolean functions of 5 variables ({group})",
                dataset_config=f"seed {group_seed}, {form} sums of products",
                dataset_split="test",
                metric_type="r_squared",
                metric_name=f"R^2, mean over {info.get('num_functions', '?')} functions{setting}",
                metric_value=round(float(info["r2_mean"]), 6),
            )
        )
    return evaluated


def build_fuzzy_boolean_model_card(
    *,
    model_name: str,
    results: Mapping[str, Any],
    template_path: str | os.PathLike | None = None,
    license: str | None = "mit",
    tags: Sequence[str] = ("neural-interpreters", "fuzzy-boolean", "set-regression", "multi-task", "ni_hf"),
    routing: str = "",
    **template_kwargs: Any,
) -> ModelCard:
    """Render the fuzzy-Boolean card: model-index metadata from ``results`` (run_fuzzy_boolean.py's results
    dict), text from the Jinja template (``model_cards/fuzzy_boolean_template.md`` lists what it reads), and the
    ``routing`` Markdown (function usage, see ``ni_hf.visualization.write_set_routing_card_assets``) at its end."""
    card_data = ModelCardData(
        model_name=model_name,
        library_name="transformers",
        license=license,
        tags=list(tags),
        metrics=["r_squared"],
        eval_results=fuzzy_boolean_eval_results(results) or None,
    )
    card = _render(
        card_data,
        _template(template_path, DEFAULT_FUZZY_BOOLEAN_TEMPLATE),
        model_name=model_name,
        **template_kwargs,
    )
    if routing.strip():
        card.text = card.text.rstrip() + "\n\n" + routing.strip() + "\n"
    return card
