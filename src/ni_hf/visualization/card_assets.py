"""What a model card shows of the routing: a computational path, the function usage (C of Eq. 4) as a table, its
numbers as JSON, and the card's Markdown section linking them by file name (upload the folder with them)."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .checks import _check_stem, _index, _output_dir
from .figures import plot_computational_path, plot_function_usage, plot_set_path, save_figure
from .trace import (
    MULTIPLE_CHOICE_MODEL,
    RoutingTrace,
    _class_labels,
    _mro_names,
    _traced_backbone,
    trace_routing,
)
from .usage import FunctionUsage


def _write_usage(usage: FunctionUsage, path: Path) -> Path:
    path.write_text(json.dumps(usage.to_dict(), indent=2) + "\n")
    return path


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
    usage_json = _write_usage(usage, output_dir / "routing_usage.json")
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


def _set_pictures(
    trace: RoutingTrace, usage: FunctionUsage, index: int, output_dir: Path, stem: str
) -> tuple[list[Path], list[str]]:
    """Draw a set-regression trace's path (sample `index`) and usage; returns their files and the card's lines."""
    path_png, usage_png = output_dir / f"{stem}_path.png", output_dir / f"{stem}_usage.png"
    save_figure(plot_set_path(trace, index), path_png)
    save_figure(plot_function_usage(usage), usage_png)
    lines = [
        f"![Computational path of one test point]({path_png.name})",
        "",
        "The computational path of one test point: at each function iteration (panels), the compatibility C "
        "of Eq. 4 of each function (rows) with each token (columns: the CLS token of every function to "
        "regress, then the input variables); 'none' is the share of a token that no function processes.",
        "",
        f"![Function usage]({usage_png.name})",
        "",
    ]
    return [path_png, usage_png], lines


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
    usage_json = _write_usage(usage, output_dir / f"{stem}_usage.json")
    drawn = importlib.util.find_spec("matplotlib") is not None if draw is None else bool(draw)
    pictures, picture_lines = _set_pictures(trace, usage, index, output_dir, stem) if drawn else ([], [])
    lines = [
        heading,
        "",
        *picture_lines,
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
        "files": [str(f) for f in [*pictures, usage_json]],
        "usage": usage.to_dict(),
        "drawn": drawn,
    }


def _pgm_card_markdown(trace: RoutingTrace, usage: FunctionUsage, index: int, files: Sequence[Path]) -> str:
    """The PGM card's "Routing" section: the path of puzzle `index`, the usage picture and its table."""
    path_png, usage_png, usage_json = files
    chosen = int(trace.predictions[index])
    if trace.labels is None:
        puzzle, solved = f"the model chose candidate {chosen + 1}", ""
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
    return "\n".join(
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
    files = [output_dir / f"{stem}_path.png", output_dir / f"{stem}_usage.png"]
    save_figure(figures["path"], files[0])
    save_figure(figures["usage"], files[1])
    files.append(_write_usage(usage, output_dir / f"{stem}_usage.json"))
    return {
        "markdown": _pgm_card_markdown(trace, usage, index, files),
        "files": [str(f) for f in files],
        "usage": usage.to_dict(),
    }
