"""The heads on the task (CLS) tokens, their losses, and the adaptation of a classifier to new tasks.

One LayerNorm + Linear head reads one task token's output (paper, section 3: a CLS token per task, as the reference's
`MultiViT`); the image classifiers keep one head per task and classify each sample with its own task's, the
multiple-choice models score each candidate with one. Every model folder holds a copy of this file (marked "Copied
from", checked by tests/test_model_copies.py), which its checkpoints copy next to the modeling file.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from torch import nn
from transformers.loss.loss_utils import fixed_cross_entropy

from .configuration_checks import validate_task_names
from .modeling_checks import resolve_task_ids


class TaskHead(nn.Module):
    """LayerNorm + Linear on one task token's output."""

    def __init__(self, hidden_size: int, num_outputs: int, eps: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden_size, eps=eps)
        self.linear = nn.Linear(hidden_size, num_outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self.norm(x))


# ----------------------------------------------------------------------------------------------------------
# Losses
# ----------------------------------------------------------------------------------------------------------


class LossSettings(NamedTuple):
    """What transformers' classification loss reads of a config, with the problem type already inferred."""

    num_labels: int
    problem_type: str


def class_indices(labels: torch.Tensor, num_classes: int, batch_size: int, what: str) -> torch.Tensor:
    """(B,) long labels, each in 0..num_classes - 1 or -100 (not counted); a ValueError naming the labels else.

    The range check is one host sync in eager execution, none while compiling.
    """
    if labels.is_floating_point() or labels.dtype == torch.bool or labels.numel() != batch_size:
        raise ValueError(
            f"`labels` must be integer {what} indices of shape (batch,) = ({batch_size},), got {labels.dtype} labels "
            f"of shape {tuple(labels.shape)}."
        )
    labels = labels.long().reshape(-1)
    if (
        not labels.is_meta
        and not torch.compiler.is_compiling()
        and bool(((labels != -100) & ((labels < 0) | (labels >= num_classes))).any())
    ):
        raise ValueError(
            f"`labels` must be {what} indices in 0..{num_classes - 1} (or -100), got {labels.tolist()}."
        )
    return labels


def labelled_count(labels: torch.Tensor) -> torch.Tensor:
    """How many labels count (are not -100), at least 1: a batch with none has loss 0, not 0/0."""
    return (labels != -100).sum().clamp_min(1)


def multiple_choice_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the scores (B, K) against the correct candidates (B,), averaged over the labelled puzzles."""
    labels = class_indices(labels.to(logits.device), logits.shape[1], logits.shape[0], "candidate")
    return fixed_cross_entropy(logits.float(), labels, num_items_in_batch=labelled_count(labels))


def infer_problem_type(num_labels: int, labels: torch.Tensor) -> str:
    """transformers' rule: one label is regression, int64/int32 labels single-label, others multi-label."""
    if num_labels == 1:
        return "regression"
    if labels.dtype in (torch.long, torch.int):
        return "single_label_classification"
    return "multi_label_classification"


def checked_labels(labels: torch.Tensor, logits: torch.Tensor, problem_type: str) -> torch.Tensor:
    """The labels in the form the loss of `problem_type` takes; a ValueError naming their dtype and shape else."""
    batch_size, num_labels = logits.shape
    if problem_type == "regression":
        if labels.numel() != batch_size * num_labels or labels.dtype == torch.bool:
            raise ValueError(
                f"Regression `labels` must be numbers of shape (batch, {num_labels}), got {labels.dtype} labels of "
                f"shape {tuple(labels.shape)}."
            )
        return labels.float().reshape(logits.shape)
    if problem_type == "single_label_classification":
        if labels.is_floating_point() or labels.dtype == torch.bool or labels.numel() != batch_size:
            raise ValueError(
                f"Single-label classification needs integer class indices of shape (batch,), got "
                f"{labels.dtype} labels of shape {tuple(labels.shape)}."
            )
        return class_indices(labels, num_labels, batch_size, "class")
    if labels.shape != logits.shape or not labels.is_floating_point():
        raise ValueError(
            f"Multi-label `labels` must be floats of shape (batch, num_labels) = {tuple(logits.shape)}, got "
            f"{labels.dtype} labels of shape {tuple(labels.shape)} (integer class indices of shape (batch,) "
            "need int64 or int32 labels, or problem_type 'single_label_classification')."
        )
    return labels.float()


# ----------------------------------------------------------------------------------------------------------
# Image classifiers: a head per task
# ----------------------------------------------------------------------------------------------------------


class TaskHeadsMixin:
    """One head per task (one for all when the config shares the task tokens) on the backbone's task tokens.

    The classifier keeps its heads in `self.classifier`; its backbone (`self.base_model`) has `task_tokens`,
    `reset_task_tokens` and `add_task_tokens`.
    """

    config: Any
    classifier: nn.ModuleList

    def _num_task_heads(self, num_tasks: int) -> int:
        return 1 if getattr(self.config, "share_task_tokens", False) else num_tasks

    def _fresh_heads(self, count: int) -> list[TaskHead]:
        """`count` task heads initialised as the model's own, on its device and in its dtype."""
        ref = self.base_model.task_tokens
        config = self.config
        heads = [TaskHead(config.hidden_size, config.num_labels, config.layer_norm_eps) for _ in range(count)]
        for head in heads:
            head.apply(self._init_weights)
        return [head.to(device=ref.device, dtype=ref.dtype) for head in heads]

    def reset_tasks(self, task_names: Sequence[str], num_labels: int | None = None) -> None:
        """New tasks: fresh CLS tokens and freshly initialised heads (e.g. few-shot adaptation to K-MNIST)."""
        names = validate_task_names(
            task_names
        )  # before any change: a refused call leaves the model as it was
        if num_labels is not None and (
            not isinstance(num_labels, int) or isinstance(num_labels, bool) or num_labels < 1
        ):
            raise ValueError(f"`num_labels` must be a positive integer, got {num_labels!r}.")
        if num_labels is not None:
            self.config.num_labels = self.num_labels = num_labels
        self.base_model.reset_task_tokens(names)
        self.classifier = nn.ModuleList(self._fresh_heads(self._num_task_heads(len(names))))
        self.record_built_settings()

    def add_tasks(self, task_names: Sequence[str]) -> list[int]:
        """Append tasks (a fresh CLS token and head each); the existing ones stay as they are. Returns their ids."""
        new_ids = self.base_model.add_task_tokens(task_names)
        if not getattr(self.config, "share_task_tokens", False):
            self.classifier.extend(self._fresh_heads(len(new_ids)))
        return new_ids

    def check_task_heads(self) -> None:
        """Refuse a classifier whose heads no longer match its tasks (changed through the backbone alone)."""
        if len(self.classifier) != self._num_task_heads(self.config.num_tasks):
            raise ValueError(
                f"The classifier has {len(self.classifier)} heads for {self.config.num_tasks} tasks: change tasks "
                "with the classifier's `reset_tasks` / `add_tasks`, which give each task its head, not with "
                "the backbone's `reset_task_tokens` / `add_task_tokens`."
            )

    def task_logits(self, pooled: torch.Tensor, task_ids: Any) -> torch.Tensor:
        """(B, num_labels): each sample's own task token (pooled (B, T, d)) through its own task's head."""
        samples = torch.arange(pooled.shape[0], device=pooled.device)
        task_ids = resolve_task_ids(task_ids, self.config, pooled.shape[0], pooled.device)
        own_token = pooled[samples, task_ids]  # (B, d)
        if len(self.classifier) == 1:
            return self.classifier[0](own_token)
        all_logits = torch.stack([head(own_token) for head in self.classifier], dim=1)  # (B, T, L)
        return all_logits[samples, task_ids]

    def classification_loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """transformers' loss of image classifiers (`self.loss_function`) for `config.problem_type`.

        Unset, the problem type is inferred as transformers does: one label is regression (MSE), integer labels
        (B,) single-label cross-entropy with -100 not counted (0 when no label counts), float labels
        (B, num_labels) multi-label (BCE with logits). It is written into the config once the labels were
        accepted, and not while compiling: a compiled graph guards on `problem_type is None`.
        """
        batch_size, num_labels = logits.shape
        labels = labels.to(logits.device)
        if labels.dim() == 0 or labels.shape[0] != batch_size:
            raise ValueError(
                f"`labels` must have one entry per sample ({batch_size}), got shape {tuple(labels.shape)}."
            )
        problem_type = self.config.problem_type or infer_problem_type(num_labels, labels)
        labels = checked_labels(labels, logits, problem_type)
        extra = {"num_items_in_batch": labelled_count(labels)} if labels.dtype == torch.long else {}
        loss = self.loss_function(labels, logits.float(), LossSettings(num_labels, problem_type), **extra)
        if self.config.problem_type is None and not torch.compiler.is_compiling():
            self.config.problem_type = problem_type
        return loss
