"""The card of an image-classification run (examples/run_image_classification.py, examples/run_digits.py): one
model-index result per dataset (task), its measured accuracy and where its data came from."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from .common import (
    NI_SUMMARY_KEYS,
    TEMPLATES,
    VIT_SUMMARY_KEYS,
    describe_hardware,
    is_number,
    mixed_precision,
    percent,
    render,
    template,
    training_hyperparameters,
)

DEFAULT_IMAGE_CLASSIFICATION_TEMPLATE = TEMPLATES / "image_classification_template.md"
DEFAULT_DIGITS_TEMPLATE = DEFAULT_IMAGE_CLASSIFICATION_TEMPLATE  # the digits runs' card is this card
# What a card of the paper's digits experiment adds to its limitations.
DIGITS_LIMITATIONS = (
    "The paper's recipe trains for 100 epochs on the full MNIST, MNIST-M and SVHN training sets (193,257 images in "
    "the paper; 192,258 with the MNIST-M release on the Hub, which has 59,001 training images) and reports 99.4% / "
    "98.4% / 96.2% test accuracy; the table above lists this run's settings.",
    "The training datasets carry their own terms: MNIST is CC BY-SA 3.0; MNIST-M blends MNIST with BSDS500 image "
    "patches (research use); SVHN is for non-commercial use. The licence in the metadata covers the code and "
    "weights, not the data.",
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
    from ...data.digits import HUB_DATASETS

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


def image_task_info(
    task: Any,
    eval_metrics: Mapping[str, Any],
    dataset_id: str | None = None,
    dataset_config: str | None = None,
) -> TaskCardInfo:
    """What a card says about one task of ``ni_hf.data.images.load_image_tasks`` (an ``ImageTask``): its source,
    its classes, its sizes and its measured accuracy; ``dataset_id``: the Hub dataset it was read from, if any."""
    classes = ", ".join(task.label_names[:12]) + (
        f", ... ({task.num_labels})" if task.num_labels > 12 else ""
    )
    return TaskCardInfo(
        name=task.name,
        dataset_id=dataset_id or task.name,
        dataset_config=dataset_config,
        pretty_name=task.name,
        source=task.source,
        train_samples=task.num_train,
        eval_samples=int(eval_metrics.get(f"eval_num_samples_{task.name}", task.num_eval)),
        accuracy=eval_metrics.get(f"eval_accuracy_{task.name}"),
        extra={"classes": classes},
    )


def digits_eval_results(tasks: Sequence[TaskCardInfo], split: str = "test") -> list[EvalResult]:
    """One model-index ``EvalResult`` (image classification, accuracy) per evaluated task."""
    results = []
    for task in tasks:
        if not is_number(task.accuracy):
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
                metric_name=f"{split.capitalize()} accuracy{samples}",
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
        eval_results=digits_eval_results(tasks, template_kwargs.get("eval_split_name", "test").lower())
        or None,
    )
    return render(
        card_data,
        template(template_path, DEFAULT_IMAGE_CLASSIFICATION_TEMPLATE),
        model_name=model_name,
        tasks=[_task_row(task) for task in tasks],
        overall_accuracy=percent(overall_accuracy),
        **template_kwargs,
    )


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
    script: str = "examples/run_digits.py",
    dataset_kind: str = "digit ",
    recipe_limitations: Sequence[str] = DIGITS_LIMITATIONS,
    eval_split_name: str = "Test",
) -> Path:
    """Write ``<output_dir>/README.md`` for an image-classification run (``script``: examples/run_digits.py, whose
    card adds the paper's recipe and the datasets' terms, or examples/run_image_classification.py); return its path.
    """
    vit = model.config.model_type == "ni_multitask_vit"
    card = build_digits_model_card(
        template_path=template_path,
        model_name=repo_id.split("/")[-1],
        tasks=tasks,
        overall_accuracy=eval_metrics.get("eval_accuracy"),
        hub_datasets=[task.dataset_id for task in tasks if "/" in task.dataset_id],
        tags=[
            tag
            for tag in (VIT_CARD_TAGS if vit else NI_CARD_TAGS)
            if dataset_kind == "digit " or tag != "digits"
        ],
        repo_id=repo_id,
        eval_samples_total=int(eval_metrics.get("eval_num_samples", 0)),
        eval_subset_note=_eval_subset_note(max_eval_samples),
        randaugment=randaugment,
        preset=preset,
        training_command=command,
        launcher_note=launcher_note,
        extra_limitations=list(extra_limitations),
        script=script,
        dataset_kind=dataset_kind,
        recipe_limitations=list(recipe_limitations),
        eval_split_name=eval_split_name,
        **_model_fields(model, vit),
        **_training_fields(training_args, optimizer, train_metrics),
    )
    path = Path(output_dir) / "README.md"
    card.save(path)
    return path


def _eval_subset_note(max_eval_samples: int | None) -> str:
    """The card's warning that the accuracies are estimates, when the run evaluated a subset of each test set."""
    if max_eval_samples is None:
        return ""
    return (
        f"Evaluated on at most {max_eval_samples} test samples per dataset (a seeded random subset), not the "
        "full test sets: the accuracies are estimates."
    )


def _model_fields(model: Any, vit: bool) -> dict[str, Any]:
    """The template's fields that describe the model: its config, architecture, class and parameter counts."""
    config = model.config
    return {
        "config": config,
        "architecture": "vit" if vit else "neural_interpreter",
        "model_class": type(model).__name__,
        "config_summary": {
            key: getattr(config, key) for key in (VIT_SUMMARY_KEYS if vit else NI_SUMMARY_KEYS)
        },
        "num_parameters": f"{sum(p.numel() for p in model.parameters()):,}",
        "num_trainable_parameters": f"{sum(p.numel() for p in model.parameters() if p.requires_grad):,}",
    }


def _training_fields(training_args: Any, optimizer: str, train_metrics: Mapping[str, Any]) -> dict[str, Any]:
    """The template's fields that describe the training: hyperparameters, hardware, run time and versions."""
    import transformers

    from ... import __version__

    runtime = train_metrics.get("train_runtime")
    return {
        "hyperparameters": training_hyperparameters(training_args, optimizer, train_metrics),
        "hardware": describe_hardware(
            str(training_args.device), training_args.world_size, mixed_precision(training_args)
        ),
        "train_runtime": f"{runtime:.0f} s" if runtime is not None else "not trained in this run",
        "transformers_version": transformers.__version__,
        "ni_hf_version": __version__,
    }


def _task_row(task: TaskCardInfo) -> Mapping[str, Any]:
    """The fields of one task as the template's results and data tables show them."""
    return {
        "name": task.name,
        "dataset_id": task.dataset_id,
        "pretty_name": task.pretty_name,
        "source": task.source,
        "train_samples": "-" if task.train_samples is None else task.train_samples,
        "eval_samples": "-" if task.eval_samples is None else task.eval_samples,
        "accuracy": percent(task.accuracy) or "not evaluated",
        **task.extra,
    }
