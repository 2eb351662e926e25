#!/usr/bin/env python
"""Tables and plots of the dynamic-inference studies written by ``run_digits_adaptation.py``, in the style of the
paper's Figures 4 and 5 (mean over seeds or draws, error bars one standard deviation).

Give it the ``adaptation_results.json`` of one or more runs, for example the Neural Interpreter's and the
multi-task ViT's, to draw their fast-adaptation curves in one plot:

    python examples/plot_adaptation_studies.py runs/adapt-ni/adaptation_results.json \
        runs/adapt-vit/adaptation_results.json --output_dir runs/dynamic-inference

It writes ``fast_adaptation.png``, ``capacity_extension.png``, ``dropped_functions.png`` and
``function_iterations.png`` (each when some run has that study) and ``dynamic_inference.md`` with the tables.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

ARCHITECTURE_NAMES = {"neural_interpreter": "Neural Interpreter", "vit": "multi-task ViT"}
REPORT_MD = "dynamic_inference.md"
REQUIRED_KEYS = ("model", "new_task", "arguments")
STUDIES = (
    "fast_adaptation",
    "reinitialized_functions",
    "capacity_extension",
    "dropped_functions",
    "function_iterations",
)


def _fmt(summary: dict[str, Any]) -> str:
    return f"{100 * summary['mean']:.2f} ± {100 * summary['std']:.2f} ({summary['runs']})"


def _by_int_key(study: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    return sorted(((int(k), v) for k, v in study.items()), key=lambda item: item[0])


def _pretraining_tasks(study: dict[str, Any]) -> list[str]:
    first = next(iter(study.values()))
    return [key.removeprefix("accuracy_") for key in first if key.startswith("accuracy_")]


def _label(results: dict[str, Any]) -> str:
    return ARCHITECTURE_NAMES.get(results.get("architecture", "neural_interpreter"), results["architecture"])


def _per_task_table(study: dict[str, Any], key_name: str, caption: str) -> list[str]:
    tasks = _pretraining_tasks(study)
    lines = [
        caption,
        "",
        f"| {key_name} | all | " + " | ".join(tasks) + " |",
        "|---" * (len(tasks) + 2) + "|",
    ]
    for k, entry in _by_int_key(study):
        cells = [_fmt(entry["accuracy"])] + [_fmt(entry[f"accuracy_{t}"]) for t in tasks]
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def _curve_name(results: dict[str, Any], study: str) -> str:
    if results.get("architecture") == "vit":
        return f"{_label(results)}, pre-trained"
    return (
        f"{_label(results)}, {'re-drawn' if study == 'reinitialized_functions' else 'pre-trained'} functions"
    )


def _fast_adaptation_table(runs: Sequence[dict[str, Any]]) -> list[str]:
    """Accuracy against the training samples N, one column per curve (fast adaptation, re-drawn functions)."""
    curves = [
        (_curve_name(r, s), r[s], r["arguments"])
        for r in runs
        for s in ("fast_adaptation", "reinitialized_functions")
        if r.get(s)
    ]
    if not curves:
        return []
    sizes = sorted({int(n) for _, study, _ in curves for n in study})
    lines = ["Fine-tuning on N samples of the new dataset, all parameters; test accuracy (%).", ""]
    lines += ["| training samples | " + " | ".join(name for name, _, _ in curves) + " |"]
    lines += ["|---" * (len(curves) + 1) + "|"]
    for n in sizes:
        cells = [_fmt(study[str(n)]) if str(n) in study else "" for _, study, _ in curves]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    settings = {
        f"{name}: {a['adapt_epochs']:g} epochs, RAdam {a['adapt_learning_rate']:g}": None
        for name, _, a in curves
    }
    return [*lines, "", "Settings: " + "; ".join(settings) + ".", ""]


def _capacity_table(results: dict[str, Any]) -> list[str]:
    arguments = results["arguments"]
    lines = [
        f"Capacity extension ({_label(results)}): functions added, then only codes, signatures, CLS token "
        f"and head trained on {arguments['capacity_train_samples']} samples, RAdam "
        f"{arguments['capacity_learning_rate']:g}; test accuracy (%) on {results['new_task']}.",
        "",
        "| functions per script | added | accuracy |",
        "|---|---|---|",
    ]
    for u, entry in _by_int_key(results["capacity_extension"]):
        lines.append(f"| {u} | {entry['new_functions']} | {_fmt(entry)} |")
    return [*lines, ""]


NO_TRAINING_TABLES = (
    (
        "dropped_functions",
        "functions dropped per script",
        ", mean ± std over the choices of dropped functions",
    ),
    ("function_iterations", "function iterations", " when the model stops after this many iterations"),
)


def results_markdown(runs: Sequence[dict[str, Any]]) -> str:
    """The studies' tables (test accuracy in %, mean ± std (runs) over seeds or draws) of one or more runs."""
    lines: list[str] = []
    for results in runs:
        precision = results.get("environment", {}).get("mixed_precision", "no")
        lines.append(
            f"- {_label(results)}: `{results['model']}`, new dataset {results['new_task']}, "
            f"{results.get('environment', {}).get('date', 'undated')}"
            + (f", {precision} autocast" if precision != "no" else "")
        )
    lines.append("")
    lines += _fast_adaptation_table(runs)
    for results in runs:
        if results.get("capacity_extension"):
            lines += _capacity_table(results)
        for study, key_name, what in NO_TRAINING_TABLES:
            if results.get(study):
                caption = (
                    f"{study.replace('_', ' ').capitalize()} ({_label(results)}): no training; test accuracy (%) "
                    f"on the pre-training datasets{what}."
                )
                lines += _per_task_table(results[study], key_name, caption)
    return "\n".join(lines)


def _errorbar(ax: Any, keys: Sequence[int], entries: Sequence[dict[str, Any]], **kwargs: Any) -> None:
    ax.errorbar(
        keys,
        [100 * e["mean"] for e in entries],
        yerr=[100 * e["std"] for e in entries],
        marker="o",
        markersize=4,
        capsize=3,
        **kwargs,
    )


def _plot_fast_adaptation(plt: Any, runs: Sequence[dict[str, Any]]) -> Any:
    """Figure 4a / 5: accuracy against the training samples, one curve per run and study; None without any."""
    curves = [(r, s) for r in runs for s in ("fast_adaptation", "reinitialized_functions") if r.get(s)]
    if not curves:
        return None
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for results, study in curves:
        name = _label(results) + (", re-drawn functions" if study == "reinitialized_functions" else "")
        points = _by_int_key(results[study])
        _errorbar(ax, [n for n, _ in points], [e for _, e in points], label=name,
                  linestyle="--" if study == "reinitialized_functions" else "-")  # fmt: skip
    ax.set_xscale("log", base=2)
    sizes = sorted({int(n) for results, study in curves for n in results[study]})
    ax.set_xticks(sizes, [str(n) for n in sizes], fontsize=8, rotation=45 if len(sizes) > 5 else 0)
    ax.minorticks_off()
    ax.set_xlabel("training samples of the new dataset")
    ax.set_ylabel(f"test accuracy on {curves[0][0]['new_task']} (%)")
    ax.set_title("Fast adaptation (paper: Fig. 4a, 5)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def _plot_capacity(plt: Any, results: dict[str, Any]) -> Any:
    """Figure 4b: accuracy against the functions per script."""
    fig, ax = plt.subplots(figsize=(4.5, 3.5))
    points = _by_int_key(results["capacity_extension"])
    _errorbar(ax, [u for u, _ in points], [e for _, e in points])
    ax.set_xticks([u for u, _ in points])
    ax.set_xlabel("functions per script (pre-trained + added)")
    ax.set_ylabel(f"test accuracy on {results['new_task']} (%)")
    ax.set_title("Capacity extension (paper: Fig. 4b)", fontsize=10)
    ax.grid(alpha=0.3)
    return fig


def _plot_per_task(plt: Any, study: dict[str, Any], xlabel: str, title: str) -> Any:
    """A study without training: accuracy on all pre-training datasets (and each, when several) against its key."""
    fig, ax = plt.subplots(figsize=(4.5, 3.5))
    points = _by_int_key(study)
    tasks = _pretraining_tasks(study)
    for task in ["", *tasks] if len(tasks) > 1 else [""]:
        key = f"accuracy_{task}" if task else "accuracy"
        _errorbar(ax, [k for k, _ in points], [e[key] for _, e in points], label=task or "all")
    ax.set_xticks([k for k, _ in points])
    ax.set_xlabel(xlabel)
    ax.set_ylabel("test accuracy, pre-training datasets (%)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


NO_TRAINING_PLOTS = (
    ("dropped_functions", "functions dropped per script", "Dropped functions (paper: Fig. 4c)"),
    ("function_iterations", "function iterations run", "Fewer function iterations"),
)


def write_plots(runs: Sequence[dict[str, Any]], output_dir: str | Path) -> list[Path]:
    """One PNG per study present in ``runs``; returns their paths (needs matplotlib, the ``vis`` extra)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    # Each figure drawn, saved and closed in turn: one open at a time.
    figures: list[tuple[str, Callable[[], Any]]] = [
        ("fast_adaptation", partial(_plot_fast_adaptation, plt, runs))
    ]
    for results in runs:
        if results.get("capacity_extension"):
            figures.append(("capacity_extension", partial(_plot_capacity, plt, results)))
        for study, xlabel, title in NO_TRAINING_PLOTS:
            if results.get(study):
                figures.append((study, partial(_plot_per_task, plt, results[study], xlabel, title)))
    written = []
    for name, draw in figures:
        fig = draw()
        if fig is None:
            continue
        path = output_dir / f"{name}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110, metadata={"Software": None})
        plt.close(fig)
        written.append(path)
    return written


def load_results(path: str) -> dict[str, Any]:
    """One run's ``adaptation_results.json``; a ValueError that names the file and what is wrong with it."""
    expected = "expected an adaptation_results.json of run_digits_adaptation.py"
    if not Path(path).is_file():
        raise ValueError(f"{path}: no such file; {expected}")
    try:
        results = json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path}: not JSON ({error}); {expected}") from None
    if not isinstance(results, dict):
        raise ValueError(f"{path}: holds a JSON {type(results).__name__}, not an object; {expected}")
    missing = [key for key in REQUIRED_KEYS if key not in results]
    if missing:
        raise ValueError(f"{path}: no {', '.join(map(repr, missing))}; {expected}")
    for study in STUDIES:
        entries = results.get(study)
        if entries is not None and not (
            isinstance(entries, dict)
            and all(key.isdigit() and isinstance(v, dict) for key, v in entries.items())
        ):
            raise ValueError(f"{path}: {study!r} is not an object of entries keyed by a number; {expected}")
    return results


def main(argv: Sequence[str] | None = None) -> list[Path]:
    """Read the runs' results, draw their plots and write their tables; return the plots' paths."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "results", nargs="+", help="adaptation_results.json files of run_digits_adaptation.py"
    )
    parser.add_argument("--output_dir", required=True, help="Where the PNGs and dynamic_inference.md go.")
    args = parser.parse_args(argv)
    runs = []
    for path in args.results:
        try:
            runs.append(load_results(path))
        except ValueError as error:
            parser.error(str(error))
    output_dir = Path(args.output_dir)
    written = write_plots(runs, output_dir)
    (output_dir / REPORT_MD).write_text(results_markdown(runs))
    print(f"Wrote {output_dir / REPORT_MD} and {', '.join(p.name for p in written) or 'no plots'}")
    return written


if __name__ == "__main__":
    main()
