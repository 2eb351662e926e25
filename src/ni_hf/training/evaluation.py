"""Evaluation helpers: the multi-task accuracy metric (offline), R^2 per function, and routing density.

``evaluate.load("accuracy")`` fetches the metric script from the Hugging Face Hub.
This package instead ships its own metric script inside the package
(``ni_hf/metrics/multitask_accuracy/multitask_accuracy.py``) and loads it from
there, which works without network access. ``evaluate`` copies the script into
its module cache, ``$HF_HOME/modules/evaluate_modules`` (``HF_MODULES_CACHE``
overrides it); note that ``evaluate`` reads these variables when it is first
imported.

Multi-process evaluation: ``transformers.Trainer`` gathers predictions, labels and
inputs across processes (dropping the samples duplicated to pad the last batch)
before it calls ``compute_metrics``, so a ``compute_metrics`` function built from
these helpers computes on the complete evaluation set in every process and needs
no distributed logic of its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

METRICS_DIR = Path(__file__).resolve().parents[1] / "metrics"
MULTITASK_ACCURACY_DIR = METRICS_DIR / "multitask_accuracy"


class CopiedPredictionsMixin:
    """Trainer mixin: ``prediction_step`` returns copies of the model's loss and logits.

    Trainer's evaluation loop keeps each batch's logits until it concatenates them with the next batch's. A model
    run through CUDA graphs (``torch_compile_mode="reduce-overhead"``, dynamo's "cudagraphs" backend) returns its
    outputs in static buffers that its next call overwrites: kept as they are, the first batch's logits would be
    lost (torch raises "accessing tensor output of CUDAGraphs that has been overwritten"). Put it before ``Trainer``
    in the bases: ``class MyTrainer(CopiedPredictionsMixin, Trainer)``.
    """

    def prediction_step(self, *args: Any, **kwargs: Any) -> tuple[Any, Any, Any]:
        loss, logits, labels = super().prediction_step(*args, **kwargs)  # type: ignore[misc]
        return _copy_tensors(loss), _copy_tensors(logits), labels


def _copy_tensors(value: Any) -> Any:
    """``value`` with every tensor in it (nested tuples, lists, dicts) replaced by a copy."""
    from torch.utils._pytree import tree_map_only

    return tree_map_only(torch.Tensor, torch.clone, value)


def multitask_accuracy_path() -> str:
    """Return the folder of the bundled multi-task accuracy metric script."""
    return str(MULTITASK_ACCURACY_DIR)


def load_multitask_accuracy(**kwargs: Any) -> Any:
    """Load the bundled multi-task accuracy metric with ``evaluate.load`` (offline)."""
    import evaluate

    return evaluate.load(multitask_accuracy_path(), **kwargs)


def compute_multitask_accuracy(
    predictions: Sequence[int] | np.ndarray,
    references: Sequence[int] | np.ndarray,
    task_ids: Sequence[int] | np.ndarray,
    task_names: Sequence[str] | None = None,
) -> dict[str, float]:
    """Return ``accuracy`` and ``accuracy_<task>`` per task, computed with numpy."""
    preds = np.asarray(predictions).reshape(-1)
    refs = np.asarray(references).reshape(-1)
    tids = np.asarray(task_ids).reshape(-1)
    if not (len(preds) == len(refs) == len(tids)):
        raise ValueError(
            f"predictions, references and task_ids must have the same length, "
            f"got {len(preds)}, {len(refs)} and {len(tids)}"
        )
    for name, values in (("predictions", preds), ("references", refs), ("task_ids", tids)):
        # The shipped `evaluate` module stores int64 and would truncate 1.7 to 1; say so instead of differing.
        if values.dtype.kind == "f" and len(values) and not np.array_equal(values, np.round(values)):
            raise ValueError(
                f"{name} must be integer class or task ids, got non-integer values such as {values[0]}"
            )
    if len(tids) and tids.min() < 0:
        raise ValueError(f"task_ids must be non-negative, got {int(tids.min())}")
    correct = preds == refs
    if task_names is not None:
        names = [str(name) for name in task_names]
        if len(set(names)) != len(names):
            raise ValueError(f"task_names must be unique, got {names}")
        if len(tids) and tids.max() >= len(names):
            raise ValueError(f"task id {int(tids.max())} has no name in task_names={names}")
    else:
        num_tasks = int(tids.max()) + 1 if len(tids) else 0
        names = [f"task{i}" for i in range(num_tasks)]
    results = {"accuracy": float(correct.mean()) if len(correct) else math.nan}
    for task_id, name in enumerate(names):
        mask = tids == task_id
        results[f"accuracy_{name}"] = float(correct[mask].mean()) if mask.any() else math.nan
    return results


@torch.no_grad()
def evaluate_multitask_accuracy(
    model: torch.nn.Module,
    tests: Sequence[Any],
    task_names: Sequence[str],
    batch_size: int,
    **forward_kwargs: Any,
) -> dict[str, float]:
    """Test accuracy overall and per task (``accuracy_<task>``) of an image classifier (eval mode, gradients off) on
    datasets whose rows hold ``pixel_values``, ``labels`` and ``task_ids``; ``forward_kwargs`` go to its forward
    (e.g. ``disabled_functions``, ``num_function_iterations``)."""
    model.eval()
    device = next(model.parameters()).device
    predictions, labels, task_ids = [], [], []
    for batch in (
        test[start : start + batch_size] for test in tests for start in range(0, len(test), batch_size)
    ):
        pixel_values = torch.from_numpy(np.stack(batch["pixel_values"])).to(device)
        ids = torch.tensor(batch["task_ids"], device=device)
        logits = model(pixel_values=pixel_values, task_ids=ids, **forward_kwargs).logits
        predictions.append(logits.argmax(-1).cpu().numpy())
        labels.append(np.asarray(batch["labels"]))
        task_ids.append(np.asarray(batch["task_ids"]))
    return compute_multitask_accuracy(
        np.concatenate(predictions), np.concatenate(labels), np.concatenate(task_ids), task_names
    )


def make_compute_metrics(
    task_names: Sequence[str] | None = None,
    model_task_ids: Sequence[int] | None = None,
    metric: Any = None,
    num_labels: Sequence[int] | None = None,
) -> Callable[[Any], dict[str, float]]:
    """Build a ``Trainer`` ``compute_metrics`` that reports overall and per-task accuracy.

    The returned function expects ``EvalPrediction.label_ids`` to be the pair ``(labels, task_ids)``, which the
    Trainer produces with ``TrainingArguments(label_names=["labels", "task_ids"])``. Predictions may be logits or
    class ids; when the model returns a tuple, its first element is used. ``model_task_ids``: the model's task id
    of each of ``task_names`` (when the model knows more tasks than the data has, or orders them differently).
    ``metric``: an ``evaluate`` module such as ``load_multitask_accuracy()`` to compute the accuracies with
    (default: ``compute_multitask_accuracy``). From logits it also reports ``loss``, the mean cross-entropy over
    samples (the Trainer's own eval loss weighs every batch by the first batch's size), and with ``task_names``
    ``num_samples`` and ``num_samples_<task>``. ``num_labels``: each task's number of classes, when tasks have
    fewer than the heads' outputs (a task's prediction is then the best of its own classes).
    """
    names = list(task_names) if task_names is not None else None
    to_data = None
    if model_task_ids is not None:
        to_data = np.zeros(max(model_task_ids) + 1, dtype=np.int64)
        to_data[list(model_task_ids)] = np.arange(len(model_task_ids))

    def compute_metrics(eval_pred: Any) -> dict[str, float]:
        """Compute overall and per-task accuracy from a Trainer ``EvalPrediction``."""
        predictions = _first_predictions(eval_pred.predictions)
        labels, task_ids = _labels_and_task_ids(eval_pred.label_ids)
        if to_data is not None:
            task_ids = to_data[task_ids]
        if num_labels is not None and predictions.ndim > 1:
            predictions = _mask_other_tasks_classes(predictions, task_ids, num_labels)
        classes = predictions.argmax(axis=-1) if predictions.ndim > 1 else predictions
        if metric is None:
            results = compute_multitask_accuracy(classes, labels, task_ids, names)
        else:
            results = metric.compute(
                predictions=classes.tolist(),
                references=labels.tolist(),
                task_ids=task_ids.tolist(),
                task_names=names,
            )
        if predictions.ndim > 1:
            results["loss"] = _mean_cross_entropy(predictions, labels)
        if names is not None:
            results |= _sample_counts(labels, task_ids, names)
        return results

    return compute_metrics


def _first_predictions(predictions: Any) -> np.ndarray:
    """The predictions as an array: the first element when the model returned a tuple."""
    if isinstance(predictions, (tuple, list)):
        predictions = predictions[0]
    return np.asarray(predictions)


def _labels_and_task_ids(label_ids: Any) -> tuple[np.ndarray, np.ndarray]:
    """Split ``EvalPrediction.label_ids`` into flat ``labels`` and ``task_ids``, naming the setting when it is not
    the pair."""
    if not isinstance(label_ids, (tuple, list)) or len(label_ids) != 2:
        raise ValueError(
            "compute_metrics needs label_ids=(labels, task_ids); set "
            'TrainingArguments(label_names=["labels", "task_ids"])'
        )
    labels, task_ids = (np.asarray(x).reshape(-1) for x in label_ids)
    return labels, task_ids


def _mask_other_tasks_classes(
    logits: np.ndarray, task_ids: np.ndarray, num_labels: Sequence[int]
) -> np.ndarray:
    """Logits with -inf beyond each sample's task's own ``num_labels`` classes."""
    own = np.arange(logits.shape[-1])[None, :] < np.asarray(num_labels)[task_ids][:, None]
    return np.where(own, logits, -np.inf)


def _mean_cross_entropy(logits: np.ndarray, labels: np.ndarray) -> float:
    """Mean cross-entropy over samples, from logits (float64 log-softmax)."""
    logits = logits.astype(np.float64)
    shifted = logits - logits.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    return float(-log_probs[np.arange(len(labels)), labels].mean())


def _sample_counts(labels: np.ndarray, task_ids: np.ndarray, names: Sequence[str]) -> dict[str, int]:
    """``num_samples`` and ``num_samples_<task>`` of each task."""
    counts = {"num_samples": len(labels)}
    for task_id, name in enumerate(names):
        counts[f"num_samples_{name}"] = int((task_ids == task_id).sum())
    return counts


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


def compute_r2_metrics(eval_pred: Any) -> dict[str, float]:
    """Trainer ``compute_metrics`` of a multi-output regression: mean and min R^2 over the functions (columns)."""
    r2 = r2_per_function(eval_pred.predictions, eval_pred.label_ids)
    return {"r2_mean": float(np.mean(r2)), "r2_min": float(np.min(r2))}


@torch.no_grad()
def routing_density(model: torch.nn.Module, batches: Iterable[Mapping[str, torch.Tensor]]) -> dict[str, Any]:
    """Fraction of (function, token) pairs with C > 0 (Eq. 5) in each function iteration, over all batches.

    ``batches`` are keyword inputs of ``model`` (``{"pixel_values": ...}``, ``{"inputs": ...}``); the model is
    called with ``output_routing=True`` in eval mode, and its training mode is restored afterwards. Returns the
    density per function iteration (``per_iteration``), its ``mean``, the mean per function over iterations
    (``per_function_mean``), the mean number of functions a token is routed to (``functions_per_token_mean`` =
    U x mean), ``num_functions`` and ``num_samples``. A pair with C = 0 adds nothing to the function's attention
    (Eq. 6), so its work could be skipped.
    """
    was_training = model.training
    model.eval()
    try:
        return _routing_density(model, batches)
    finally:
        model.train(was_training)


def _routing_density(model: torch.nn.Module, batches: Iterable[Mapping[str, torch.Tensor]]) -> dict[str, Any]:
    """The counting of :func:`routing_density` (model already in eval mode, gradients off)."""
    device = next(model.parameters()).device
    positive: torch.Tensor | None = None  # (iterations, U) counts of C > 0
    pairs_per_function = 0
    num_samples = 0
    for batch in batches:
        inputs = {name: value.to(device) for name, value in batch.items()}
        compatibilities = model(**inputs, output_routing=True).compatibilities  # tuple of (B, U, N)
        if not compatibilities:
            raise ValueError("The model returned no compatibilities; is it a Neural Interpreter?")
        counts = torch.stack([(c > 0).sum(dim=(0, 2)).double().cpu() for c in compatibilities])
        positive = counts if positive is None else positive + counts
        pairs_per_function += compatibilities[0].shape[0] * compatibilities[0].shape[2]
        num_samples += compatibilities[0].shape[0]
    if positive is None:
        raise ValueError("routing_density needs at least one batch.")
    per_iteration_function = positive / pairs_per_function  # (iterations, U)
    per_iteration = per_iteration_function.mean(dim=1)
    num_functions = per_iteration_function.shape[1]
    return {
        "per_iteration": per_iteration.tolist(),
        "mean": per_iteration.mean().item(),
        "per_function_mean": per_iteration_function.mean(dim=0).tolist(),
        "functions_per_token_mean": num_functions * per_iteration.mean().item(),
        "num_functions": num_functions,
        "num_samples": num_samples,
    }
