"""`FunctionUsage`: how much each function is used, C (Eq. 4) summed per function iteration, task, class, token."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..data.pgm_generator import META_TARGET_NAMES, RELATIONS
from .numbers import _step_name
from .trace import RoutingTrace, _check_trace, _class_labels

RELATION_TYPES = RELATIONS  # the relation types of PGM's meta targets, in DeepMind's column order


@dataclass
class FunctionUsage:
    """How much each function is used: C summed over tokens (Eq. 4 shares) per function iteration, task and class.

    Sums and token counts add over batches (`+`); the `by_*` means are the mean C of each function over those
    tokens (all N of each sample: task tokens and patches), and "none" is the share no function accepted. For a set
    input (set regression: every sample is read by every task's CLS token) a task's row is the mean C of that
    task's own CLS token (`task_source` "cls_token"), and there are no classes. For PGM puzzles (the sets of the
    chosen candidates) there is a row per token position (CLS, each context panel, the candidate), and the classes
    are the relation types of the puzzles' meta targets (`class_source` "meta_targets"; a puzzle counts for every
    relation it holds), none without them.
    """

    steps: list[tuple[int, int]]
    task_names: list[str]
    class_names: list[str]
    iteration_sums: np.ndarray  # (K, U)
    iteration_tokens: int
    task_sums: np.ndarray  # (T, U), over iterations too
    task_tokens: np.ndarray  # (T,)
    class_sums: np.ndarray  # (num_classes, U), over iterations too
    class_tokens: np.ndarray  # (num_classes,)
    num_samples: int
    class_source: str  # "labels" or "predictions" ("none" for a set input)
    # "samples": a task's row is over all tokens of its samples; "cls_token": over its own CLS token (a set input)
    task_source: str = "samples"
    position_names: list[str] = field(default_factory=list)  # the tokens of a PGM set, in order
    position_sums: np.ndarray | None = None  # (K, N, U): C summed over the samples, per token position
    position_samples: int = 0

    @classmethod
    def from_trace(
        cls, trace: RoutingTrace, labels: Sequence[int] | np.ndarray | torch.Tensor | None = None
    ) -> FunctionUsage:
        """Usage of one trace; classes from `labels`, or from the predictions when None."""
        _check_trace(trace)
        if trace.is_multiple_choice:
            if labels is not None:
                raise ValueError(
                    "A PGM trace is split by relation type, not by class: give the puzzles' meta_targets (and "
                    "labels, the correct candidates) to trace_routing."
                )
            return cls._of_puzzles(trace)
        if trace.is_set:
            if labels is not None:
                raise ValueError("A set input has no classes: its labels are regression targets.")
            return cls._of_set(trace)
        return cls._of_images(
            trace, _class_labels(trace, labels), "predictions" if labels is None else "labels"
        )

    @classmethod
    def _of_images(cls, trace: RoutingTrace, classes: np.ndarray, class_source: str) -> FunctionUsage:
        """Rows per function iteration, per task (its samples' tokens) and per class."""
        c = trace.compatibilities.astype(np.float64)  # (K, B, U, N)
        k, b, u, n = c.shape
        per_sample = c.sum(axis=(0, 3))  # (B, U)
        num_tasks = len(trace.task_names)
        num_classes = max(len(trace.class_names), int(classes.max()) + 1)
        task_sums = np.zeros((num_tasks, u))
        np.add.at(task_sums, trace.task_ids, per_sample)
        class_sums = np.zeros((num_classes, u))
        np.add.at(class_sums, classes, per_sample)
        return cls(
            steps=list(trace.steps),
            task_names=list(trace.task_names),
            class_names=trace.class_names + [str(i) for i in range(len(trace.class_names), num_classes)],
            iteration_sums=c.sum(axis=(1, 3)),
            iteration_tokens=b * n,
            task_sums=task_sums,
            task_tokens=np.bincount(trace.task_ids, minlength=num_tasks) * k * n,
            class_sums=class_sums,
            class_tokens=np.bincount(classes, minlength=num_classes) * k * n,
            num_samples=b,
            class_source=class_source,
        )

    @classmethod
    def _of_set(cls, trace: RoutingTrace) -> FunctionUsage:
        """Rows per function iteration and per task's own CLS token; no classes."""
        c = trace.compatibilities.astype(np.float64)  # (K, B, U, N)
        k, b, u, n = c.shape
        num_tasks = trace.num_task_tokens
        return cls(
            steps=list(trace.steps),
            task_names=list(trace.task_names),
            class_names=[],
            iteration_sums=c.sum(axis=(1, 3)),
            iteration_tokens=b * n,
            task_sums=c[..., :num_tasks].sum(axis=(0, 1)).T,  # (T, U): C of each task's own CLS token
            task_tokens=np.full(num_tasks, k * b),
            class_sums=np.zeros((0, u)),
            class_tokens=np.zeros(0, dtype=np.int64),
            num_samples=b,
            class_source="none",
            task_source="cls_token",
        )

    @classmethod
    def _of_puzzles(cls, trace: RoutingTrace) -> FunctionUsage:
        """Rows per function iteration, token position and relation type of the meta targets (when given)."""
        c = trace.compatibilities.astype(np.float64)  # (K, B, U, N)
        k, b, u, n = c.shape
        if trace.meta_targets is None:
            relations, membership = [], np.zeros((b, 0))
        else:
            relations = list(RELATION_TYPES)
            columns = [META_TARGET_NAMES.index(name) for name in relations]
            membership = trace.meta_targets[:, columns].astype(np.float64)  # (B, R)
        return cls(
            steps=list(trace.steps),
            task_names=list(trace.task_names),
            class_names=relations,
            iteration_sums=c.sum(axis=(1, 3)),
            iteration_tokens=b * n,
            task_sums=c.sum(axis=(0, 1, 3))[None],  # (1, U): the one task
            task_tokens=np.array([k * b * n]),
            class_sums=membership.T @ c.sum(axis=(0, 3)),
            class_tokens=membership.sum(axis=0).astype(np.int64) * k * n,
            num_samples=b,
            class_source="none" if trace.meta_targets is None else "meta_targets",
            position_names=[*trace.token_names[0][:-1], "candidate"],
            position_sums=c.sum(axis=1).transpose(0, 2, 1),  # (K, N, U)
            position_samples=b,
        )

    def __add__(self, other: FunctionUsage) -> FunctionUsage:
        if not isinstance(other, FunctionUsage):
            return NotImplemented
        different = "Only usages of the same model and function iterations add up."
        if (self.steps, self.task_names, self.task_source) != (
            other.steps,
            other.task_names,
            other.task_source,
        ):
            raise ValueError(different)
        if self.class_source != other.class_source:
            raise ValueError(
                f"Usages counted by {self.class_source} and by {other.class_source} do not add up."
            )
        if self.position_names != other.position_names:
            raise ValueError(different)
        classes = max(len(self.class_names), len(other.class_names))

        def pad(a: np.ndarray) -> np.ndarray:
            return np.pad(a, [(0, classes - len(a))] + [(0, 0)] * (a.ndim - 1))

        return FunctionUsage(
            steps=self.steps,
            task_names=self.task_names,
            class_names=max(self.class_names, other.class_names, key=len),
            iteration_sums=self.iteration_sums + other.iteration_sums,
            iteration_tokens=self.iteration_tokens + other.iteration_tokens,
            task_sums=self.task_sums + other.task_sums,
            task_tokens=self.task_tokens + other.task_tokens,
            class_sums=pad(self.class_sums) + pad(other.class_sums),
            class_tokens=pad(self.class_tokens) + pad(other.class_tokens),
            num_samples=self.num_samples + other.num_samples,
            class_source=self.class_source,
            task_source=self.task_source,
            position_names=self.position_names,
            position_sums=None if self.position_sums is None else self.position_sums + other.position_sums,
            position_samples=self.position_samples + other.position_samples,
        )

    @property
    def by_iteration(self) -> np.ndarray:
        """(K, U): mean C of each function at each function iteration."""
        return self.iteration_sums / max(self.iteration_tokens, 1)

    @property
    def by_task(self) -> np.ndarray:
        """(T, U): mean C of each function over the function iterations, for the samples of each task (NaN: none),
        or of each task's CLS token (`task_source` "cls_token")."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.task_sums / self.task_tokens[:, None]

    @property
    def by_class(self) -> np.ndarray:
        """(classes, U): mean C of each function over the function iterations, for the samples of each class (of a
        PGM trace: for the puzzles holding each relation type)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.class_sums / self.class_tokens[:, None]

    @property
    def by_position_iteration(self) -> np.ndarray:
        """(K, N, U): mean C of each function for each token position of a PGM set, at each function iteration."""
        if self.position_sums is None:
            return np.zeros((len(self.steps), 0, self.iteration_sums.shape[1]))
        return self.position_sums / max(self.position_samples, 1)

    @property
    def by_position(self) -> np.ndarray:
        """(N, U): mean C of each function for each token position of a PGM set, over the function iterations."""
        return self.by_position_iteration.mean(axis=0)

    def rows(self) -> list[tuple[str, np.ndarray]]:
        """(row name, mean C per function) for every function iteration, task, token position (a PGM set) and class
        (relation type) that has samples."""
        rows = [(_step_name(self.steps, i), self.by_iteration[i]) for i in range(len(self.steps))]
        task = "CLS token of {}" if self.task_source == "cls_token" else "task {}"
        rows += [
            (task.format(t), v)
            for t, v, m in zip(self.task_names, self.by_task, self.task_tokens, strict=True)
            if m
        ]
        rows += [(f"token {name}", v) for name, v in zip(self.position_names, self.by_position, strict=True)]
        group = "relation {}" if self.class_source == "meta_targets" else "class {}"
        rows += [
            (group.format(c), v)
            for c, v, m in zip(self.class_names, self.by_class, self.class_tokens, strict=True)
            if m
        ]
        return rows

    def to_dict(self) -> dict[str, Any]:
        """The means as plain lists (JSON-ready), with the names of rows and functions."""

        def clean(a: np.ndarray) -> list:
            return [[None if np.isnan(x) else round(float(x), 6) for x in row] for row in a]

        data = {
            "functions": [f"function {u}" for u in range(self.iteration_sums.shape[1])],
            "iterations": [_step_name(self.steps, i) for i in range(len(self.steps))],
            "by_iteration": clean(self.by_iteration),
            "tasks": self.task_names,
            "by_task": clean(self.by_task),
            "classes": self.class_names,
            "by_class": clean(self.by_class),
            "num_samples": self.num_samples,
            "class_source": self.class_source,
            "task_source": self.task_source,
        }
        if self.position_names:
            data["positions"] = self.position_names
            data["by_position"] = clean(self.by_position)
            data["by_position_iteration"] = [clean(a) for a in self.by_position_iteration]
        return data

    def to_markdown(self) -> str:
        """A Markdown table: one row per function iteration, task and class; mean C per function and 'none'."""
        num_functions = self.iteration_sums.shape[1]
        header = "| | " + " | ".join(f"function {u}" for u in range(num_functions)) + " | none |"
        lines = [header, "|---" * (num_functions + 2) + "|"]
        for name, values in self.rows():
            cells = [f"{v:.3f}" for v in values] + [f"{max(0.0, 1.0 - float(values.sum())):.3f}"]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        return "\n".join(lines)
