"""The numbers behind each picture, from a `RoutingTrace`: C on the input (Eq. 4), the types in 2-D (Eq. 2), Eq. 6's W.

Plain numpy (and scikit-learn for the projection): no matplotlib needed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .checks import _index, _seed
from .trace import RoutingTrace, _check_trace, _class_labels


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


def _puzzle_tokens(trace: RoutingTrace, index: int, c: np.ndarray) -> dict[str, Any]:
    """C of one PGM puzzle's chosen set (CLS, context panels, candidate), and on the matrix, the candidate in the
    missing panel's place."""
    k, u, n = c.shape
    t = trace.num_task_tokens
    correct = trace.correct_compatibilities
    return {
        "tokens": c,  # (K, U, N)
        "token_names": list(trace.token_names[index]),
        "matrix": c[:, :, t:].reshape(k, u, *_matrix_shape(n - t)),  # (K, U, rows, columns)
        "panels": trace.panels[index],  # (context + choices, S, S)
        "label": None if trace.labels is None else int(trace.labels[index]),
        "correct_tokens": None if correct is None else correct[:, index],
        "meta_target": None if trace.meta_targets is None else trace.meta_targets[index],
    }


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
        inputs = _puzzle_tokens(trace, index, c)
    elif trace.is_set:
        inputs = {
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


def _project(points: np.ndarray, method: str, seed: int) -> np.ndarray:
    """(P, d) points in 2-D by PCA or t-SNE (perplexity at most 30, below a third of the points)."""
    from sklearn.decomposition import PCA
    from sklearn.manifold import TSNE

    if method == "pca":
        return PCA(n_components=2, random_state=seed).fit_transform(points)
    perplexity = float(min(30.0, max(2.0, (len(points) - 1) / 3)))
    return TSNE(n_components=2, perplexity=perplexity, init="pca", random_state=seed).fit_transform(points)


def type_projection_data(
    trace: RoutingTrace,
    labels: Sequence[int] | np.ndarray | torch.Tensor | None = None,
    method: str = "pca",
    seed: int = 0,
) -> dict[str, Any]:
    """Types t (Eq. 2) of every token per function iteration and the signatures s_u, projected to 2-D together.

    One projection (PCA or t-SNE) is fitted on the types of all iterations and the signatures at once, so the
    panels share axes. "function": the function with the largest C for each token, -1 where no function accepts it.
    "label": each sample's class (`labels`, or the predictions when None).
    """
    _check_trace(trace)
    if not isinstance(method, str) or method not in ("pca", "tsne"):
        raise ValueError(f"`method` must be 'pca' or 'tsne', got {method!r}.")
    seed = _seed(seed)
    labels_arr = _class_labels(trace, labels)
    k, b, n, d = trace.types.shape
    scripts = sorted({s for s, _ in trace.steps})
    first_step = [[s2 for s2, _ in trace.steps].index(s) for s in scripts]
    signatures = np.concatenate([trace.signatures[i] for i in first_step])  # each script's signatures once
    projected = _project(
        np.concatenate([trace.types.reshape(-1, d), signatures]).astype(np.float64), method, seed
    )
    types_2d = projected[: k * b * n].reshape(k, b, n, 2)
    sig_2d = projected[k * b * n :].reshape(len(scripts), -1, 2)
    c = trace.compatibilities  # (K, B, U, N)
    return {
        "types": types_2d,  # (K, B, N, 2)
        "signatures": np.stack([sig_2d[scripts.index(s)] for s, _ in trace.steps]),  # (K, U, 2)
        "function": np.where(c.sum(axis=2) > 0, c.argmax(axis=2), -1),  # (K, B, N)
        "label": labels_arr,  # (B,)
        "is_task_token": np.arange(n) < trace.num_task_tokens,  # (N,)
        "method": method,
        "label_source": "predictions" if labels is None else "labels",
    }


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
