#!/usr/bin/env python
"""Tables and plots of PGM abstract-reasoning runs of ``run_pgm.py`` (section 4.3): accuracy beside the
paper's Table 2, accuracy per relation type, and the anytime curve (the paper's Figure 6).

    python examples/plot_pgm.py --results runs/pgm-ni runs/pgm-vit/pgm_results.json --output_dir runs/report

Each of ``--results`` is a ``pgm_results.json`` or a folder holding one. Runs of the same (architecture,
regime) are seeds of one setting: the tables give their mean ± standard deviation (number of runs), the plots
one standard deviation as error bars. Writes ``pgm_summary.json`` (every number of the tables),
``pgm_tables.md``, ``pgm_accuracy.png`` (val and test accuracy per regime, Neural Interpreter and ViT) and
``pgm_anytime.png`` (a Neural Interpreter's accuracy against function iterations per script, one line per
regime; when some run has an anytime curve). Needs matplotlib (the ``vis`` extra).
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformers import HfArgumentParser

RESULTS_FILE = "pgm_results.json"
SUMMARY_JSON = "pgm_summary.json"
TABLES_MD = "pgm_tables.md"
ACCURACY_PNG = "pgm_accuracy.png"
ANYTIME_PNG = "pgm_anytime.png"
EXPECTED = f"expected a {RESULTS_FILE} of examples/run_pgm.py (or a folder holding one)"

# The models, and the context-blind baseline (the panel CNN and scorer seeing the candidates only): what a model
# reaches without reading the matrix.
ARCHITECTURES = {"neural_interpreter": "NI", "vit": "ViT", "candidates_only": "context-blind"}
SPLITS = {"val": "val (in distribution)", "test": "test (out of distribution)"}
CHANCE = 1 / 8  # one of 8 candidates
ANYTIME_CLAIM = 0.7  # section 4.3: at least 70% of the accuracy kept with half the function iterations
# The paper's Table 2, (val, test) accuracy in %, in its column order (DeepMind's regime names).
PAPER_TABLE_2: dict[str, dict[str, tuple[float, float]]] = {
    "neural_interpreter": {
        "neutral": (77.3, 77.0),
        "interpolation": (87.9, 70.5),
        "attrs.pairs": (69.5, 36.6),
        "attr.rel.pairs": (68.6, 45.2),
        "attr.rels": (79.9, 20.0),
        "extrapolation": (91.8, 19.4),
    },
    "vit": {
        "neutral": (73.3, 72.7),
        "interpolation": (89.9, 67.7),
        "attrs.pairs": (69.4, 34.1),
        "attr.rel.pairs": (67.6, 44.1),
        "attr.rels": (73.8, 15.9),
        "extrapolation": (92.2, 16.4),
    },
}
PAPER_REGIME_NAMES = {
    "attrs.pairs": "H.O. attribute pairs",
    "attr.rel.pairs": "H.O. triple pairs",
    "attr.rels": "H.O. triples",
}
# What the runs of one group must share.
SETTING_KEYS = ("preset", "dataset_source", "max_triples", "free_attributes")


@dataclass
class PlotArguments:
    """What to read and where the tables and plots go."""

    results: list[str] = field(
        metadata={
            "help": f"{RESULTS_FILE} files of examples/run_pgm.py, or folders holding one (any number)."
        }
    )
    output_dir: str = field(
        metadata={"help": f"Where {SUMMARY_JSON}, {TABLES_MD}, {ACCURACY_PNG} and {ANYTIME_PNG} go."}
    )


# ------------------------------------------------------------------------------------------------- reading


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_fraction(path: Path, where: str, value: Any) -> None:
    if not (_is_number(value) and math.isfinite(value) and 0 <= value <= 1):
        raise ValueError(f"{path}: {where} is {value!r}, not an accuracy in [0, 1]; {EXPECTED}")


def relation_types(split: dict[str, Any]) -> list[str]:
    """The relation types a split reports (``accuracy_<type>`` beside ``num_samples_<type>``), in order."""
    return [
        key.removeprefix("accuracy_")
        for key in split
        if key.startswith("accuracy_") and f"num_samples_{key.removeprefix('accuracy_')}" in split
    ]


def load_results(path: str | Path) -> dict[str, Any]:
    """One run's results (a ``pgm_results.json`` or a folder holding one), checked; errors name the file."""
    file = Path(path)
    if file.is_dir():
        file = file / RESULTS_FILE
        if not file.is_file():
            raise ValueError(f"{path}: a folder without {RESULTS_FILE}; {EXPECTED}")
    elif not file.is_file():
        raise ValueError(f"{path}: no such file; {EXPECTED}")
    try:
        # run_pgm.py writes NaN for a relation type no puzzle holds: Python's json reads it.
        results = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{file}: not JSON ({error}); {EXPECTED}") from None
    if not isinstance(results, dict):
        raise ValueError(f"{file}: holds a JSON {type(results).__name__}, not an object; {EXPECTED}")
    missing = [key for key in ("architecture", "regime", *SPLITS) if key not in results]
    if missing:
        raise ValueError(f"{file}: no {', '.join(map(repr, missing))}; {EXPECTED}")
    if results["architecture"] not in ARCHITECTURES:
        raise ValueError(
            f"{file}: architecture {results['architecture']!r}, expected one of {list(ARCHITECTURES)}; "
            + EXPECTED
        )
    if not isinstance(results["regime"], str):
        raise ValueError(f"{file}: regime {results['regime']!r} is not a name; {EXPECTED}")
    for split in SPLITS:
        metrics = results[split]
        if not isinstance(metrics, dict) or "accuracy" not in metrics:
            raise ValueError(f"{file}: {split!r} has no 'accuracy'; {EXPECTED}")
        _check_fraction(file, f"{split} accuracy", metrics["accuracy"])
        for name in relation_types(metrics):
            count = metrics[f"num_samples_{name}"]
            if not (isinstance(count, int) and count >= 0):
                raise ValueError(f"{file}: {split} num_samples_{name} is {count!r}, not a count; {EXPECTED}")
            if count:
                _check_fraction(
                    file, f"{split} accuracy_{name} (of {count} puzzles)", metrics[f"accuracy_{name}"]
                )
    anytime = results.get("anytime")
    if anytime is not None:
        if not isinstance(anytime, list) or not all(isinstance(row, dict) for row in anytime):
            raise ValueError(f"{file}: 'anytime' is not a list of rows; {EXPECTED}")
        for row in anytime:
            k = row.get("function_iterations")
            if not (isinstance(k, int) and k >= 1):
                raise ValueError(f"{file}: an anytime row has function_iterations {k!r}; {EXPECTED}")
            for split in SPLITS:
                _check_fraction(
                    file, f"anytime {split}_accuracy at {k} function iterations", row.get(f"{split}_accuracy")
                )
    return {**results, "path": str(file)}


def group_runs(runs: Sequence[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Runs by (architecture, regime), each group's runs of one setting; a file given twice is refused."""
    seen: dict[str, int] = {}
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for run in runs:
        resolved = str(Path(run["path"]).resolve())
        if resolved in seen:
            raise ValueError(f"{run['path']}: given twice (it would count as two seeds).")
        seen[resolved] = 1
        groups.setdefault((run["architecture"], run["regime"]), []).append(run)
    for (architecture, regime), members in groups.items():
        for key in SETTING_KEYS:
            values = {json.dumps(run.get(key)) for run in members}
            if len(values) > 1:
                files = ", ".join(f"{run['path']} ({run.get(key)})" for run in members)
                raise ValueError(
                    f"The {ARCHITECTURES[architecture]} runs on {regime} differ in {key}: {files}; runs of "
                    "one (architecture, regime) are read as seeds of one setting."
                )
    return groups


# --------------------------------------------------------------------------------------------- summarising


def mean_std(values: Sequence[float]) -> dict[str, Any]:
    """Mean, sample standard deviation (None for one run) and number of runs."""
    return {
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else None,
        "runs": len(values),
    }


def regime_order(regimes: Sequence[str]) -> list[str]:
    """The paper's Table 2 columns first, in its order, then the others in the order given."""
    paper = list(PAPER_TABLE_2["neural_interpreter"])
    return sorted(dict.fromkeys(regimes), key=lambda r: paper.index(r) if r in paper else len(paper))


def summarize_split(runs: Sequence[dict[str, Any]], split: str) -> dict[str, Any]:
    """Accuracy over the runs, and per relation type over the runs whose split holds it (puzzles summed)."""
    summary = {"accuracy": mean_std([run[split]["accuracy"] for run in runs]), "relations": {}}
    for name in dict.fromkeys(name for run in runs for name in relation_types(run[split])):
        holding = [run[split] for run in runs if run[split].get(f"num_samples_{name}")]
        summary["relations"][name] = {
            **(
                mean_std([m[f"accuracy_{name}"] for m in holding])
                if holding
                else {"mean": None, "std": None, "runs": 0}
            ),
            "num_samples": sum(m[f"num_samples_{name}"] for m in holding),
        }
    return summary


def other_context(runs: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """Test accuracy with each puzzle's context panels taken from another puzzle, over the runs that measured it."""
    values = [run["test_other_context"]["accuracy"] for run in runs if run.get("test_other_context")]
    return mean_std(values) if values else None


def summarize_anytime(runs: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """Mean curves over the runs that have one; the accuracy kept at half the iterations (section 4.3)."""
    curves = {
        run["path"]: {row["function_iterations"]: row for row in run["anytime"]}
        for run in runs
        if run.get("anytime")
    }
    if not curves:
        return None
    (first, iterations), *others = ((path, sorted(curve)) for path, curve in curves.items())
    for path, other in others:
        if other != iterations:
            raise ValueError(
                f"{path}: anytime curve at function iterations {other}, {first}: at {iterations}."
            )
    trained, half = iterations[-1], iterations[-1] // 2
    summary: dict[str, Any] = {"function_iterations": iterations, "trained": trained, "half": half or None}
    for split in SPLITS:
        by_k = {k: mean_std([curve[k][f"{split}_accuracy"] for curve in curves.values()]) for k in iterations}
        summary[split] = [by_k[k] for k in iterations]
        full, at_half = by_k[trained]["mean"], by_k[half]["mean"] if half in by_k else None
        kept = at_half / full if at_half is not None and full > 0 else None
        summary[f"{split}_kept"] = kept
        summary[f"{split}_kept_above_chance"] = (
            (at_half - CHANCE) / (full - CHANCE) if at_half is not None and full > CHANCE else None
        )
        summary[f"{split}_claim_holds"] = None if kept is None else kept >= ANYTIME_CLAIM
    return summary


def same_split_warning(run: dict[str, Any]) -> str | None:
    """A warning when val and test agree in loss and every count: test most likely read the val puzzles."""
    val, test = run["val"], run["test"]
    keys = ["accuracy", "loss", *(key for key in val if key.startswith("num_samples"))]
    if "loss" in val and all(key in test and val[key] == test[key] for key in keys):
        return (
            f"{run['path']}: val and test give the same accuracy, loss and puzzle counts; test most likely "
            "evaluated the val puzzles (Trainer reuses its first evaluation DataLoader under "
            "--dataloader_persistent_workers)."
        )
    return None


def summarize(groups: dict[tuple[str, str], list[dict[str, Any]]]) -> dict[str, Any]:
    """Every number of the tables: per group the settings, accuracies, relation types and anytime curve."""
    summary: dict[str, Any] = {"groups": [], "runs": [], "warnings": []}
    for regime in regime_order([regime for _, regime in groups]):
        for architecture in ARCHITECTURES:
            runs = groups.get((architecture, regime))
            if not runs:
                continue
            paper = PAPER_TABLE_2.get(architecture, {}).get(regime)
            first = runs[0]
            summary["groups"].append(
                {
                    "architecture": architecture,
                    "regime": regime,
                    "runs": len(runs),
                    **{key: first.get(key) for key in SETTING_KEYS},
                    "num_parameters": first.get("num_parameters"),
                    "sizes": first.get("sizes"),
                    "paper": None if paper is None else {"val": paper[0] / 100, "test": paper[1] / 100},
                    **{split: summarize_split(runs, split) for split in SPLITS},
                    "other_context": other_context(runs),
                    "anytime": summarize_anytime(runs) if architecture == "neural_interpreter" else None,
                }
            )
            for run in runs:
                train = run.get("train") or {}
                summary["runs"].append(
                    {
                        "path": run["path"],
                        "architecture": architecture,
                        "regime": regime,
                        "epochs": train.get("epoch"),
                        "train_runtime": train.get("train_runtime"),
                        "mixed_precision": (run.get("environment") or {}).get("mixed_precision"),
                        **{f"{split}_accuracy": run[split]["accuracy"] for split in SPLITS},
                        "other_context_accuracy": (run.get("test_other_context") or {}).get("accuracy"),
                        "command": run.get("command"),
                    }
                )
                warning = same_split_warning(run)
                if warning:
                    summary["warnings"].append(warning)
    return summary


# --------------------------------------------------------------------------------------------------- tables


def _pct(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{100 * value:.{digits}f}%"


def _fmt(entry: dict[str, Any] | None) -> str:
    """``mean ± std (runs)`` in %, ``mean (1)`` for one run, ``–`` for none."""
    if entry is None or entry["mean"] is None:
        return "–"
    spread = "" if entry["std"] is None else f" ± {100 * entry['std']:.1f}"
    return f"{100 * entry['mean']:.1f}{spread} ({entry['runs']})"


def _regime_label(regime: str) -> str:
    return f"{regime} ({PAPER_REGIME_NAMES[regime]})" if regime in PAPER_REGIME_NAMES else regime


def _by_key(summary: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(group["architecture"], group["regime"]): group for group in summary["groups"]}


def tables_markdown(summary: dict[str, Any]) -> str:
    """The accuracy tables per split beside the paper's Table 2, relation types, and the anytime table."""
    groups = _by_key(summary)
    regimes = regime_order([group["regime"] for group in summary["groups"]])
    lines = ["# PGM results (section 4.3)", "", *_runs_lines(summary)]
    if summary["warnings"]:
        lines += ["", "**Warnings**", "", *(f"- {warning}" for warning in summary["warnings"])]
    for split, title in SPLITS.items():
        lines += _accuracy_table(groups, regimes, split, title)
    lines += _other_context_table(groups, regimes)
    for split, title in SPLITS.items():
        lines += _relation_table(summary, split, title)
    anytime = [group for group in summary["groups"] if group["anytime"]]
    if anytime:
        lines += _anytime_table(anytime) + _anytime_claim_table(anytime)
    return "\n".join(lines) + "\n"


def _runs_lines(summary: dict[str, Any]) -> list[str]:
    """One item per group (its setting, parameters and puzzles) with one sub-item per run."""
    lines = []
    for group in summary["groups"]:
        sizes = group["sizes"] or {}
        triples = f", at most {group['max_triples']} triple(s) a puzzle" if group["max_triples"] else ""
        if group.get("free_attributes"):
            triples += f", attributes in no triple {group['free_attributes']}"
        lines.append(
            f"- {ARCHITECTURES[group['architecture']]}, {group['regime']}: {group['runs']} run(s), preset "
            f"{group['preset']}, {group['dataset_source']} puzzles{triples}, "
            f"{group['num_parameters'] or 0:,} parameters; puzzles "
            + ", ".join(f"{split} {count:,}" for split, count in sizes.items())
        )
        for run in summary["runs"]:
            if (run["architecture"], run["regime"]) != (group["architecture"], group["regime"]):
                continue
            epochs = "–" if run["epochs"] is None else f"{run['epochs']:.2f}"
            runtime = "–" if run["train_runtime"] is None else f"{run['train_runtime']:.0f} s"
            lines.append(
                f"  - `{run['path']}`: {epochs} epochs in {runtime}, mixed precision "
                f"{run['mixed_precision'] or 'no'}; val {_pct(run['val_accuracy'], 2)}, "
                f"test {_pct(run['test_accuracy'], 2)}"
            )
    return lines


def _accuracy_table(
    groups: dict[tuple[str, str], dict[str, Any]], regimes: Sequence[str], split: str, title: str
) -> list[str]:
    """The accuracy of every model per regime on ``split``, beside chance and the paper's Table 2."""
    lines = [
        "",
        f"## Accuracy, {title}",
        "",
        "Accuracy (%), mean ± std over runs (number of runs); the paper's Table 2 beside it.",
        "",
        "| regime | " + " | ".join(ARCHITECTURES.values()) + " | chance | NI (paper) | ViT (paper) |",
        "|---" * (len(ARCHITECTURES) + 4) + "|",
    ]
    column = 0 if split == "val" else 1
    for regime in regimes:
        ours = [_fmt((groups.get((a, regime)) or {}).get(split, {}).get("accuracy")) for a in ARCHITECTURES]
        paper = [
            f"{PAPER_TABLE_2[a][regime][column]:.1f}" if regime in PAPER_TABLE_2[a] else "–"
            for a in PAPER_TABLE_2
        ]
        lines.append(f"| {_regime_label(regime)} | " + " | ".join([*ours, _pct(CHANCE)] + paper) + " |")
    return lines


def _other_context_table(groups: dict[tuple[str, str], dict[str, Any]], regimes: Sequence[str]) -> list[str]:
    """Test accuracy of every model per regime with another puzzle's context panels."""
    lines = [
        "",
        "## Test accuracy with another puzzle's context",
        "",
        "Each test puzzle's 8 context panels replaced by those of another puzzle, its candidates and answer kept: a "
        f"model that reads the matrix falls to chance ({_pct(CHANCE)}); mean ± std over runs (number of runs).",
        "",
        "| regime | " + " | ".join(ARCHITECTURES.values()) + " |",
        "|---" * (len(ARCHITECTURES) + 1) + "|",
    ]
    for regime in regimes:
        cells = [_fmt((groups.get((a, regime)) or {}).get("other_context")) for a in ARCHITECTURES]
        lines.append(f"| {_regime_label(regime)} | " + " | ".join(cells) + " |")
    return lines


def _relation_table(summary: dict[str, Any], split: str, title: str) -> list[str]:
    """Accuracy per relation type of every group on ``split``; none when no group reports relation types."""
    names = list(dict.fromkeys(name for group in summary["groups"] for name in group[split]["relations"]))
    if not names:
        return []
    lines = [
        "",
        f"## Accuracy by relation type, {title}",
        "",
        "Accuracy (%) on the puzzles holding each relation type, mean ± std over runs (number of runs), "
        "[puzzles, summed over the runs].",
        "",
        "| model | regime | " + " | ".join(name.replace("_", " ") for name in names) + " |",
        "|---|---" + "|---" * len(names) + "|",
    ]
    for group in summary["groups"]:
        relations = group[split]["relations"]
        cells = [
            f"{_fmt(relations[name])} [{relations[name]['num_samples']:,}]" if name in relations else "–"
            for name in names
        ]
        lines.append(
            f"| {ARCHITECTURES[group['architecture']]} | {group['regime']} | " + " | ".join(cells) + " |"
        )
    return lines


def _anytime_table(anytime: Sequence[dict[str, Any]]) -> list[str]:
    """Neural Interpreter accuracy per number of function iterations (the paper's Figure 6) of each regime."""
    lines = [
        "",
        "## Anytime inference (the paper's Figure 6)",
        "",
        "Neural Interpreter accuracy (%) with k function iterations per script, the trained number at "
        "the end; mean ± std over runs (number of runs).",
        "",
        "| regime | k | val | test |",
        "|---|---|---|---|",
    ]
    for group in anytime:
        curve = group["anytime"]
        for i, k in enumerate(curve["function_iterations"]):
            val, test = _fmt(curve["val"][i]), _fmt(curve["test"][i])
            lines.append(f"| {group['regime']} | {k} | {val} | {test} |")
    return lines


def _anytime_claim_table(anytime: Sequence[dict[str, Any]]) -> list[str]:
    """The accuracy kept with half the trained function iterations, against section 4.3's claim."""
    lines = [
        "",
        "Accuracy kept with half the trained function iterations (section 4.3 claims at least "
        f"{ANYTIME_CLAIM:.0%} on every regime's test set): the mean accuracy at k = half over that at "
        f"the trained k, and the same above chance ({CHANCE:.1%}), "
        "(acc(half) - chance) / (acc(trained) - chance).",
        "",
        "| regime | trained k | half | val kept | test kept | val kept above chance "
        f"| test kept above chance | val >= {ANYTIME_CLAIM:.0%} | test >= {ANYTIME_CLAIM:.0%} |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for group in anytime:
        curve = group["anytime"]
        verdicts = [
            "–"
            if curve[f"{split}_claim_holds"] is None
            else ("yes" if curve[f"{split}_claim_holds"] else "no")
            for split in SPLITS
        ]
        lines.append(
            f"| {group['regime']} | {curve['trained']} | {curve['half'] or '–'} | "
            f"{_pct(curve['val_kept'])} | {_pct(curve['test_kept'])} | "
            f"{_pct(curve['val_kept_above_chance'])} | {_pct(curve['test_kept_above_chance'])} | "
            + " | ".join(verdicts)
            + " |"
        )
    return lines


# ---------------------------------------------------------------------------------------------------- plots

COLORS = {"neural_interpreter": "tab:blue", "vit": "tab:orange", "candidates_only": "tab:gray"}


def write_plots(summary: dict[str, Any], output_dir: Path) -> list[Path]:
    """``pgm_accuracy.png`` and, when some run has an anytime curve, ``pgm_anytime.png``; their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []

    def save(fig: Any, name: str) -> None:
        path = output_dir / name
        fig.tight_layout()
        fig.savefig(path, dpi=110, metadata={"Software": None})
        plt.close(fig)
        written.append(path)

    save(_accuracy_figure(plt, summary), ACCURACY_PNG)
    anytime = [group for group in summary["groups"] if group["anytime"]]
    if anytime:
        save(_anytime_figure(plt, anytime), ANYTIME_PNG)
    return written


def _accuracy_figure(plt: Any, summary: dict[str, Any]) -> Any:
    """Bars of val and test accuracy per regime and model, the paper's Table 2 as marks, chance as a line."""
    groups = _by_key(summary)
    regimes = regime_order([group["regime"] for group in summary["groups"]])
    bars = [(a, split) for a in ARCHITECTURES for split in SPLITS]
    width = 0.8 / len(bars)
    fig, ax = plt.subplots(figsize=(max(5.0, 1.6 * len(regimes) + 2), 4.0))
    paper_labelled = False
    for j, (architecture, split) in enumerate(bars):
        xs, means, errors, paper = _accuracy_bars(groups, regimes, architecture, split, j, width)
        if not xs:
            continue
        ax.bar(
            xs,
            means,
            width,
            yerr=errors,
            capsize=3,
            color=COLORS[architecture],
            alpha=1.0 if split == "val" else 0.55,
            hatch="" if split == "val" else "//",
            edgecolor="white",
            label=f"{ARCHITECTURES[architecture]}, {split}",
        )
        if paper:
            ax.scatter(
                [x for x, _ in paper],
                [y for _, y in paper],
                marker="_",
                s=160,
                color="black",
                zorder=3,
                label=None if paper_labelled else "paper (Table 2)",
            )
            paper_labelled = True
    ax.axhline(100 * CHANCE, color="grey", linestyle=":", linewidth=1, label="chance")
    ax.set_xticks(range(len(regimes)), regimes, fontsize=8, rotation=20 if len(regimes) > 3 else 0)
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(0, 100)
    ax.set_title("PGM accuracy, val (in distribution) and test (out of distribution)", fontsize=10)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=7, ncol=3)
    return fig


def _accuracy_bars(
    groups: dict[tuple[str, str], dict[str, Any]],
    regimes: Sequence[str],
    architecture: str,
    split: str,
    bar: int,
    width: float,
) -> tuple[list[float], list[float], list[float], list[tuple[float, float]]]:
    """Positions, means and standard deviations (%) of one model's bars on ``split``, and the paper's marks."""
    xs, means, errors, paper = [], [], [], []
    for i, regime in enumerate(regimes):
        group = groups.get((architecture, regime))
        if group is None:
            continue
        entry = group[split]["accuracy"]
        xs.append(i - 0.4 + (bar + 0.5) * width)
        means.append(100 * entry["mean"])
        errors.append(100 * (entry["std"] or 0.0))
        if group["paper"] is not None:
            paper.append((xs[-1], 100 * group["paper"][split]))
    return xs, means, errors, paper


def _anytime_figure(plt: Any, anytime: Sequence[dict[str, Any]]) -> Any:
    """Accuracy against function iterations per script, one line per regime and split (the paper's Fig. 6)."""
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, group in enumerate(anytime):
        curve, color = group["anytime"], cycle[i % len(cycle)]
        for split, style in (("test", "-"), ("val", "--")):
            ax.errorbar(
                curve["function_iterations"],
                [100 * e["mean"] for e in curve[split]],
                yerr=[100 * (e["std"] or 0.0) for e in curve[split]],
                color=color,
                linestyle=style,
                marker="o",
                markersize=4,
                capsize=3,
                label=f"{group['regime']}, {split}",
            )
    ax.axhline(100 * CHANCE, color="grey", linestyle=":", linewidth=1, label="chance")
    ax.set_xticks(sorted({k for g in anytime for k in g["anytime"]["function_iterations"]}))
    ax.set_xlabel("function iterations per script")
    ax.set_ylabel("accuracy (%)")
    ax.set_title("Anytime inference of the Neural Interpreter (paper: Fig. 6)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return fig


# ----------------------------------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Read the runs, write the summary, the tables and the plots; return the summary."""
    parser = HfArgumentParser(PlotArguments)
    (args,) = parser.parse_args_into_dataclasses(args=argv)
    try:
        groups = group_runs([load_results(path) for path in args.results])
    except ValueError as error:
        parser.error(str(error))
    summary = summarize(groups)
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / SUMMARY_JSON).write_text(json.dumps(summary, indent=2, allow_nan=False) + "\n")
    (output_dir / TABLES_MD).write_text(tables_markdown(summary))
    plots = write_plots(summary, output_dir)
    for warning in summary["warnings"]:
        print(f"warning: {warning}", file=sys.stderr)
    runs = ", ".join(
        f"{ARCHITECTURES[g['architecture']]} {g['regime']} ({g['runs']})" for g in summary["groups"]
    )
    no_anytime = (
        "" if ANYTIME_PNG in {p.name for p in plots} else f"; no {ANYTIME_PNG}: no run has an anytime curve"
    )
    print(
        f"Read {len(summary['runs'])} run(s): {runs}. Wrote {output_dir / SUMMARY_JSON}, {TABLES_MD} and "
        f"{', '.join(p.name for p in plots)}{no_anytime}"
    )
    return summary


if __name__ == "__main__":
    main()
