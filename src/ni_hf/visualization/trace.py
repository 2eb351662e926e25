"""`trace_routing`: one forward pass of a Neural Interpreter, kept as numpy for every function iteration.

A small adapter per kind of model says how to feed it and what its trace keeps: an image model (the backbone or the
classifier) reads images or patches with task ids, a set-regression model reads a set, and the multiple-choice (PGM)
model scores each candidate on its own set, of which the trace keeps the chosen candidate's (and the correct one's).
A ViT has no function iterations: it is refused by name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..models.neural_interpreter.configuration_neural_interpreter import NeuralInterpreterConfig
from ..models.neural_interpreter.image_processing_neural_interpreter import unpatchify
from .checks import (
    _candidate_labels,
    _disabled_functions,
    _float_tensor,
    _function_iterations,
    _integers,
    _meta_targets,
    _out_of,
    _task_ids,
)


@dataclass
class RoutingTrace:
    """C, types t and Eq. 6 weights W of every function iteration (scripts in order) of one forward pass, as numpy."""

    compatibilities: np.ndarray  # (K, B, U, N): C_ui of each function iteration k
    types: np.ndarray  # (K, B, N, d_type): t_i, unit vectors
    signatures: np.ndarray  # (K, U, d_type): the normalised signatures s_u of iteration k's script
    steps: list[tuple[int, int]]  # (script, iteration within the script) of each k
    logits: np.ndarray | None  # (B, num_labels), None for the backbone
    task_ids: np.ndarray  # (B,); zeros for a set input, whose every sample is read by every task's CLS token
    num_task_tokens: int
    grid: tuple[int, int] | None  # the patch grid, None for a set input
    images: np.ndarray | None  # (B, H, W, 3) in [0, 1], for display
    attentions: np.ndarray | None  # (K, L, B, U, H, N, N): W of every LOC, or None
    task_names: list[str]
    class_names: list[str]
    disabled_functions: list[int]
    set_inputs: np.ndarray | None = None  # (B, N_in): the variables of a set-regression model
    regression: np.ndarray | None = None  # (B, T): a set-regression model's prediction for every task
    # A multiple-choice (PGM) trace: compatibilities, types and attentions are those of each puzzle's chosen candidate.
    panels: np.ndarray | None = None  # (B, context + choices, S, S) in [0, 1], for display
    labels: np.ndarray | None = None  # (B,): the correct candidate of each puzzle, when given
    meta_targets: np.ndarray | None = None  # (B, 12): each puzzle's meta-target bits, when given
    correct_compatibilities: np.ndarray | None = None  # (K, B, U, N): C of the correct candidate's set
    correct_types: np.ndarray | None = None  # (K, B, N, d_type): its types
    token_names: list[list[str]] | None = None  # per puzzle: "CLS", "context 1", ..., "candidate k" (from 1)

    @property
    def num_functions(self) -> int:
        return self.compatibilities.shape[2]

    @property
    def is_set(self) -> bool:
        """A set input (set regression): every sample is read by the CLS token of every task."""
        return self.set_inputs is not None

    @property
    def is_multiple_choice(self) -> bool:
        """PGM puzzles: each sample's tokens are the set of the candidate the model chose."""
        return self.panels is not None

    @property
    def predictions(self) -> np.ndarray:
        """Predicted class index of each sample, (B,)."""
        if self.logits is None:
            raise ValueError("This trace comes from a backbone without a head: it has no predictions.")
        return self.logits.argmax(-1)

    @property
    def probabilities(self) -> np.ndarray:
        if self.logits is None:
            raise ValueError("This trace comes from a backbone without a head: it has no predictions.")
        shifted = np.exp(self.logits - self.logits.max(-1, keepdims=True))
        return shifted / shifted.sum(-1, keepdims=True)


def _check_trace(trace: Any) -> RoutingTrace:
    if not isinstance(trace, RoutingTrace):
        raise TypeError(f"`trace` must be a RoutingTrace (from trace_routing), got {type(trace).__name__}.")
    return trace


def _class_labels(trace: RoutingTrace, labels: Any) -> np.ndarray:
    """(B,) class of each sample: `labels`, checked against the trace and the model's classes, or the predictions."""
    if labels is None:
        if trace.logits is None:
            raise ValueError(
                "`labels` are needed: this trace has no class predictions (its model has no classification "
                "head)."
            )
        return trace.predictions
    batch_size = trace.compatibilities.shape[1]
    classes = _integers("labels", labels, "class indices (a list, tuple, numpy array or tensor of ints)")
    if classes.ndim != 1 or len(classes) != batch_size:
        raise ValueError(
            f"`labels` must be one class index per sample of the trace, shape ({batch_size},), got shape "
            f"{classes.shape}."
        )
    negative = sorted(set(classes[classes < 0].tolist()))
    if negative:
        raise ValueError(
            f"`labels` must be class indices >= 0, got {negative} (leave out the samples without a class, such "
            "as those labelled -100)."
        )
    if trace.logits is not None:
        num_classes = trace.logits.shape[-1]
        bad = _out_of(classes, 0, num_classes)
        if bad:
            raise ValueError(
                f"`labels` must be class indices in 0..{num_classes - 1} (the model's {num_classes} "
                f"classes), got {bad}."
            )
    return classes


# ---------------------------------------------------------------------------------------------- the models

# The models whose forward pass trace_routing knows how to feed and read; matched by class name (along the MRO)
# so that the copies a checkpoint's code makes (`trust_remote_code`) are traced too.
TRACEABLE_MODELS = (
    "NeuralInterpreterModel",
    "NeuralInterpreterForImageClassification",
    "NeuralInterpreterForSetRegression",
    "NeuralInterpreterForMultipleChoice",
)
MULTIPLE_CHOICE_MODEL = "NeuralInterpreterForMultipleChoice"


def _mro_names(model: Any) -> set[str]:
    return {cls.__name__ for cls in type(model).__mro__}


def _traced_backbone(model: Any) -> torch.nn.Module:
    """The Neural Interpreter backbone of `model`; a TypeError naming `model` for any other model (a ViT)."""
    expected = f"a Neural Interpreter (one of {', '.join(TRACEABLE_MODELS)})"
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"`model` must be {expected}, got {type(model).__name__}.")
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type != NeuralInterpreterConfig.model_type:
        raise TypeError(
            f"`model` must be {expected}, got {type(model).__name__} (model_type {model_type!r}), which has no "
            "function iterations to trace."
        )
    if not _mro_names(model) & set(TRACEABLE_MODELS):
        raise TypeError(
            f"`model` must be {expected}, got {type(model).__name__}: trace_routing does not know how to feed "
            "its inputs."
        )
    backbone = getattr(model, "neural_interpreter", model)
    if model is backbone and getattr(model, "patch_embedding", None) is None:
        raise TypeError(
            "`model` is a backbone without a patch embedding (it reads a set through inputs_embeds), which "
            "trace_routing does not feed; trace the model around it."
        )
    return backbone


def _stacked(per_step: Sequence[torch.Tensor], rows: np.ndarray | None = None) -> np.ndarray:
    """The outputs of every function iteration stacked as numpy; only the batch rows `rows` when given."""
    return np.stack(
        [(a if rows is None else a[torch.from_numpy(rows)]).float().cpu().numpy() for a in per_step]
    )


def _display(x: torch.Tensor) -> torch.Tensor:
    """Each sample stretched to [0, 1] over its own range (all dimensions after the first)."""
    dims = tuple(range(1, x.dim()))
    lo, hi = x.amin(dim=dims, keepdim=True), x.amax(dim=dims, keepdim=True)
    return (x - lo) / (hi - lo).clamp_min(1e-8)


class _ModelAdapter:
    """How trace_routing feeds one kind of Neural Interpreter, and what its trace keeps of the forward pass."""

    reads = "pixel_values"  # the input argument

    def __init__(self, model: torch.nn.Module, config: NeuralInterpreterConfig) -> None:
        self.model, self.config = model, config
        self.name = type(model).__name__

    def check(self, pixel_values: Any, inputs: Any, task_ids: Any, labels: Any, meta_targets: Any) -> None:
        """Refuse what this kind of model does not read, then check and keep its input (`self.values`)."""
        if inputs is not None:
            raise ValueError(f"inputs= is for a set-regression model; {self.name} reads pixel_values.")
        self.refuse(task_ids, labels, meta_targets)
        self.values = self.check_values(pixel_values)
        self.batch_size = self.values.shape[0]
        self.tasks = np.zeros(self.batch_size, dtype=np.int64)

    def refuse(self, task_ids: Any, labels: Any, meta_targets: Any) -> None:
        for name, value in (("labels", labels), ("meta_targets", meta_targets)):
            if value is not None:
                raise ValueError(
                    f"`{name}` is for the multiple-choice (PGM) model; {self.name} takes its classes in "
                    "FunctionUsage.from_trace(trace, labels)."
                )

    def check_values(self, values: Any) -> torch.Tensor:
        raise NotImplementedError

    def forward_inputs(self) -> dict[str, torch.Tensor]:
        return {self.reads: self.values}

    def rows(self, logits: np.ndarray | None) -> np.ndarray | None:
        """The batch rows of the outputs that the trace keeps, one per sample; None: all of them."""
        return None

    def numbers(self, out: Any) -> dict[str, np.ndarray]:
        """The outputs of its own that the trace keeps (checked for NaN with the others)."""
        return {}

    def fields(self, out: Any) -> dict[str, Any]:
        """The trace's fields of its own: grid, pictures, names."""
        id2label = getattr(self.config, "id2label", None) or {}
        num_labels = getattr(self.config, "num_labels", 0) or 0
        return {
            "grid": None,
            "images": None,
            "class_names": [str(id2label.get(i, i)) for i in range(num_labels)],
        }


class _ImageAdapter(_ModelAdapter):
    """The backbone or the image classifier: images or patches, one task id per sample; C drawn on the patch grid."""

    def check(self, pixel_values: Any, inputs: Any, task_ids: Any, labels: Any, meta_targets: Any) -> None:
        super().check(pixel_values, inputs, task_ids, labels, meta_targets)
        self.tasks = _task_ids(task_ids, self.batch_size, self.config)

    def check_values(self, values: Any) -> torch.Tensor:
        config = self.config
        values = _float_tensor(
            "pixel_values",
            values,
            "images (batch, channels, height, width) or patches (batch, num_patches, patch_dim), normalized as "
            "NeuralInterpreterImageProcessor gives them",
        )
        image = (config.num_channels, config.image_size, config.image_size)
        if tuple(values.shape[1:]) not in (image, (config.num_patches, config.patch_dim)):
            raise ValueError(
                f"`pixel_values` must be images (batch, {', '.join(map(str, image))}) or patches (batch, "
                f"{config.num_patches}, {config.patch_dim}), got shape {tuple(values.shape)}; resize images "
                "with NeuralInterpreterImageProcessor."
            )
        return values

    def forward_inputs(self) -> dict[str, torch.Tensor]:
        inputs = {"pixel_values": self.values}
        if (
            getattr(self.model, "neural_interpreter", None) is not None
        ):  # the backbone alone takes no task ids
            inputs["task_ids"] = torch.from_numpy(self.tasks)
        return inputs

    def fields(self, out: Any) -> dict[str, Any]:
        config = self.config
        num_patches = out.compatibilities[0].shape[-1] - config.num_task_tokens
        on_grid = num_patches == config.grid_size**2
        return {
            **super().fields(out),
            "grid": (config.grid_size, config.grid_size) if on_grid else None,
            "images": self.images() if on_grid else None,
        }

    def images(self) -> np.ndarray:
        """(B, 3, H, W) images or (B, P, p*p*3) patches -> (B, H, W, 3) in [0, 1], each stretched to its own range."""
        x = self.values.detach().float().cpu()
        if x.dim() == 3:
            x = unpatchify(x, self.config.patch_size, self.config.image_size, self.config.image_size)
        x = _display(x).permute(0, 2, 3, 1).numpy()
        return np.repeat(x, 3, axis=-1) if x.shape[-1] == 1 else x[..., :3]


class _SetAdapter(_ModelAdapter):
    """A set-regression model: (B, N_in) variables, read by every task's CLS token, so no task ids."""

    reads = "inputs"

    def check(self, pixel_values: Any, inputs: Any, task_ids: Any, labels: Any, meta_targets: Any) -> None:
        if pixel_values is not None:
            raise ValueError(f"pixel_values is for an image model; {self.name} reads a set: pass inputs=.")
        if task_ids is not None:
            raise ValueError(
                "A set-regression model takes no task_ids: every task's CLS token reads every sample."
            )
        self.refuse(task_ids, labels, meta_targets)
        self.values = self.check_values(inputs)
        self.batch_size = self.values.shape[0]
        self.tasks = np.zeros(self.batch_size, dtype=np.int64)

    def check_values(self, values: Any) -> torch.Tensor:
        values = _float_tensor("inputs", values, "the input variables' values")
        if values.dim() != 2 or values.shape[1] != self.config.num_input_variables:
            raise ValueError(
                f"`inputs` must have shape (batch, {self.config.num_input_variables}), got {tuple(values.shape)}."
            )
        return values

    def numbers(self, out: Any) -> dict[str, np.ndarray]:
        return {"regression": out.predictions.float().cpu().numpy()}

    def fields(self, out: Any) -> dict[str, Any]:
        return {**super().fields(out), "set_inputs": self.values.detach().float().cpu().numpy()}


class _MultipleChoiceAdapter(_ModelAdapter):
    """The PGM model: (B, 16, C, S, S) puzzles, each candidate scored on its own set (CLS, context, candidate);
    the trace keeps the chosen candidate's set, and the correct one's when the labels are given."""

    def refuse(self, task_ids: Any, labels: Any, meta_targets: Any) -> None:
        if task_ids is not None:
            raise ValueError(
                "A multiple-choice model takes no task_ids: one CLS token scores every candidate of a puzzle."
            )

    def check(self, pixel_values: Any, inputs: Any, task_ids: Any, labels: Any, meta_targets: Any) -> None:
        super().check(pixel_values, inputs, task_ids, labels, meta_targets)
        choices = self.config.num_choices
        self.labels = None if labels is None else _candidate_labels(labels, self.batch_size, choices)
        self.meta = None if meta_targets is None else _meta_targets(meta_targets, self.batch_size)

    def check_values(self, values: Any) -> torch.Tensor:
        config = self.config
        puzzle = (
            config.num_context_panels + config.num_choices,
            config.panel_channels,
            *[config.panel_size] * 2,
        )
        expected = (
            f"PGM puzzles (batch, {', '.join(map(str, puzzle))}): the {config.num_context_panels} context panels "
            f"of the incomplete matrix, then the {config.num_choices} candidates, as "
            "NeuralInterpreterPanelProcessor gives them"
        )
        values = _float_tensor("pixel_values", values, expected)
        if tuple(values.shape[1:]) != puzzle:
            raise ValueError(f"`pixel_values` must be {expected}; got shape {tuple(values.shape)}.")
        return values

    def rows(self, logits: np.ndarray | None) -> np.ndarray:
        # candidate k of puzzle b is the set at row b * num_choices + k
        self.offsets = np.arange(self.batch_size) * self.config.num_choices
        self.chosen = logits.argmax(-1)
        return self.offsets + self.chosen

    def numbers(self, out: Any) -> dict[str, np.ndarray]:
        if self.labels is None:
            return {}
        rows = self.offsets + self.labels
        return {
            "correct_compatibilities": _stacked(out.compatibilities, rows),
            "correct_types": _stacked(out.types, rows),
        }

    def fields(self, out: Any) -> dict[str, Any]:
        config = self.config
        context = [f"context {i + 1}" for i in range(config.num_context_panels)]
        return {
            "grid": None,
            "images": None,
            "class_names": [f"candidate {k + 1}" for k in range(config.num_choices)],
            "panels": _display(self.values.detach().float().cpu().mean(dim=2)).numpy(),  # (B, P, S, S) grey
            "labels": self.labels,
            "meta_targets": self.meta,
            "token_names": [["CLS", *context, f"candidate {k + 1}"] for k in self.chosen.tolist()],
        }


def _adapter(model: torch.nn.Module, config: NeuralInterpreterConfig) -> _ModelAdapter:
    if MULTIPLE_CHOICE_MODEL in _mro_names(model):
        return _MultipleChoiceAdapter(model, config)
    if getattr(model, "main_input_name", None) == "inputs":
        return _SetAdapter(model, config)
    return _ImageAdapter(model, config)


# ---------------------------------------------------------------------------------------------- the trace


def _forward(model: torch.nn.Module, inputs: dict[str, torch.Tensor], **options: Any) -> Any:
    """The model's forward pass in eval mode on its device; the model is left in the mode it was in."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        return model(**{name: value.to(device) for name, value in inputs.items()}, **options)
    finally:
        model.train(was_training)


def _routing_numbers(
    out: Any, adapter: _ModelAdapter, num_steps: int, output_attentions: bool
) -> dict[str, np.ndarray | None]:
    """C, types, logits and W (when asked) of every function iteration as numpy, at the rows the adapter keeps."""
    logits = None if getattr(out, "logits", None) is None else out.logits.float().cpu().numpy()
    rows = adapter.rows(logits)
    attentions = None
    if output_attentions:
        picked = _stacked(out.attentions, rows)
        attentions = picked.reshape(num_steps, len(out.attentions) // num_steps, *picked.shape[1:])
    numbers = {
        "compatibilities": _stacked(out.compatibilities, rows),
        "types": _stacked(out.types, rows),
        "logits": logits,
        "attentions": attentions,
        **adapter.numbers(out),
    }
    # The model checks its own outputs unless its checks are off; a trace never hands NaN on to a figure.
    broken = [name for name, a in numbers.items() if a is not None and not np.isfinite(a).all()]
    if broken:
        raise FloatingPointError(
            f"`model` produced NaN or infinite {broken[0]} for finite inputs: its parameters are NaN or inf "
            "(a diverged training run), or the inputs overflow its dtype."
        )
    return numbers


@torch.no_grad()
def trace_routing(
    model: torch.nn.Module,
    pixel_values: torch.Tensor | np.ndarray | None = None,
    task_ids: torch.Tensor | np.ndarray | Sequence[int] | int | None = None,
    *,
    inputs: torch.Tensor | np.ndarray | None = None,
    labels: torch.Tensor | np.ndarray | Sequence[int] | None = None,
    meta_targets: torch.Tensor | np.ndarray | Sequence[Sequence[int]] | None = None,
    num_function_iterations: int | Sequence[int] | None = None,
    disabled_functions: Sequence[int] | None = None,
    output_attentions: bool = False,
) -> RoutingTrace:
    """One forward pass in eval mode; keeps C (Eq. 4), types (Eq. 2), signatures (and Eq. 6's W) of every function
    iteration.

    pixel_values: images or patches of an image model, or the (B, 16, 1, S, S) puzzles of the multiple-choice model;
    inputs: (B, N_in) variables of a set-regression model (no task_ids: every sample is read by every task's CLS
    token). Tensors or numpy arrays; task_ids: one task for the whole batch or one per sample; disabled_functions:
    the functions switched off in every script. For the multiple-choice model only: labels, each puzzle's correct
    candidate (its set is kept too), and meta_targets, each puzzle's 12 meta-target bits (usage per relation type).
    """
    backbone = _traced_backbone(model)
    config = backbone.config
    if (pixel_values is None) == (inputs is None):
        raise ValueError("Pass either pixel_values (an image model) or inputs (a set-regression model).")
    adapter = _adapter(model, config)
    adapter.check(pixel_values, inputs, task_ids, labels, meta_targets)
    iterations = _function_iterations(num_function_iterations, config)
    disabled = _disabled_functions(disabled_functions, config.num_functions)
    if not isinstance(output_attentions, (bool, np.bool_)):
        raise TypeError(f"`output_attentions` must be a bool, got {type(output_attentions).__name__}.")
    out = _forward(
        model,
        adapter.forward_inputs(),
        output_routing=True,
        output_attentions=bool(output_attentions),
        num_function_iterations=iterations,
        disabled_functions=disabled or None,
    )
    steps = [(s, k) for s, n in enumerate(iterations) for k in range(n)]
    numbers = _routing_numbers(out, adapter, len(steps), bool(output_attentions))
    signatures = [
        F.normalize(script.signatures.detach().float(), dim=-1).cpu().numpy() for script in backbone.scripts
    ]
    return RoutingTrace(
        **numbers,
        signatures=np.stack([signatures[s] for s, _ in steps]),
        steps=steps,
        task_ids=adapter.tasks,
        num_task_tokens=config.num_task_tokens,
        task_names=list(config.task_names),
        disabled_functions=disabled,
        **adapter.fields(out),
    )
