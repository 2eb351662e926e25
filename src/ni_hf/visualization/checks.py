"""The argument checks of `ni_hf.visualization`: each names the argument and what was expected."""

from __future__ import annotations

import numbers
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..data.pgm_generator import META_TARGET_NAMES
from ..models.neural_interpreter.configuration_neural_interpreter import NeuralInterpreterConfig


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


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def _index(name: str, value: Any, size: int, what: str) -> int:
    """`value` as an index in 0..size - 1 (an int, numpy int or 0-d integer tensor); names `name` otherwise."""
    if isinstance(value, torch.Tensor) and value.dim() == 0:
        value = value.item()
    if not _is_int(value):
        raise TypeError(
            f"`{name}` must be an int ({what} in 0..{size - 1}), got {type(value).__name__} {value!r}."
        )
    if not 0 <= value < size:
        raise ValueError(f"`{name}` must be {what} in 0..{size - 1}, got {value}.")
    return int(value)


def _seed(seed: Any) -> int:
    if not _is_int(seed) or not 0 <= seed < 2**32:
        raise ValueError(f"`seed` must be an int in 0..2**32 - 1, got {seed!r}.")
    return int(seed)


def _positive_number(name: str, value: Any) -> None:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) or not 0 < value < np.inf:
        raise ValueError(f"`{name}` must be a positive number, got {value!r}.")


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


def _output_dir(output_dir: Any) -> Path:
    if not isinstance(output_dir, (str, os.PathLike)):
        raise TypeError(f"`output_dir` must be a str or Path, got {type(output_dir).__name__}.")
    path = Path(output_dir)
    if path.exists() and not path.is_dir():
        raise ValueError(f"`output_dir` must be a folder, got the file {path}.")
    return path


def _check_stem(stem: Any) -> None:
    if not isinstance(stem, str) or not stem or os.sep in stem or "/" in stem:
        raise ValueError(
            f"`stem` must be a file name prefix (a non-empty str without a folder), got {stem!r}."
        )
