"""Pictures of what a Neural Interpreter computes, from the numbers of one forward pass.

`trace_routing` runs the model once with `output_routing` (and `output_attentions` when asked) and keeps, for every
function iteration, the compatibilities C (Eq. 4), the types t (Eq. 2) and Eq. 6's attention weights W. The
`*_data` functions and `FunctionUsage` turn a trace into the arrays behind each figure; the `plot_*` functions draw
them with matplotlib (the `vis` extra: `pip install -e ".[vis]"`), imported only when a figure is drawn, on
`matplotlib.figure.Figure` objects (no pyplot state, so they render headless). Tokens are the task (CLS) tokens
first, one per task, then the patches in row-major order over the grid, or the set's elements (the input variables
of a `NeuralInterpreterForSetRegression`, traced with `trace_routing(model, inputs=...)`) in their order. A
`NeuralInterpreterForMultipleChoice` scores each candidate of a PGM puzzle on its own set (CLS, the context panels in
the matrix's row-major order, the candidate); its trace keeps the set of the candidate it chooses, and, given the
labels, that of the correct one.
Inputs may be torch tensors or numpy arrays; an argument that cannot be drawn raises a TypeError or ValueError that
names it and what was expected.
"""

from __future__ import annotations

import json
import math
import numbers
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

from .models.neural_interpreter.configuration_neural_interpreter import NeuralInterpreterConfig
from .models.neural_interpreter.image_processing_neural_interpreter import unpatchify

if TYPE_CHECKING:
    from matplotlib.figure import Figure
    from PIL import Image


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


# ---------------------------------------------------------------------------------------------- argument checks

# The models whose forward pass trace_routing knows how to feed and read; matched by class name (along the MRO)
# so that the copies a checkpoint's code makes (`trust_remote_code`) are traced too.
TRACEABLE_MODELS = (
    "NeuralInterpreterModel",
    "NeuralInterpreterForImageClassification",
    "NeuralInterpreterForSetRegression",
    "NeuralInterpreterForMultipleChoice",
)
MULTIPLE_CHOICE_MODEL = "NeuralInterpreterForMultipleChoice"
# The relation types of PGM's meta targets (Barrett et al. 2018; the paper's appendix on PGM).
RELATION_TYPES = ("progression", "XOR", "OR", "AND", "consistent_union")


def _mro_names(model: Any) -> set[str]:
    return {cls.__name__ for cls in type(model).__mro__}


def _describe(array: np.ndarray) -> str:
    """The values when there are few, else their dtype and shape: what an error message shows of a bad array."""
    if array.size <= 8:
        return f"{array.dtype} values {array.tolist()}"
    return f"{array.dtype} values of shape {array.shape}"


def _integers(name: str, values: Any, expected: str) -> np.ndarray:
    """int64 array of `values` (an int, or a list, tuple, numpy array or tensor of ints); floats and bools refused."""
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().numpy()
    try:
        array = np.asarray(values)
    except ValueError:  # ragged nested lists
        raise ValueError(f"`{name}` must be {expected}, got {values!r}.") from None
    if array.size == 0 and not isinstance(values, np.ndarray):
        array = array.astype(np.int64)  # numpy makes [] a float64 array
    if array.dtype.kind not in "iu":
        raise ValueError(f"`{name}` must be {expected}, got {_describe(array)}.")
    return array.astype(np.int64)


def _out_of(values: np.ndarray, low: int, high: int) -> list[int]:
    """The distinct values outside low..high - 1, sorted: what an error message shows of bad indices."""
    return sorted(set(values[(values < low) | (values >= high)].tolist()))


def _index(name: str, value: Any, size: int, what: str) -> int:
    """`value` as an index in 0..size - 1 (an int, numpy int or 0-d integer tensor); names `name` otherwise."""
    if isinstance(value, torch.Tensor) and value.dim() == 0:
        value = value.item()
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(
            f"`{name}` must be an int ({what} in 0..{size - 1}), got {type(value).__name__} {value!r}."
        )
    if not 0 <= value < size:
        raise ValueError(f"`{name}` must be {what} in 0..{size - 1}, got {value}.")
    return int(value)


def _float_tensor(name: str, values: Any, expected: str) -> torch.Tensor:
    """A floating-point tensor from a tensor or numpy array of at least one finite sample; names `name` otherwise."""
    if isinstance(values, np.ndarray):
        if values.dtype.kind != "f":
            raise ValueError(
                f"`{name}` must be floating-point ({expected}), got a numpy array of dtype {values.dtype}."
            )
        try:
            values = torch.tensor(values)
        except TypeError:  # float128, which torch has no dtype for
            raise TypeError(
                f"`{name}` must be float16, float32 or float64, got dtype {values.dtype}."
            ) from None
    elif not isinstance(values, torch.Tensor):
        raise TypeError(
            f"`{name}` must be a torch.Tensor or numpy array ({expected}), got {type(values).__name__}."
        )
    if not values.is_floating_point():
        raise ValueError(f"`{name}` must be floating-point ({expected}), got dtype {values.dtype}.")
    if values.dim() == 0:
        raise ValueError(f"`{name}` must be a batch ({expected}), got a 0-d tensor.")
    if values.shape[0] == 0:
        raise ValueError(
            f"`{name}` is an empty batch (shape {tuple(values.shape)}): pass at least one sample."
        )
    if not bool(torch.isfinite(values).all()):
        raise ValueError(f"`{name}` contains NaN or infinite values: expected finite numbers.")
    return values


def _traced_backbone(model: Any) -> torch.nn.Module:
    """The Neural Interpreter backbone of `model`; a TypeError naming `model` for any other model."""
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


def _task_ids(task_ids: Any, batch_size: int, config: NeuralInterpreterConfig) -> np.ndarray:
    """(B,) task index of each sample: one for all, or one each; `config.default_task` when None."""
    if task_ids is None:
        return np.full(batch_size, int(getattr(config, "default_task", 0) or 0), dtype=np.int64)
    ids = _integers(
        "task_ids", task_ids, "task indices (an int, or a list, tuple, numpy array or tensor of ints)"
    )
    if ids.ndim > 1 or (ids.ndim == 1 and len(ids) not in (1, batch_size)):
        raise ValueError(
            f"`task_ids` must be one task index, or one per sample ({batch_size}), got shape {ids.shape}."
        )
    ids = np.broadcast_to(ids.reshape(-1), (batch_size,)).copy()
    bad = _out_of(ids, 0, config.num_tasks)
    if bad:
        raise ValueError(
            f"`task_ids` must lie in 0..{config.num_tasks - 1} (tasks {config.task_names}), got {bad}."
        )
    return ids


def _function_iterations(value: Any, config: NeuralInterpreterConfig) -> list[int]:
    """Function iterations per script: the config's, or `value` (one int for every script, or one per script)."""
    if value is None:
        return [int(k) for k in config.iterations_per_script]
    expected = (
        f"a non-negative int or one per script ({config.num_scripts}), with at least one iteration in all"
    )
    array = _integers("num_function_iterations", value, expected)
    if array.ndim > 1:
        raise ValueError(f"`num_function_iterations` must be {expected}, got shape {array.shape}.")
    counts = [int(array)] * config.num_scripts if array.ndim == 0 else array.tolist()
    if len(counts) != config.num_scripts or min(counts) < 0 or not any(counts):
        raise ValueError(f"`num_function_iterations` must be {expected}, got {counts}.")
    return counts


def _disabled_functions(value: Any, num_functions: int) -> list[int]:
    """Sorted, distinct functions switched off in every script; [] for None."""
    if value is None:
        return []
    if isinstance(value, dict):
        raise TypeError(
            "`disabled_functions` must list the functions switched off in every script (the trace marks them "
            "off at every function iteration); trace_routing does not take a per-script dict."
        )
    expected = "function indices (an int, or a list, tuple, numpy array or tensor of ints)"
    functions = _integers("disabled_functions", value, expected)
    if functions.ndim > 1:
        raise ValueError(f"`disabled_functions` must be {expected}, got shape {functions.shape}.")
    functions = functions.reshape(-1)
    bad = _out_of(functions, 0, num_functions)
    if bad:
        raise ValueError(f"`disabled_functions` must index functions 0..{num_functions - 1}, got {bad}.")
    return sorted(set(functions.tolist()))


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


def _output_dir(output_dir: Any) -> Path:
    if not isinstance(output_dir, (str, os.PathLike)):
        raise TypeError(f"`output_dir` must be a str or Path, got {type(output_dir).__name__}.")
    path = Path(output_dir)
    if path.exists() and not path.is_dir():
        raise ValueError(f"`output_dir` must be a folder, got the file {path}.")
    return path


def _display_images(pixel_values: torch.Tensor, config: Any) -> np.ndarray | None:
    """(B, 3, H, W) images or (B, P, p*p*3) patches -> (B, H, W, 3) in [0, 1], each stretched to its own range."""
    x = pixel_values.detach().float().cpu()
    if x.dim() == 3:
        if x.shape[1] != config.grid_size**2:
            return None
        x = unpatchify(x, config.patch_size, config.image_size, config.image_size)
    if x.dim() != 4:
        return None
    lo = x.amin(dim=(1, 2, 3), keepdim=True)
    hi = x.amax(dim=(1, 2, 3), keepdim=True)
    x = (x - lo) / (hi - lo).clamp_min(1e-8)
    x = x.permute(0, 2, 3, 1).numpy()
    return np.repeat(x, 3, axis=-1) if x.shape[-1] == 1 else x[..., :3]


def _display_panels(pixel_values: torch.Tensor) -> np.ndarray:
    """(B, P, C, S, S) PGM panels -> (B, P, S, S) grey in [0, 1], each puzzle stretched to its own range."""
    x = pixel_values.detach().float().cpu().mean(dim=2)
    lo = x.amin(dim=(1, 2, 3), keepdim=True)
    hi = x.amax(dim=(1, 2, 3), keepdim=True)
    return ((x - lo) / (hi - lo).clamp_min(1e-8)).numpy()


def _candidate_labels(labels: Any, batch_size: int, num_choices: int) -> np.ndarray:
    """(B,) the correct candidate of each puzzle, in 0..num_choices - 1."""
    expected = f"the correct candidate of each puzzle, ints in 0..{num_choices - 1}"
    candidates = _integers("labels", labels, f"{expected} (a list, tuple, numpy array or tensor)")
    if candidates.ndim != 1 or len(candidates) != batch_size:
        raise ValueError(
            f"`labels` must be {expected}, one per puzzle: shape ({batch_size},), got shape {candidates.shape}."
        )
    bad = _out_of(candidates, 0, num_choices)
    if bad:
        raise ValueError(f"`labels` must be {expected}, got {bad}.")
    return candidates


def _meta_targets(meta_targets: Any, batch_size: int) -> np.ndarray:
    """(B, 12) meta-target bits of each puzzle, 0 or 1, in DeepMind's order."""
    from .data.pgm import META_TARGET_NAMES

    expected = (
        f"bits (0 or 1) of shape ({batch_size}, {len(META_TARGET_NAMES)}): one row per puzzle, columns in "
        "DeepMind's order (ni_hf.data.pgm.META_TARGET_NAMES)"
    )
    if isinstance(meta_targets, torch.Tensor):
        meta_targets = meta_targets.detach().cpu().numpy()
    try:
        array = np.asarray(meta_targets)
    except ValueError:  # ragged nested lists
        raise ValueError(f"`meta_targets` must be {expected}, got ragged rows.") from None
    bits = _integers("meta_targets", array.astype(np.int64) if array.dtype == bool else array, expected)
    if bits.shape != (batch_size, len(META_TARGET_NAMES)):
        raise ValueError(f"`meta_targets` must be {expected}, got shape {bits.shape}.")
    bad = _out_of(bits, 0, 2)
    if bad:
        raise ValueError(f"`meta_targets` must be {expected}, got the values {bad}.")
    return bits


def _check_stem(stem: Any) -> None:
    if not isinstance(stem, str) or not stem or os.sep in stem or "/" in stem:
        raise ValueError(
            f"`stem` must be a file name prefix (a non-empty str without a folder), got {stem!r}."
        )


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
    """One forward pass in eval mode; keeps C, types, signatures (and W) of every function iteration.

    pixel_values: images or patches of an image model, or the (B, 16, 1, S, S) puzzles of the multiple-choice model;
    inputs: (B, N_in) variables of a set-regression model (no task_ids: every sample is read by every task's CLS
    token). Tensors or numpy arrays; task_ids: one task for the whole batch or one per sample; disabled_functions:
    the functions switched off in every script. For the multiple-choice model only: labels, each puzzle's correct
    candidate (its set is kept too), and meta_targets, each puzzle's 12 meta-target bits (usage per relation type).
    """
    backbone = _traced_backbone(model)
    config = backbone.config
    reads_set = getattr(model, "main_input_name", None) == "inputs"
    multiple_choice = MULTIPLE_CHOICE_MODEL in _mro_names(model)
    if (pixel_values is None) == (inputs is None):
        raise ValueError("Pass either pixel_values (an image model) or inputs (a set-regression model).")
    if inputs is not None and not reads_set:
        raise ValueError(f"inputs= is for a set-regression model; {type(model).__name__} reads pixel_values.")
    if pixel_values is not None and reads_set:
        raise ValueError(
            f"pixel_values is for an image model; {type(model).__name__} reads a set: pass inputs=."
        )
    if inputs is not None and task_ids is not None:
        raise ValueError(
            "A set-regression model takes no task_ids: every task's CLS token reads every sample."
        )
    if multiple_choice and task_ids is not None:
        raise ValueError(
            "A multiple-choice model takes no task_ids: one CLS token scores every candidate of a puzzle."
        )
    for name, value in (("labels", labels), ("meta_targets", meta_targets)):
        if value is not None and not multiple_choice:
            raise ValueError(
                f"`{name}` is for the multiple-choice (PGM) model; {type(model).__name__} takes its classes in "
                "FunctionUsage.from_trace(trace, labels)."
            )
    if reads_set:
        values = _float_tensor("inputs", inputs, "the input variables' values")
        if values.dim() != 2 or values.shape[1] != config.num_input_variables:
            raise ValueError(
                f"`inputs` must have shape (batch, {config.num_input_variables}), got {tuple(values.shape)}."
            )
    elif multiple_choice:
        puzzle = (
            config.num_context_panels + config.num_choices,
            config.panel_channels,
            config.panel_size,
            config.panel_size,
        )
        expected = (
            f"PGM puzzles (batch, {', '.join(map(str, puzzle))}): the {config.num_context_panels} context panels "
            f"of the incomplete matrix, then the {config.num_choices} candidates, as "
            "NeuralInterpreterPanelProcessor gives them"
        )
        values = _float_tensor("pixel_values", pixel_values, expected)
        if tuple(values.shape[1:]) != puzzle:
            raise ValueError(f"`pixel_values` must be {expected}; got shape {tuple(values.shape)}.")
    else:
        values = _float_tensor(
            "pixel_values",
            pixel_values,
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
    batch_size = values.shape[0]
    individual = reads_set or multiple_choice  # no task ids: every task's CLS token reads every sample
    tasks = np.zeros(batch_size, dtype=np.int64) if individual else _task_ids(task_ids, batch_size, config)
    correct = None if labels is None else _candidate_labels(labels, batch_size, config.num_choices)
    meta = None if meta_targets is None else _meta_targets(meta_targets, batch_size)
    iterations = _function_iterations(num_function_iterations, config)
    disabled = _disabled_functions(disabled_functions, config.num_functions)
    if not isinstance(output_attentions, (bool, np.bool_)):
        raise TypeError(f"`output_attentions` must be a bool, got {type(output_attentions).__name__}.")
    kwargs: dict[str, Any] = dict(
        output_routing=True,
        output_attentions=bool(output_attentions),
        num_function_iterations=iterations,
        disabled_functions=disabled or None,
    )
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        if reads_set:
            out = model(inputs=values.to(device), **kwargs)
        elif model is backbone or multiple_choice:
            out = model(pixel_values=values.to(device), **kwargs)
        else:
            out = model(pixel_values=values.to(device), task_ids=torch.from_numpy(tasks).to(device), **kwargs)
    finally:
        model.train(was_training)

    steps = [(s, k) for s, n in enumerate(iterations) for k in range(n)]
    signatures = [
        F.normalize(script.signatures.detach().float(), dim=-1).cpu().numpy() for script in backbone.scripts
    ]
    logits = getattr(out, "logits", None)
    logits = None if logits is None else logits.float().cpu().numpy()

    def numpy_of(per_step: Sequence[torch.Tensor], rows: np.ndarray | None = None) -> np.ndarray:
        """The outputs of every function iteration stacked; a multiple-choice model's at each puzzle's `rows`."""
        return np.stack(
            [(a if rows is None else a[torch.from_numpy(rows)]).float().cpu().numpy() for a in per_step]
        )

    chosen_rows = correct_rows = None
    if multiple_choice:
        # candidate k of puzzle b is the set at row b * num_choices + k
        offsets = np.arange(batch_size) * config.num_choices
        chosen_rows = offsets + logits.argmax(-1)
        correct_rows = None if correct is None else offsets + correct
    num_tokens = out.compatibilities[0].shape[-1]
    num_patches = num_tokens - config.num_task_tokens
    on_grid = not individual and num_patches == config.grid_size**2
    grid = (config.grid_size, config.grid_size) if on_grid else None
    attentions = None
    if output_attentions:
        per_step = len(out.attentions) // len(steps)
        picked = numpy_of(out.attentions, chosen_rows)
        attentions = picked.reshape(len(steps), per_step, *picked.shape[1:])
    id2label = getattr(config, "id2label", None) or {}
    regression = out.predictions if reads_set else None
    numbers_out = {
        "compatibilities": numpy_of(out.compatibilities, chosen_rows),
        "types": numpy_of(out.types, chosen_rows),
        "logits": logits,
        "predictions": None if regression is None else regression.float().cpu().numpy(),
        "attentions": attentions,
    }
    if correct_rows is not None:
        numbers_out["correct_compatibilities"] = numpy_of(out.compatibilities, correct_rows)
        numbers_out["correct_types"] = numpy_of(out.types, correct_rows)
    # The model checks its own outputs unless its checks are off; a trace never hands NaN on to a figure.
    broken = [name for name, a in numbers_out.items() if a is not None and not np.isfinite(a).all()]
    if broken:
        raise FloatingPointError(
            f"`model` produced NaN or infinite {broken[0]} for finite inputs: its parameters are NaN or inf "
            "(a diverged training run), or the inputs overflow its dtype."
        )
    class_names = [str(id2label.get(i, i)) for i in range(getattr(config, "num_labels", 0) or 0)]
    token_names = None
    if multiple_choice:
        class_names = [f"candidate {k + 1}" for k in range(config.num_choices)]
        context = [f"context {i + 1}" for i in range(config.num_context_panels)]
        token_names = [["CLS", *context, f"candidate {k + 1}"] for k in (chosen_rows - offsets).tolist()]
    return RoutingTrace(
        compatibilities=numbers_out["compatibilities"],
        types=numbers_out["types"],
        signatures=np.stack([signatures[s] for s, _ in steps]),
        steps=steps,
        logits=numbers_out["logits"],
        task_ids=tasks,
        num_task_tokens=config.num_task_tokens,
        grid=grid,
        images=_display_images(values, config) if grid is not None else None,
        attentions=attentions,
        task_names=list(config.task_names),
        class_names=class_names,
        disabled_functions=disabled,
        set_inputs=values.detach().float().cpu().numpy() if reads_set else None,
        regression=numbers_out["predictions"],
        panels=_display_panels(values) if multiple_choice else None,
        labels=correct,
        meta_targets=meta,
        correct_compatibilities=numbers_out.get("correct_compatibilities"),
        correct_types=numbers_out.get("correct_types"),
        token_names=token_names,
    )


# ---------------------------------------------------------------------------------------------- the data


def _step_name(steps: Sequence[tuple[int, int]], i: int) -> str:
    """'iteration k' (1-based), with the script where the model has several."""
    script, iteration = steps[i]
    if len({s for s, _ in steps}) == 1:
        return f"iteration {iteration + 1}"
    return f"script {script + 1}, iteration {iteration + 1}"


def _matrix_shape(num_places: int) -> tuple[int, int]:
    """Rows and columns of the puzzle's matrix (3 x 3 for PGM's 8 context panels and the missing one)."""
    side = math.isqrt(num_places)
    return (side, side) if side * side == num_places else (1, num_places)


def computational_path_data(trace: RoutingTrace, index: int = 0) -> dict[str, Any]:
    """C (Eq. 4) of one sample per function iteration and function: on the patch grid (a set: on its elements; a PGM
    puzzle: on its matrix, the chosen candidate in the missing panel's place), and for every task's CLS token."""
    _check_trace(trace)
    if trace.grid is None and not trace.is_set and not trace.is_multiple_choice:
        raise ValueError(
            "The computational path is drawn on a patch grid, a set or a PGM puzzle; this trace has none."
        )
    index = _index("index", index, trace.compatibilities.shape[1], "a sample index of the trace")
    c = trace.compatibilities[:, index]  # (K, U, N)
    t = trace.num_task_tokens
    if trace.is_multiple_choice:
        k, u, n = c.shape
        inputs = {
            "tokens": c,  # (K, U, N): CLS, the context panels, the chosen candidate
            "token_names": list(trace.token_names[index]),
            "matrix": c[:, :, t:].reshape(k, u, *_matrix_shape(n - t)),  # (K, U, rows, columns)
            "panels": trace.panels[index],  # (context + choices, S, S)
            "label": None if trace.labels is None else int(trace.labels[index]),
            "correct_tokens": (
                None if trace.correct_compatibilities is None else trace.correct_compatibilities[:, index]
            ),
            "meta_target": None if trace.meta_targets is None else trace.meta_targets[index],
        }
    elif trace.is_set:
        inputs: dict[str, Any] = {
            "elements": c[:, :, t:],  # (K, U, N_in)
            "inputs": trace.set_inputs[index],  # (N_in,)
            "regression": trace.regression[index],  # (T,)
        }
    else:
        inputs = {"patches": c[:, :, t:].reshape(c.shape[0], c.shape[1], *trace.grid)}  # (K, U, gh, gw)
    data = {
        **inputs,
        "task_tokens": c[:, :, :t].transpose(0, 2, 1),  # (K, T, U)
        "accepted": c.sum(axis=1),  # (K, N): sum over functions of C, Eq. 4's share of token i that is routed
        "task_id": int(trace.task_ids[index]),
        "steps": trace.steps,
        "disabled_functions": trace.disabled_functions,
    }
    if trace.logits is not None:
        data["prediction"] = int(trace.predictions[index])
        data["probability"] = float(trace.probabilities[index].max())
    return data


def type_projection_data(
    trace: RoutingTrace,
    labels: Sequence[int] | np.ndarray | torch.Tensor | None = None,
    method: str = "pca",
    seed: int = 0,
) -> dict[str, Any]:
    """Types t of every token per function iteration and the signatures s_u, projected to 2-D together.

    One projection (PCA or t-SNE) is fitted on the types of all iterations and the signatures at once, so the
    panels share axes. "function": the function with the largest C for each token, -1 where no function accepts it.
    "label": each sample's class (`labels`, or the predictions when None).
    """
    _check_trace(trace)
    if not isinstance(method, str) or method not in ("pca", "tsne"):
        raise ValueError(f"`method` must be 'pca' or 'tsne', got {method!r}.")
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, numbers.Integral) or not 0 <= seed < 2**32:
        raise ValueError(f"`seed` must be an int in 0..2**32 - 1, got {seed!r}.")
    labels_arr = _class_labels(trace, labels)
    from sklearn.decomposition import PCA
    from sklearn.manifold import TSNE

    k, b, n, d = trace.types.shape
    scripts = sorted({s for s, _ in trace.steps})
    script_signatures = {s: trace.signatures[[s2 for s2, _ in trace.steps].index(s)] for s in scripts}
    signatures = np.concatenate([script_signatures[s] for s in scripts])
    points = np.concatenate([trace.types.reshape(-1, d), signatures]).astype(np.float64)
    if method == "pca":
        projected = PCA(n_components=2, random_state=int(seed)).fit_transform(points)
    else:
        perplexity = float(min(30.0, max(2.0, (len(points) - 1) / 3)))
        projected = TSNE(
            n_components=2, perplexity=perplexity, init="pca", random_state=int(seed)
        ).fit_transform(points)
    types_2d = projected[: k * b * n].reshape(k, b, n, 2)
    sig_2d = projected[k * b * n :].reshape(len(scripts), -1, 2)
    c = trace.compatibilities  # (K, B, U, N)
    function = np.where(c.sum(axis=2) > 0, c.argmax(axis=2), -1)  # (K, B, N)
    return {
        "types": types_2d,  # (K, B, N, 2)
        "signatures": np.stack([sig_2d[scripts.index(s)] for s, _ in trace.steps]),  # (K, U, 2)
        "function": function,
        "label": labels_arr,  # (B,)
        "is_task_token": np.arange(n) < trace.num_task_tokens,  # (N,)
        "method": method,
        "label_source": "predictions" if labels is None else "labels",
    }


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
        c = trace.compatibilities.astype(np.float64)  # (K, B, U, N)
        k, b, u, n = c.shape
        if trace.is_multiple_choice:
            if labels is not None:
                raise ValueError(
                    "A PGM trace is split by relation type, not by class: give the puzzles' meta_targets (and "
                    "labels, the correct candidates) to trace_routing."
                )
            per_sample = c.sum(axis=(0, 3))  # (B, U)
            if trace.meta_targets is None:
                relations, membership = [], np.zeros((b, 0))
            else:
                from .data.pgm import META_TARGET_NAMES

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
                class_sums=membership.T @ per_sample,
                class_tokens=membership.sum(axis=0).astype(np.int64) * k * n,
                num_samples=b,
                class_source="none" if trace.meta_targets is None else "meta_targets",
                position_names=[*trace.token_names[0][:-1], "candidate"],
                position_sums=c.sum(axis=1).transpose(0, 2, 1),  # (K, N, U)
                position_samples=b,
            )
        if trace.is_set:
            if labels is not None:
                raise ValueError("A set input has no classes: its labels are regression targets.")
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
        per_sample = c.sum(axis=(0, 3))  # (B, U)
        classes = _class_labels(trace, labels)
        num_tasks = len(trace.task_names)
        num_classes = max(len(trace.class_names), int(classes.max()) + 1)
        task_sums = np.zeros((num_tasks, u))
        np.add.at(task_sums, trace.task_ids, per_sample)
        class_sums = np.zeros((num_classes, u))
        np.add.at(class_sums, classes, per_sample)
        names = trace.class_names + [str(i) for i in range(len(trace.class_names), num_classes)]
        return cls(
            steps=list(trace.steps),
            task_names=list(trace.task_names),
            class_names=names,
            iteration_sums=c.sum(axis=(1, 3)),
            iteration_tokens=b * n,
            task_sums=task_sums,
            task_tokens=np.bincount(trace.task_ids, minlength=num_tasks) * k * n,
            class_sums=class_sums,
            class_tokens=np.bincount(classes, minlength=num_classes) * k * n,
            num_samples=b,
            class_source="predictions" if labels is None else "labels",
        )

    def __add__(self, other: FunctionUsage) -> FunctionUsage:
        if not isinstance(other, FunctionUsage):
            return NotImplemented
        if (self.steps, self.task_names, self.task_source) != (
            other.steps,
            other.task_names,
            other.task_source,
        ):
            raise ValueError("Only usages of the same model and function iterations add up.")
        if self.class_source != other.class_source:
            raise ValueError(
                f"Usages counted by {self.class_source} and by {other.class_source} do not add up."
            )
        if self.position_names != other.position_names:
            raise ValueError("Only usages of the same model and function iterations add up.")
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


def attention_data(
    trace: RoutingTrace,
    index: int = 0,
    step: int = 0,
    function: int = 0,
    head: int = 0,
    token: int | None = None,
    loc: int = 0,
) -> dict[str, Any]:
    """Eq. 6's weights W_ij of one function and head at one function iteration: what token i reads from each j.

    token: the query token (default: the sample's own task (CLS) token). "patches" is W over the patch grid,
    "task_tokens" W on the task tokens; the row sums to S / (eps + S) <= 1, S = C_ui sum_j C_uj A_ij.
    """
    _check_trace(trace)
    if trace.attentions is None:
        raise ValueError("Trace without attention weights: call trace_routing(..., output_attentions=True).")
    if trace.grid is None:
        raise ValueError(
            "The attention map is drawn on a patch grid; this trace has a set input (a set or a PGM puzzle)."
        )
    k, num_locs, b, u, h, n = trace.attentions.shape[:6]
    index = _index("index", index, b, "a sample index of the trace")
    step = _index("step", step, k, "a function iteration of the trace")
    function = _index("function", function, u, "a function index")
    head = _index("head", head, h, "an attention head index")
    loc = _index("loc", loc, num_locs, "a LOC index within the function iteration")
    token = int(trace.task_ids[index]) if token is None else _index("token", token, n, "a token index")
    row = trace.attentions[step, loc, index, function, head, token]  # (N,)
    t = trace.num_task_tokens
    return {
        "patches": row[t:].reshape(trace.grid),
        "task_tokens": row[:t],
        "row": row,
        "query_compatibility": float(trace.compatibilities[step, index, function, token]),
        "token": token,
        "step": trace.steps[step],
    }


# ---------------------------------------------------------------------------------------------- the figures


def _new_figure(width: float, height: float) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def _token_name(trace: RoutingTrace, token: int) -> str:
    if token < trace.num_task_tokens:
        return f"CLS token of {trace.task_names[token]}"
    return f"patch {token - trace.num_task_tokens}"


def _title(trace: RoutingTrace, index: int) -> str:
    task = trace.task_names[int(trace.task_ids[index])]
    text = f"task {task}"
    if trace.logits is not None:
        label = (
            trace.class_names[int(trace.predictions[index])]
            if trace.class_names
            else trace.predictions[index]
        )
        text = f"prediction {label} (p = {trace.probabilities[index].max():.2f}), " + text
    if trace.disabled_functions:
        text += f", functions {', '.join(map(str, trace.disabled_functions))} off"
    return text


# Frames on a PGM puzzle, as the paper's PGM figure marks answers: green the correct one, orange a wrong choice.
CHOSEN_COLOUR, CORRECT_COLOUR = "tab:orange", "tab:green"


def _mosaic(panels: np.ndarray, rows: int, columns: int, gap: int) -> np.ndarray:
    """(P, S, S) panels side by side, row-major on a rows x columns grid, `gap` pixels of mid grey between them."""
    size = panels.shape[-1]
    step = size + gap
    out = np.full((rows * step - gap, columns * step - gap), 0.5)
    for place, panel in enumerate(panels):
        r, c = divmod(place, columns)
        out[r * step : r * step + size, c * step : c * step + size] = panel
    return out


def _outline(ax: Any, place: int, columns: int, size: int, gap: int, colour: str) -> None:
    """A frame around panel `place` of a `_mosaic` (imshow puts pixel centres on the integers)."""
    from matplotlib.patches import Rectangle

    r, c = divmod(place, columns)
    corner = (c * (size + gap) - 0.5, r * (size + gap) - 0.5)
    ax.add_patch(Rectangle(corner, size, size, fill=False, edgecolor=colour, linewidth=2.0))


def _puzzle_title(trace: RoutingTrace, index: int) -> str:
    chosen = int(trace.predictions[index])
    text = f"Puzzle {index}: chose candidate {chosen + 1} (p = {trace.probabilities[index].max():.2f})"
    if trace.labels is not None:
        label = int(trace.labels[index])
        text += ", the correct one" if label == chosen else f"; correct: candidate {label + 1}"
    if trace.disabled_functions:
        text += f"; functions {', '.join(map(str, trace.disabled_functions))} off"
    if trace.meta_targets is not None:
        from .data.pgm import META_TARGET_NAMES

        names = [name for name, bit in zip(META_TARGET_NAMES, trace.meta_targets[index], strict=True) if bit]
        text += f"\nmeta target: {', '.join(names) or 'none'}"
    return text


def _plot_puzzle_path(trace: RoutingTrace, index: int) -> Figure:
    """Computational path of one PGM puzzle: the puzzle's panels, and C of the chosen candidate's set on its matrix."""
    data = computational_path_data(trace, index)
    c, matrix, panels = data["tokens"], data["matrix"], data["panels"]
    k, u, n = c.shape
    num_context = n - trace.num_task_tokens - 1
    num_choices = panels.shape[0] - num_context
    chosen, label = data["prediction"], data["label"]
    mark = CORRECT_COLOUR if chosen == label else CHOSEN_COLOUR
    size = panels.shape[-1]
    gap = max(1, size // 16)
    fig = _new_figure(2.8 + 1.45 * u + 0.9, max(1.45 * k + 0.9, 4.6))
    left, right = fig.subfigures(1, 2, width_ratios=[2.8, 1.45 * u + 0.9])
    ax_matrix, ax_choices = left.subplots(2, 1, height_ratios=[3, 2])
    shape = _matrix_shape(num_context + 1)
    grey = dict(cmap="gray", vmin=0.0, vmax=1.0, interpolation="nearest")
    ax_matrix.imshow(
        _mosaic(np.concatenate([panels[:num_context], panels[num_context + chosen][None]]), *shape, gap),
        **grey,
    )
    _outline(ax_matrix, num_context, shape[1], size, gap, mark)
    ax_matrix.set_title("the matrix, chosen candidate in place", fontsize=8)
    choice_columns = math.ceil(num_choices / 2)
    ax_choices.imshow(_mosaic(panels[num_context:], min(num_choices, 2), choice_columns, gap), **grey)
    for j in range(num_choices):
        r, col = divmod(j, choice_columns)
        ax_choices.text(
            col * (size + gap), r * (size + gap), str(j + 1), fontsize=6, va="top", color="tab:blue"
        )
    if label is not None and label != chosen:
        _outline(ax_choices, label, choice_columns, size, gap, CORRECT_COLOUR)
    _outline(ax_choices, chosen, choice_columns, size, gap, mark)
    if label is None:
        what = f"chosen {chosen + 1} (orange)"
    elif label == chosen:
        what = f"chosen {chosen + 1}, correct (green)"
    else:
        what = f"chosen {chosen + 1} (orange), correct {label + 1} (green)"
    ax_choices.set_title(f"candidates: {what}", fontsize=8)
    for ax in (ax_matrix, ax_choices):
        ax.axis("off")
    axes = right.subplots(k, u, squeeze=False)
    place = divmod(num_context, shape[1])  # the candidate's cell: the missing panel's place
    mappable = None
    for i in range(k):
        for f in range(u):
            ax = axes[i, f]
            mappable = ax.imshow(matrix[i, f], cmap="magma", vmin=0.0, vmax=1.0, interpolation="nearest")
            for (r, col), v in np.ndenumerate(matrix[i, f]):
                ax.text(
                    col,
                    r,
                    f"{v:.2f}",
                    ha="center",
                    va="center",
                    fontsize=6,
                    color="white" if v < 0.6 else "black",
                )
            ax.add_patch(_square(place[1] - 0.5, place[0] - 0.5, mark))
            ax.set_xticks([])
            ax.set_yticks([])
            off = " (off)" if f in trace.disabled_functions else ""
            title = f"CLS {c[i, f, 0]:.2f}{off}"
            ax.set_title(f"function {f}\n{title}" if i == 0 else title, fontsize=9 if i == 0 else 8)
            if f == 0:
                ax.set_ylabel(_step_name(trace.steps, i), fontsize=9)
    right.colorbar(mappable, ax=axes.ravel().tolist(), shrink=0.6, label="compatibility C")
    right.suptitle("C of the chosen candidate's set, on the matrix (CLS above)", fontsize=8)
    fig.suptitle(_puzzle_title(trace, index), fontsize=10)
    return fig


def plot_computational_path(trace: RoutingTrace, index: int = 0) -> Figure:
    """Computational path of one image: C of each function (columns) at each function iteration (rows), on the image.

    The first column shows the input; each panel shades the patches by C_ui of that function (0 to 1) and gives C
    of the sample's own CLS token; with several tasks, a last column shows C for every task's CLS token. A PGM
    puzzle is drawn beside C of its chosen candidate's set, laid out on the matrix with the candidate in the
    missing panel's place, and C of the CLS token above each panel.
    """
    if _check_trace(trace).is_multiple_choice:
        return _plot_puzzle_path(trace, index)
    if trace.grid is None:
        raise ValueError("The computational path is drawn on a patch grid; a set input has plot_set_path.")
    data = computational_path_data(trace, index)
    patches, cls = data["patches"], data["task_tokens"]
    k, u = patches.shape[:2]
    rows = max(k, 1)
    tasks_column = trace.num_task_tokens > 1
    columns = u + 1 + tasks_column
    fig = _new_figure(1.55 * columns + 0.9, 1.5 * rows + 0.7)
    axes = fig.subplots(rows, columns, squeeze=False)
    image = trace.images[index] if trace.images is not None else None
    grey = image.mean(-1) if image is not None else None
    extent = (0, trace.grid[1], trace.grid[0], 0)
    for ax in axes[:, 0]:
        ax.axis("off")
    if image is not None:
        axes[0, 0].imshow(image, extent=extent, interpolation="nearest")
        axes[0, 0].set_title("input", fontsize=9)
    mappable = None
    own = data["task_id"]
    for i in range(k):
        for f in range(u):
            ax = axes[i, f + 1]
            if grey is not None:
                ax.imshow(grey, cmap="gray", extent=extent, interpolation="nearest")
            mappable = ax.imshow(
                patches[i, f],
                cmap="magma",
                vmin=0.0,
                vmax=1.0,
                alpha=0.7,
                extent=extent,
                interpolation="nearest",
            )
            ax.set_xticks([])
            ax.set_yticks([])
            off = " (off)" if f in trace.disabled_functions else ""
            title = f"CLS {cls[i, own, f]:.2f}{off}"
            ax.set_title(f"function {f}\n{title}" if i == 0 else title, fontsize=9 if i == 0 else 8)
            if f == 0:
                ax.set_ylabel(_step_name(trace.steps, i), fontsize=9)
        if tasks_column:
            ax = axes[i, -1]
            ax.imshow(cls[i], cmap="magma", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
            ax.set_xticks(range(u))
            ax.set_yticks(range(len(trace.task_names)))
            ax.set_yticklabels([n[:14] for n in trace.task_names], fontsize=6)
            ax.tick_params(axis="x", labelsize=6)
            if i == 0:
                ax.set_title("task tokens\n(C per function)", fontsize=9)
    if k == 0:
        axes[0, -1].set_title("no function iteration")
    if mappable is not None:
        fig.colorbar(mappable, ax=axes[:, 1 : u + 1].ravel().tolist(), shrink=0.6, label="compatibility C")
    fig.suptitle(_title(trace, index), fontsize=10)
    return fig


def plot_set_path(trace: RoutingTrace, index: int = 0) -> Figure:
    """Computational path of one set: C (Eq. 4) of each function (rows) for each token (columns) per iteration.

    One panel per function iteration; the columns are the tasks' CLS tokens, then the input variables (with their
    values); the last row, "none", is 1 - sum_u C_ui, the share of the token that no function processes.
    """
    if not _check_trace(trace).is_set:
        raise ValueError("plot_set_path draws a set input; an image has plot_computational_path.")
    data = computational_path_data(trace, index)
    c = np.concatenate([data["task_tokens"].transpose(0, 2, 1), data["elements"]], axis=2)  # (K, U, N)
    k, u, n = c.shape
    values = np.concatenate([c, np.clip(1.0 - data["accepted"], 0.0, 1.0)[:, None]], axis=1)  # (K, U + 1, N)
    t = trace.num_task_tokens
    columns = [f"CLS {name}"[:10] for name in trace.task_names]
    columns += [f"x{j} = {v:.2f}" for j, v in enumerate(data["inputs"])]
    rows = [f"function {f}" + (" (off)" if f in trace.disabled_functions else "") for f in range(u)] + [
        "none"
    ]
    fig = _new_figure(max(6.0, 1.6 + 0.36 * n), 1.3 + max(k, 1) * (0.3 * (u + 1) + 0.35))
    axes = fig.subplots(max(k, 1), 1, squeeze=False, sharex=True)[:, 0]
    mappable = None
    for i in range(k):
        ax = axes[i]
        mappable = ax.imshow(
            values[i], cmap="magma", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest"
        )
        for (r, col), v in np.ndenumerate(values[i]):
            ax.text(
                col,
                r,
                f"{v:.2f}",
                ha="center",
                va="center",
                fontsize=5,
                color="white" if v < 0.6 else "black",
            )
        ax.axvline(t - 0.5, color="cyan", linewidth=1.5)
        ax.set_yticks(range(u + 1))
        ax.set_yticklabels(rows, fontsize=7)
        ax.set_title(_step_name(trace.steps, i), fontsize=9)
    axes[-1].set_xticks(range(n))
    axes[-1].set_xticklabels(columns, fontsize=6, rotation=90)
    if k == 0:
        axes[0].set_title("no function iteration")
    if mappable is not None:
        fig.colorbar(mappable, ax=list(axes), shrink=0.6, label="compatibility C")
    fig.suptitle(
        f"Sample {index}: C of its {t} CLS tokens (one per task)\nand {n - t} input variables", fontsize=10
    )
    return fig


def plot_type_space(
    trace: RoutingTrace,
    labels: Sequence[int] | np.ndarray | torch.Tensor | None = None,
    method: str = "pca",
    seed: int = 0,
) -> Figure:
    """Types of the tokens per function iteration in 2-D: coloured by the function accepting most, and by class.

    Stars mark the function signatures s_u; grey dots are tokens no function accepts (C = 0).
    """
    data = type_projection_data(trace, labels, method, seed)
    from matplotlib import colormaps

    k = data["types"].shape[0]
    fig = _new_figure(2.6 * max(k, 1) + 0.6, 5.4)
    axes = fig.subplots(2, max(k, 1), squeeze=False, sharex=True, sharey=True)
    palette = colormaps["tab10"]
    b, n = data["types"].shape[1:3]
    for i in range(k):
        xy = data["types"][i].reshape(-1, 2)
        function = data["function"][i].reshape(-1)
        label = np.repeat(data["label"], n)
        for row, (values, what) in enumerate(((function, "function"), (label, "class"))):
            ax = axes[row, i]
            colours = np.array([palette(int(v) % 10) if v >= 0 else (0.7, 0.7, 0.7, 1.0) for v in values])
            ax.scatter(xy[:, 0], xy[:, 1], c=colours, s=6, linewidths=0)
            sig = data["signatures"][i]
            ax.scatter(
                sig[:, 0],
                sig[:, 1],
                marker="*",
                s=140,
                c=[palette(u % 10) for u in range(len(sig))],
                edgecolors="black",
                linewidths=0.8,
            )
            for u, (x, y) in enumerate(sig):
                ax.annotate(f"s{u}", (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
            if row == 0:
                ax.set_title(_step_name(trace.steps, i), fontsize=9)
            if i == 0:
                ax.set_ylabel(
                    f"by {what}" if what == "function" else f"by class ({data['label_source']})", fontsize=9
                )
            ax.tick_params(labelsize=6)
    classes = trace.class_names + [
        str(c) for c in range(len(trace.class_names), int(data["label"].max()) + 1)
    ]
    for row, names in ((0, [f"function {u}" for u in range(trace.num_functions)]), (1, classes)):
        from matplotlib.lines import Line2D

        handles = [
            Line2D([], [], marker="o", ls="", color=palette(j % 10), label=name)
            for j, name in enumerate(names)
        ]
        axes[row, -1].legend(
            handles=handles, fontsize=6, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False
        )
    fig.suptitle(f"Types t of {b} samples x {n} tokens ({method.upper()}); stars: signatures", fontsize=10)
    return fig


def plot_function_usage(usage: FunctionUsage) -> Figure:
    """Function usage as heatmaps: mean C of each function per function iteration, per task and per class (of a PGM
    trace: per token position and relation type)."""
    if not isinstance(usage, FunctionUsage):
        raise TypeError(
            f"`usage` must be a FunctionUsage (from FunctionUsage.from_trace), got {type(usage).__name__}."
        )
    iterations = [_step_name(usage.steps, i) for i in range(len(usage.steps))]
    tasks = [i for i, m in enumerate(usage.task_tokens) if m]
    classes = [i for i, m in enumerate(usage.class_tokens) if m]
    cls_rows = usage.task_source == "cls_token"
    parts = [
        ("function iteration", iterations, usage.by_iteration),
        (
            "task's CLS token" if cls_rows else "task",
            [("CLS " if cls_rows else "") + str(usage.task_names[i])[:14] for i in tasks],
            usage.by_task[tasks],
        ),
        ("token", usage.position_names, usage.by_position),
        (
            "relation type" if usage.class_source == "meta_targets" else "class",
            [str(usage.class_names[i])[:16] for i in classes],
            usage.by_class[classes],
        ),
    ]
    if usage.position_names:  # one task, whose row is the mean over everything: the token rows say more
        parts.pop(1)
    parts = [part for part in parts if len(part[1])]
    u = usage.iteration_sums.shape[1]
    height = 1.0 + 0.25 * max(len(names) for _, names, _ in parts)
    fig = _new_figure(0.8 + (1.0 + 0.45 * u) * len(parts), height)
    axes = fig.subplots(1, len(parts), squeeze=False)[0]
    mappable = None
    for ax, (title, names, values) in zip(axes, parts, strict=True):
        mappable = ax.imshow(
            values, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest"
        )
        for (r, c), v in np.ndenumerate(values):
            ax.text(
                c, r, f"{v:.2f}", ha="center", va="center", fontsize=6, color="white" if v < 0.6 else "black"
            )
        ax.set_xticks(range(u))
        ax.set_xticklabels([f"f{j}" for j in range(u)], fontsize=7)
        ax.set_yticks(range(len(names)))
        ax.set_yticklabels(names, fontsize=7)
        ax.set_title(f"per {title}", fontsize=9)
    fig.colorbar(mappable, ax=list(axes), shrink=0.8, label="mean C")
    samples = "puzzles (the chosen candidates' sets)" if usage.position_names else "samples"
    fig.suptitle(f"Function usage over {usage.num_samples} {samples}", fontsize=10)
    return fig


def plot_attention(
    trace: RoutingTrace,
    index: int = 0,
    step: int = 0,
    function: int = 0,
    head: int = 0,
    token: int | None = None,
    loc: int = 0,
) -> Figure:
    """Eq. 6's weights W of one function and head for one query token: on the patch grid, and on the task tokens."""
    data = attention_data(trace, index, step, function, head, token, loc)
    fig = _new_figure(6.4, 3.2)
    ax_img, ax_cls = fig.subplots(1, 2, width_ratios=[3, 1])
    extent = (0, trace.grid[1], trace.grid[0], 0)
    if trace.images is not None:
        ax_img.imshow(trace.images[index].mean(-1), cmap="gray", extent=extent, interpolation="nearest")
    top = max(float(data["row"].max()), 1e-8)
    mappable = ax_img.imshow(
        data["patches"], cmap="viridis", vmin=0.0, vmax=top, alpha=0.7, extent=extent, interpolation="nearest"
    )
    q = data["token"]
    if q >= trace.num_task_tokens:
        gw = trace.grid[1]
        r, c = divmod(q - trace.num_task_tokens, gw)
        ax_img.add_patch(_square(c, r))
    ax_img.set_xticks([])
    ax_img.set_yticks([])
    ax_img.set_title("W on the patches", fontsize=8)
    ax_cls.bar(range(trace.num_task_tokens), data["task_tokens"], color="tab:purple")
    ax_cls.set_xticks(range(trace.num_task_tokens))
    ax_cls.set_xticklabels([n[:8] for n in trace.task_names], fontsize=6, rotation=45)
    ax_cls.set_ylim(0, top)
    ax_cls.set_title("W on the CLS tokens", fontsize=8)
    if not data["row"].any():
        ax_img.text(
            0.5, 0.5, "token not accepted:\nW = 0", transform=ax_img.transAxes, ha="center", color="white"
        )
    ax_cls.tick_params(labelsize=6)
    fig.colorbar(mappable, ax=ax_img, shrink=0.8)
    script, it = data["step"]
    fig.suptitle(
        f"Eq. 6 weights W of function {function}, head {head}, iteration {it + 1}:\n"
        f"what the {_token_name(trace, q)} reads (its C = {data['query_compatibility']:.2f})",
        fontsize=8,
    )
    return fig


def _square(x: float, y: float, colour: str = "red") -> Any:
    from matplotlib.patches import Rectangle

    return Rectangle((x, y), 1, 1, fill=False, edgecolor=colour, linewidth=1.5)


def _check_figure(fig: Any, dpi: Any) -> None:
    if not hasattr(fig, "savefig") or not hasattr(fig, "canvas"):
        raise TypeError(
            f"`fig` must be a matplotlib Figure (from a plot_* function), got {type(fig).__name__}."
        )
    if isinstance(dpi, (bool, np.bool_)) or not isinstance(dpi, numbers.Real) or not 0 < dpi < math.inf:
        raise ValueError(f"`dpi` must be a positive number, got {dpi!r}.")


def figure_to_image(fig: Figure, dpi: int = 100) -> Image.Image:
    """Render a figure (headless, Agg) to a PIL image."""
    import io

    _check_figure(fig, dpi)
    from PIL import Image

    buffer = io.BytesIO()
    save_figure(fig, buffer, dpi=dpi)
    buffer.seek(0)
    return Image.open(buffer).convert("RGB")


def save_figure(fig: Figure, path: str | Path | Any, dpi: int = 100) -> None:
    """Save as PNG without the software metadata, so that the same numbers give the same bytes."""
    _check_figure(fig, dpi)
    fig.savefig(path, format="png", dpi=dpi, metadata={"Software": None})


# ---------------------------------------------------------------------------------------------- model cards


def write_routing_card_assets(
    model: torch.nn.Module,
    pixel_values: torch.Tensor,
    task_ids: torch.Tensor | Sequence[int] | None,
    output_dir: str | Path,
    labels: Sequence[int] | np.ndarray | torch.Tensor | None = None,
    index: int = 0,
) -> dict[str, Any]:
    """Save a computational-path PNG and the function usage (JSON) of a batch; return the model card's Markdown.

    Returns {"markdown": section to append to the card's README.md (it links the PNG by its file name, so upload
    the folder with it), "files": paths written, "usage": the usage numbers}.
    """
    output_dir = _output_dir(output_dir)
    trace = trace_routing(model, pixel_values, task_ids)
    labels = None if labels is None else _class_labels(trace, labels)
    usage = FunctionUsage.from_trace(trace, labels)
    index = _index("index", index, trace.compatibilities.shape[1], "a sample index of the batch")
    output_dir.mkdir(parents=True, exist_ok=True)
    png = output_dir / "routing_path.png"
    save_figure(plot_computational_path(trace, index), png)
    usage_json = output_dir / "routing_usage.json"
    usage_json.write_text(json.dumps(usage.to_dict(), indent=2) + "\n")
    truth = "" if labels is None else f" (true class {trace.class_names[int(labels[index])]})"
    markdown = "\n".join(
        [
            "## Routing",
            "",
            f"![Computational path of one image]({png.name})",
            "",
            f"The computational path of one image{truth}: how much each function (columns) accepts each patch at "
            "each function iteration (rows), the compatibility C of Eq. 4 shading the patches from 0 to 1, and C "
            "of the task (CLS) tokens.",
            "",
            f"Function usage: mean C of each function over the tokens of {usage.num_samples} images, per function "
            f"iteration, task and class ({usage.class_source}); 'none' is the share no function accepts "
            f"({usage_json.name} has the numbers).",
            "",
            usage.to_markdown(),
            "",
        ]
    )
    return {"markdown": markdown, "files": [str(png), str(usage_json)], "usage": usage.to_dict()}


def write_set_routing_card_assets(
    model: torch.nn.Module,
    inputs: torch.Tensor,
    output_dir: str | Path,
    stem: str = "routing",
    heading: str = "## Routing",
    index: int = 0,
    draw: bool | None = None,
) -> dict[str, Any]:
    """Function usage (C of Eq. 4) of a set-regression model on a batch: JSON, Markdown table and, with matplotlib,
    the PNGs of one sample's path and of the usage; returns the model card's Markdown section.

    Writes `<stem>_usage.json` (and `<stem>_path.png`, `<stem>_usage.png`) in `output_dir`; draw None: draw when
    matplotlib (the `vis` extra) is importable. Returns {"markdown", "files", "usage", "drawn"}.
    """
    import importlib.util

    output_dir = _output_dir(output_dir)
    _check_stem(stem)
    if not isinstance(heading, str):
        raise TypeError(f"`heading` must be a str (a Markdown heading), got {type(heading).__name__}.")
    if draw is not None and not isinstance(draw, (bool, np.bool_)):
        raise TypeError(
            f"`draw` must be True, False or None (draw when matplotlib is installed), got {draw!r}."
        )
    trace = trace_routing(model, inputs=inputs)
    usage = FunctionUsage.from_trace(trace)
    index = _index("index", index, trace.compatibilities.shape[1], "a sample index of the batch")
    output_dir.mkdir(parents=True, exist_ok=True)
    usage_json = output_dir / f"{stem}_usage.json"
    usage_json.write_text(json.dumps(usage.to_dict(), indent=2) + "\n")
    drawn = importlib.util.find_spec("matplotlib") is not None if draw is None else draw
    lines = [heading, ""]
    files = [usage_json]
    if drawn:
        path_png, usage_png = output_dir / f"{stem}_path.png", output_dir / f"{stem}_usage.png"
        save_figure(plot_set_path(trace, index), path_png)
        save_figure(plot_function_usage(usage), usage_png)
        files = [path_png, usage_png, usage_json]
        lines += [
            f"![Computational path of one test point]({path_png.name})",
            "",
            "The computational path of one test point: at each function iteration (panels), the compatibility C "
            "of Eq. 4 of each function (rows) with each token (columns: the CLS token of every function to "
            "regress, then the input variables); 'none' is the share of a token that no function processes.",
            "",
            f"![Function usage]({usage_png.name})",
            "",
        ]
    lines += [
        f"Function usage: mean C of each function over all tokens of {usage.num_samples} test points per "
        "function iteration (script, iteration), and over the iterations for the CLS token of each function to "
        f"regress; 'none' is 1 minus the row's sum, the share no function accepts ({usage_json.name} has the "
        "numbers).",
        "",
        usage.to_markdown(),
        "",
    ]
    return {
        "markdown": "\n".join(lines),
        "files": [str(f) for f in files],
        "usage": usage.to_dict(),
        "drawn": drawn,
    }


def write_pgm_routing_card_assets(
    model: torch.nn.Module,
    pixel_values: torch.Tensor | np.ndarray,
    labels: torch.Tensor | np.ndarray | Sequence[int] | None,
    output_dir: str | Path,
    meta_targets: torch.Tensor | np.ndarray | Sequence[Sequence[int]] | None = None,
    index: int = 0,
    stem: str = "routing",
) -> dict[str, Any]:
    """Routing of a multiple-choice (PGM) model on a batch of test puzzles, for its model card: the computational
    path of puzzle `index` and the function usage of the batch (C of Eq. 4, on the chosen candidates' sets).

    Writes `<stem>_path.png`, `<stem>_usage.png` and `<stem>_usage.json` in `output_dir` (matplotlib, the `vis`
    extra, is needed); labels: the correct candidates; meta_targets: the puzzles' (B, 12) meta-target bits, for the
    usage per relation type. Returns {"markdown": the card's section, linking the PNGs by file name, "files": paths
    written, "usage": the usage numbers}.
    """
    output_dir = _output_dir(output_dir)
    _check_stem(stem)
    _traced_backbone(model)  # what is no Neural Interpreter is refused by name
    if MULTIPLE_CHOICE_MODEL not in _mro_names(model):
        raise TypeError(
            f"`model` must be a {MULTIPLE_CHOICE_MODEL} (PGM puzzles), got {type(model).__name__}; "
            "write_routing_card_assets and write_set_routing_card_assets draw the other models."
        )
    trace = trace_routing(model, pixel_values, labels=labels, meta_targets=meta_targets)
    index = _index("index", index, trace.compatibilities.shape[1], "a puzzle index of the batch")
    usage = FunctionUsage.from_trace(trace)
    figures = {"path": plot_computational_path(trace, index), "usage": plot_function_usage(usage)}
    output_dir.mkdir(parents=True, exist_ok=True)
    path_png, usage_png = output_dir / f"{stem}_path.png", output_dir / f"{stem}_usage.png"
    usage_json = output_dir / f"{stem}_usage.json"
    save_figure(figures["path"], path_png)
    save_figure(figures["usage"], usage_png)
    usage_json.write_text(json.dumps(usage.to_dict(), indent=2) + "\n")
    chosen = int(trace.predictions[index])
    if trace.labels is None:
        puzzle = f"the model chose candidate {chosen + 1}"
        solved = ""
    else:
        label = int(trace.labels[index])
        correct = "the correct one" if label == chosen else f"the correct one is candidate {label + 1}"
        puzzle = f"the model chose candidate {chosen + 1}, {correct}"
        solved = f" (the model solves {int((trace.predictions == trace.labels).sum())} of them)"
    relations = (
        ", and per relation type of the puzzles' meta targets (a puzzle counts for every relation it holds)"
        if usage.class_source == "meta_targets"
        else ""
    )
    markdown = "\n".join(
        [
            "## Routing",
            "",
            f"![Computational path of one test puzzle]({path_png.name})",
            "",
            f"The computational path of one test puzzle ({puzzle}). Each candidate is scored on its own set of "
            f"{trace.compatibilities.shape[-1]} tokens (a CLS token, the context panels, the candidate); shown is the "
            "set of the chosen candidate: how much each function (columns) accepts each token at each function "
            "iteration (rows), the compatibility C of Eq. 4 from 0 to 1, laid out on the matrix with the candidate "
            "in the missing panel's place, and C of the CLS token, whose output scores the candidate, above each "
            "panel.",
            "",
            f"![Function usage]({usage_png.name})",
            "",
            f"Function usage: mean C of each function over the chosen candidates' sets of {usage.num_samples} test "
            f"puzzles{solved}, per function iteration, per token (context panels in the matrix's row-major order)"
            f"{relations}; 'none' is the share no function accepts ({usage_json.name} has the numbers, per token "
            "and function iteration too).",
            "",
            usage.to_markdown(),
            "",
        ]
    )
    return {
        "markdown": markdown,
        "files": [str(path_png), str(usage_png), str(usage_json)],
        "usage": usage.to_dict(),
    }


__all__ = [
    "FunctionUsage",
    "RoutingTrace",
    "attention_data",
    "computational_path_data",
    "figure_to_image",
    "plot_attention",
    "plot_computational_path",
    "plot_function_usage",
    "plot_set_path",
    "plot_type_space",
    "save_figure",
    "trace_routing",
    "type_projection_data",
    "write_routing_card_assets",
    "write_pgm_routing_card_assets",
    "write_set_routing_card_assets",
]
