"""Multi-task accuracy: overall accuracy plus one accuracy per task.

This file is an ``evaluate`` metric script. ``evaluate.load`` copies it into its
module cache (``$HF_HOME/modules/evaluate_modules`` by default), so it must stay
self-contained: it imports nothing from ``ni_hf``. The same computation is
available without ``evaluate`` as ``ni_hf.training.evaluation.compute_multitask_accuracy``.

Load it offline with ``ni_hf.training.evaluation.load_multitask_accuracy()`` or with
``evaluate.load("<path to this folder>")``.

Distributed evaluation: when used from a ``transformers.Trainer``
``compute_metrics`` function, the Trainer has already gathered predictions,
labels and inputs from all processes (and dropped the samples duplicated to pad
the last batch) before calling ``compute_metrics``, so the metric just computes on
what it receives. Do not also pass ``num_process``/``process_id`` in that case.
"""

from __future__ import annotations

import math

import datasets
import evaluate
import numpy as np

_DESCRIPTION = """\
Accuracy over all samples and per task for multi-task classification.
Each sample carries a task id; ``accuracy`` is the fraction of correct predictions
over all samples (tasks weighted by their number of samples) and
``accuracy_<task name>`` the fraction of correct predictions within one task.
"""

_KWARGS_DESCRIPTION = """\
Args:
    predictions (`list` of `int`): predicted class ids.
    references (`list` of `int`): true class ids.
    task_ids (`list` of `int`): task index of each sample (0-based).
    task_names (`list` of `str`, optional): name of each task index; keys become
        `accuracy_<name>`. Without names the keys are `accuracy_task<i>` for every
        task index from 0 to the largest one seen.
Returns:
    `accuracy` (`float`): overall accuracy (NaN when there are no samples).
    `accuracy_<task>` (`float`): accuracy of one task (NaN when that task has no samples).
Examples:
    >>> metric = evaluate.load("path/to/multitask_accuracy")
    >>> metric.compute(predictions=[1, 0, 2, 2], references=[1, 1, 2, 0], task_ids=[0, 0, 1, 1],
    ...                task_names=["mnist", "svhn"])
    {'accuracy': 0.5, 'accuracy_mnist': 0.5, 'accuracy_svhn': 0.5}
"""

_CITATION = """\
@inproceedings{rahaman2021dynamic,
  title={Dynamic Inference with Neural Interpreters},
  author={Rahaman, Nasim and Gondal, Muhammad Waleed and Joshi, Shruti and Gehler, Peter and
          Bengio, Yoshua and Locatello, Francesco and Sch{\\"o}lkopf, Bernhard},
  booktitle={Advances in Neural Information Processing Systems},
  year={2021}
}
"""


def _multitask_accuracy(
    predictions: np.ndarray | list[int],
    references: np.ndarray | list[int],
    task_ids: np.ndarray | list[int],
    task_names: list[str] | None = None,
) -> dict[str, float]:
    """Compute overall and per-task accuracy with numpy."""
    preds = np.asarray(predictions).reshape(-1)
    refs = np.asarray(references).reshape(-1)
    tids = np.asarray(task_ids).reshape(-1)
    if not (len(preds) == len(refs) == len(tids)):
        raise ValueError(
            f"predictions, references and task_ids must have the same length, "
            f"got {len(preds)}, {len(refs)} and {len(tids)}"
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


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class MultitaskAccuracy(evaluate.Metric):
    """Overall and per-task accuracy for multi-task classification."""

    def _info(self) -> evaluate.MetricInfo:
        """Describe the metric and its input features."""
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {
                    "predictions": datasets.Value("int64"),
                    "references": datasets.Value("int64"),
                    "task_ids": datasets.Value("int64"),
                }
            ),
            reference_urls=["https://arxiv.org/abs/2110.06399"],
        )

    def _compute(
        self,
        predictions: list[int],
        references: list[int],
        task_ids: list[int],
        task_names: list[str] | None = None,
    ) -> dict[str, float]:
        """Return overall accuracy and one accuracy per task."""
        return _multitask_accuracy(predictions, references, task_ids, task_names)
