"""The figures, drawn with matplotlib (the `vis` extra) on `matplotlib.figure.Figure` objects: no pyplot state, so
they render headless. matplotlib is imported only when a figure is drawn."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..data.pgm_generator import META_TARGET_NAMES
from .checks import _positive_number
from .numbers import _matrix_shape, _step_name, attention_data, computational_path_data, type_projection_data
from .trace import RoutingTrace, _check_trace
from .usage import FunctionUsage

if TYPE_CHECKING:
    from matplotlib.figure import Figure, SubFigure
    from PIL import Image

# Frames on a PGM puzzle, as the paper's PGM figure marks answers: green the correct one, orange a wrong choice.
CHOSEN_COLOUR, CORRECT_COLOUR = "tab:orange", "tab:green"


def _new_figure(width: float, height: float) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def _write_values(ax: Any, values: np.ndarray, fontsize: float) -> None:
    """Each cell's value written on a heat map (dark text on the bright cells)."""
    for (r, c), v in np.ndenumerate(values):
        colour = "white" if v < 0.6 else "black"
        ax.text(c, r, f"{v:.2f}", ha="center", va="center", fontsize=fontsize, color=colour)


def _square(x: float, y: float, colour: str = "red") -> Any:
    from matplotlib.patches import Rectangle

    return Rectangle((x, y), 1, 1, fill=False, edgecolor=colour, linewidth=1.5)


def _panel_title(ax: Any, trace: RoutingTrace, i: int, f: int, cls: float) -> None:
    """Function f's name over the first row, C of the CLS token over every panel, the iteration left of each row."""
    off = " (off)" if f in trace.disabled_functions else ""
    title = f"CLS {cls:.2f}{off}"
    ax.set_title(f"function {f}\n{title}" if i == 0 else title, fontsize=9 if i == 0 else 8)
    if f == 0:
        ax.set_ylabel(_step_name(trace.steps, i), fontsize=9)


def _token_name(trace: RoutingTrace, token: int) -> str:
    if token < trace.num_task_tokens:
        return f"CLS token of {trace.task_names[token]}"
    return f"patch {token - trace.num_task_tokens}"


def _title(trace: RoutingTrace, index: int) -> str:
    task = trace.task_names[int(trace.task_ids[index])]
    text = f"task {task}"
    if trace.logits is not None:
        predicted = int(trace.predictions[index])
        label = trace.class_names[predicted] if trace.class_names else predicted
        text = f"prediction {label} (p = {trace.probabilities[index].max():.2f}), " + text
    if trace.disabled_functions:
        text += f", functions {', '.join(map(str, trace.disabled_functions))} off"
    return text


# ---------------------------------------------------------------------------------------------- PGM puzzles


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
        names = [name for name, bit in zip(META_TARGET_NAMES, trace.meta_targets[index], strict=True) if bit]
        text += f"\nmeta target: {', '.join(names) or 'none'}"
    return text


def _draw_puzzle(fig: SubFigure, data: dict[str, Any], num_context: int, mark: str) -> None:
    """The matrix with the chosen candidate in its missing place, above the candidates (chosen and correct framed)."""
    panels, chosen, label = data["panels"], data["prediction"], data["label"]
    num_choices = panels.shape[0] - num_context
    size = panels.shape[-1]
    gap = max(1, size // 16)
    ax_matrix, ax_choices = fig.subplots(2, 1, height_ratios=[3, 2])
    shape = _matrix_shape(num_context + 1)
    grey = dict(cmap="gray", vmin=0.0, vmax=1.0, interpolation="nearest")
    completed = np.concatenate([panels[:num_context], panels[num_context + chosen][None]])
    ax_matrix.imshow(_mosaic(completed, *shape, gap), **grey)
    _outline(ax_matrix, num_context, shape[1], size, gap, mark)
    ax_matrix.set_title("the matrix, chosen candidate in place", fontsize=8)
    columns = math.ceil(num_choices / 2)
    ax_choices.imshow(_mosaic(panels[num_context:], min(num_choices, 2), columns, gap), **grey)
    for j in range(num_choices):
        r, col = divmod(j, columns)
        ax_choices.text(
            col * (size + gap), r * (size + gap), str(j + 1), fontsize=6, va="top", color="tab:blue"
        )
    if label is not None and label != chosen:
        _outline(ax_choices, label, columns, size, gap, CORRECT_COLOUR)
    _outline(ax_choices, chosen, columns, size, gap, mark)
    if label is None:
        what = f"chosen {chosen + 1} (orange)"
    elif label == chosen:
        what = f"chosen {chosen + 1}, correct (green)"
    else:
        what = f"chosen {chosen + 1} (orange), correct {label + 1} (green)"
    ax_choices.set_title(f"candidates: {what}", fontsize=8)
    for ax in (ax_matrix, ax_choices):
        ax.axis("off")


def _draw_matrix_paths(
    fig: SubFigure, trace: RoutingTrace, data: dict[str, Any], num_context: int, mark: str
) -> None:
    """C of the chosen candidate's set on the matrix: a panel per function iteration (rows) and function (columns)."""
    c, matrix = data["tokens"], data["matrix"]
    k, u = c.shape[:2]
    axes = fig.subplots(k, u, squeeze=False)
    place = divmod(
        num_context, _matrix_shape(num_context + 1)[1]
    )  # the candidate's cell: the missing panel's
    mappable = None
    for i in range(k):
        for f in range(u):
            ax = axes[i, f]
            mappable = ax.imshow(matrix[i, f], cmap="magma", vmin=0.0, vmax=1.0, interpolation="nearest")
            _write_values(ax, matrix[i, f], fontsize=6)
            ax.add_patch(_square(place[1] - 0.5, place[0] - 0.5, mark))
            ax.set_xticks([])
            ax.set_yticks([])
            _panel_title(ax, trace, i, f, c[i, f, 0])
    fig.colorbar(mappable, ax=axes.ravel().tolist(), shrink=0.6, label="compatibility C")
    fig.suptitle("C of the chosen candidate's set, on the matrix (CLS above)", fontsize=8)


def _plot_puzzle_path(trace: RoutingTrace, index: int) -> Figure:
    """Computational path of one PGM puzzle: the puzzle's panels, and C of the chosen candidate's set on its matrix."""
    data = computational_path_data(trace, index)
    k, u, n = data["tokens"].shape
    num_context = n - trace.num_task_tokens - 1
    mark = CORRECT_COLOUR if data["prediction"] == data["label"] else CHOSEN_COLOUR
    fig = _new_figure(2.8 + 1.45 * u + 0.9, max(1.45 * k + 0.9, 4.6))
    left, right = fig.subfigures(1, 2, width_ratios=[2.8, 1.45 * u + 0.9])
    _draw_puzzle(left, data, num_context, mark)
    _draw_matrix_paths(right, trace, data, num_context, mark)
    fig.suptitle(_puzzle_title(trace, index), fontsize=10)
    return fig


# ---------------------------------------------------------------------------------------------- paths


def _draw_task_tokens(ax: Any, trace: RoutingTrace, cls: np.ndarray, first_row: bool) -> None:
    """C of every task's CLS token (rows) with each function (columns), at one function iteration."""
    ax.imshow(cls, cmap="magma", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
    ax.set_xticks(range(cls.shape[1]))
    ax.set_yticks(range(len(trace.task_names)))
    ax.set_yticklabels([n[:14] for n in trace.task_names], fontsize=6)
    ax.tick_params(axis="x", labelsize=6)
    if first_row:
        ax.set_title("task tokens\n(C per function)", fontsize=9)


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
    tasks_column = trace.num_task_tokens > 1
    fig = _new_figure(1.55 * (u + 1 + tasks_column) + 0.9, 1.5 * max(k, 1) + 0.7)
    axes = fig.subplots(max(k, 1), u + 1 + tasks_column, squeeze=False)
    image = trace.images[index] if trace.images is not None else None
    grey = None if image is None else image.mean(-1)
    extent = (0, trace.grid[1], trace.grid[0], 0)
    for ax in axes[:, 0]:
        ax.axis("off")
    if image is not None:
        axes[0, 0].imshow(image, extent=extent, interpolation="nearest")
        axes[0, 0].set_title("input", fontsize=9)
    shade = dict(cmap="magma", vmin=0.0, vmax=1.0, alpha=0.7, extent=extent, interpolation="nearest")
    mappable = None
    for i in range(k):
        for f in range(u):
            ax = axes[i, f + 1]
            if grey is not None:
                ax.imshow(grey, cmap="gray", extent=extent, interpolation="nearest")
            mappable = ax.imshow(patches[i, f], **shade)
            ax.set_xticks([])
            ax.set_yticks([])
            _panel_title(ax, trace, i, f, cls[i, data["task_id"], f])
        if tasks_column:
            _draw_task_tokens(axes[i, -1], trace, cls[i], i == 0)
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
    rows = [f"function {f}" + (" (off)" if f in trace.disabled_functions else "") for f in range(u)]
    fig = _new_figure(max(6.0, 1.6 + 0.36 * n), 1.3 + max(k, 1) * (0.3 * (u + 1) + 0.35))
    axes = fig.subplots(max(k, 1), 1, squeeze=False, sharex=True)[:, 0]
    mappable = None
    for i in range(k):
        ax = axes[i]
        mappable = ax.imshow(
            values[i], cmap="magma", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest"
        )
        _write_values(ax, values[i], fontsize=5)
        ax.axvline(t - 0.5, color="cyan", linewidth=1.5)
        ax.set_yticks(range(u + 1))
        ax.set_yticklabels([*rows, "none"], fontsize=7)
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


# ---------------------------------------------------------------------------------------------- types, usage, W


def _draw_signatures(ax: Any, signatures: np.ndarray, palette: Any) -> None:
    """The signatures s_u as stars, named s0, s1, ..."""
    colours = [palette(u % 10) for u in range(len(signatures))]
    ax.scatter(
        signatures[:, 0], signatures[:, 1], marker="*", s=140, c=colours, edgecolors="black", linewidths=0.8
    )
    for u, (x, y) in enumerate(signatures):
        ax.annotate(f"s{u}", (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")


def _legend(ax: Any, names: Sequence[str], palette: Any) -> None:
    from matplotlib.lines import Line2D

    handles = [
        Line2D([], [], marker="o", ls="", color=palette(j % 10), label=name) for j, name in enumerate(names)
    ]
    ax.legend(handles=handles, fontsize=6, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)


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
    by = ((data["function"], "by function"), (None, f"by class ({data['label_source']})"))
    for i in range(k):
        xy = data["types"][i].reshape(-1, 2)
        for row, (colour_by, what) in enumerate(by):
            values = np.repeat(data["label"], n) if colour_by is None else colour_by[i].reshape(-1)
            ax = axes[row, i]
            colours = np.array([palette(int(v) % 10) if v >= 0 else (0.7, 0.7, 0.7, 1.0) for v in values])
            ax.scatter(xy[:, 0], xy[:, 1], c=colours, s=6, linewidths=0)
            _draw_signatures(ax, data["signatures"][i], palette)
            if row == 0:
                ax.set_title(_step_name(trace.steps, i), fontsize=9)
            if i == 0:
                ax.set_ylabel(what, fontsize=9)
            ax.tick_params(labelsize=6)
    classes = trace.class_names + [
        str(c) for c in range(len(trace.class_names), int(data["label"].max()) + 1)
    ]
    _legend(axes[0, -1], [f"function {u}" for u in range(trace.num_functions)], palette)
    _legend(axes[1, -1], classes, palette)
    fig.suptitle(f"Types t of {b} samples x {n} tokens ({method.upper()}); stars: signatures", fontsize=10)
    return fig


def _usage_parts(usage: FunctionUsage) -> list[tuple[str, list[str], np.ndarray]]:
    """(what a row is, row names, mean C) of each heat map: per function iteration, task, token and class."""
    tasks = [i for i, m in enumerate(usage.task_tokens) if m]
    classes = [i for i, m in enumerate(usage.class_tokens) if m]
    cls_rows = usage.task_source == "cls_token"
    parts = [
        (
            "function iteration",
            [_step_name(usage.steps, i) for i in range(len(usage.steps))],
            usage.by_iteration,
        ),
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
    return [part for part in parts if len(part[1])]


def plot_function_usage(usage: FunctionUsage) -> Figure:
    """Function usage as heatmaps: mean C of each function per function iteration, per task and per class (of a PGM
    trace: per token position and relation type)."""
    if not isinstance(usage, FunctionUsage):
        raise TypeError(
            f"`usage` must be a FunctionUsage (from FunctionUsage.from_trace), got {type(usage).__name__}."
        )
    parts = _usage_parts(usage)
    u = usage.iteration_sums.shape[1]
    height = 1.0 + 0.25 * max(len(names) for _, names, _ in parts)
    fig = _new_figure(0.8 + (1.0 + 0.45 * u) * len(parts), height)
    axes = fig.subplots(1, len(parts), squeeze=False)[0]
    mappable = None
    for ax, (title, names, values) in zip(axes, parts, strict=True):
        mappable = ax.imshow(
            values, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest"
        )
        _write_values(ax, values, fontsize=6)
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
        r, c = divmod(q - trace.num_task_tokens, trace.grid[1])
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
    fig.suptitle(
        f"Eq. 6 weights W of function {function}, head {head}, iteration {data['step'][1] + 1}:\n"
        f"what the {_token_name(trace, q)} reads (its C = {data['query_compatibility']:.2f})",
        fontsize=8,
    )
    return fig


# ---------------------------------------------------------------------------------------------- saving


def _check_figure(fig: Any, dpi: Any) -> None:
    if not hasattr(fig, "savefig") or not hasattr(fig, "canvas"):
        raise TypeError(
            f"`fig` must be a matplotlib Figure (from a plot_* function), got {type(fig).__name__}."
        )
    _positive_number("dpi", dpi)


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
