"""examples/plot_pgm.py: tables and plots of run_pgm.py results, from files written here and a real run."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from _scripts import load_script

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
RELATIONS = ("progression", "XOR", "OR", "AND", "consistent_union")


@pytest.fixture(scope="module")
def plot() -> ModuleType:
    return load_script(EXAMPLES / "plot_pgm.py", "plot_pgm")


def split_metrics(accuracy: float, by_relation: dict[str, tuple[float, int]] | None = None) -> dict[str, Any]:
    """A split's metrics as run_pgm.py writes them: NaN for a relation type no puzzle holds."""
    metrics: dict[str, Any] = {"loss": 2.0 - accuracy, "accuracy": accuracy, "num_samples": 100}
    for name in RELATIONS:
        value, count = (by_relation or {}).get(name, (accuracy, 20))
        metrics[f"accuracy_{name}"] = value if count else math.nan
        metrics[f"num_samples_{name}"] = count
    return metrics


def write_run(
    folder: Path,
    architecture: str,
    regime: str,
    val: float,
    test: float,
    anytime: list[tuple[float, float]] | None = None,
    **extra: Any,
) -> Path:
    """A pgm_results.json of run_pgm.py in ``folder``; ``anytime``: (val, test) accuracy at k = 1, 2, ..."""
    results: dict[str, Any] = {
        "train": {"train_runtime": 12.5, "epoch": 3.0, "global_step": 30},
        "val": split_metrics(val, extra.pop("val_relations", None)),
        "test": split_metrics(test, extra.pop("test_relations", None)),
        "architecture": architecture,
        "regime": regime,
        "dataset_source": "generated",
        "preset": "paper",
        "num_parameters": 1_107_987 if architecture == "neural_interpreter" else 1_074_721,
        "sizes": {"train": 1000, "val": 100, "test": 100},
        "max_triples": 4,
        "command": "python examples/run_pgm.py --preset paper",
        "environment": {"mixed_precision": "bf16"},
    }
    if anytime is not None:
        results["anytime"] = [
            {"function_iterations": k, "val_accuracy": v, "test_accuracy": t}
            for k, (v, t) in enumerate(anytime, start=1)
        ]
    results.update(extra)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pgm_results.json").write_text(json.dumps(results))  # NaN as json.dumps writes it
    return folder / "pgm_results.json"


def run_plot(plot: ModuleType, paths: list[Path], out: Path) -> dict[str, Any]:
    return plot.main(["--results", *map(str, paths), "--output_dir", str(out)])


def no_nan(text: str) -> Any:
    def refuse(name: str) -> None:
        raise AssertionError(f"{name} in the summary")

    return json.loads(text, parse_constant=refuse)


def test_seeds_of_one_setting_are_averaged_beside_the_papers_table_2(
    plot: ModuleType, tmp_path: Path
) -> None:
    paths = [
        write_run(tmp_path / "ni-0", "neural_interpreter", "attr.rels", 0.50, 0.20),
        write_run(tmp_path / "ni-1", "neural_interpreter", "neutral", 0.60, 0.55),
        write_run(tmp_path / "ni-2", "neural_interpreter", "neutral", 0.70, 0.65),
        write_run(tmp_path / "vit-0", "vit", "neutral", 0.40, 0.35),
    ]
    summary = run_plot(plot, [paths[0], tmp_path / "ni-1", *paths[2:]], tmp_path / "out")  # a folder too
    assert no_nan((tmp_path / "out" / "pgm_summary.json").read_text()) == json.loads(json.dumps(summary))
    groups = [(g["architecture"], g["regime"], g["runs"]) for g in summary["groups"]]
    # The paper's column order (neutral before the held-out triples), NI before ViT.
    assert groups == [
        ("neural_interpreter", "neutral", 2),
        ("vit", "neutral", 1),
        ("neural_interpreter", "attr.rels", 1),
    ]
    neutral = summary["groups"][0]
    assert neutral["val"]["accuracy"]["mean"] == pytest.approx(0.65)
    assert neutral["val"]["accuracy"]["std"] == pytest.approx(math.sqrt(0.005))
    assert summary["groups"][1]["val"]["accuracy"]["std"] is None  # one run: no spread
    assert neutral["paper"] == {"val": pytest.approx(0.773), "test": pytest.approx(0.770)}

    tables = (tmp_path / "out" / "pgm_tables.md").read_text()
    val_table = tables.split("## Accuracy, val")[1].split("##")[0]
    assert "| neutral | 65.0 ± 7.1 (2) | 40.0 (1) | – | 12.5% | 77.3 | 73.3 |" in val_table
    assert "| attr.rels (H.O. triples) | 50.0 (1) | – | – | 12.5% | 79.9 | 73.8 |" in val_table
    test_table = tables.split("## Accuracy, test")[1].split("##")[0]
    assert "| neutral | 60.0 ± 7.1 (2) | 35.0 (1) | – | 12.5% | 77.0 | 72.7 |" in test_table
    assert str(paths[2]) in tables and "3.00 epochs" in tables and "mixed precision bf16" in tables


def test_relation_types_count_only_the_runs_that_hold_them_and_no_nan_leaks(
    plot: ModuleType, tmp_path: Path
) -> None:
    paths = [
        write_run(
            tmp_path / "a", "vit", "neutral", 0.5, 0.5, test_relations={"XOR": (0.0, 0), "OR": (0.25, 8)}
        ),
        write_run(
            tmp_path / "b", "vit", "neutral", 0.5, 0.5, test_relations={"XOR": (0.75, 4), "OR": (0.75, 8)}
        ),
    ]
    run_plot(plot, paths, tmp_path / "out")
    summary = no_nan((tmp_path / "out" / "pgm_summary.json").read_text())
    relations = summary["groups"][0]["test"]["relations"]
    assert list(relations) == list(RELATIONS)
    assert relations["XOR"] == {"mean": 0.75, "std": None, "runs": 1, "num_samples": 4}
    assert relations["OR"]["mean"] == pytest.approx(0.5) and relations["OR"]["num_samples"] == 16
    tables = (tmp_path / "out" / "pgm_tables.md").read_text()
    test_rows = tables.split("## Accuracy by relation type, test")[1]
    assert "| model | regime | progression | XOR | OR | AND | consistent union |" in test_rows
    assert "| ViT | neutral | 50.0 ± 0.0 (2) [40] | 75.0 (1) [4] | 50.0 ± 35.4 (2) [16] |" in test_rows
    assert "nan" not in tables.lower()


def test_the_anytime_table_says_what_half_the_iterations_keep(plot: ModuleType, tmp_path: Path) -> None:
    """Section 4.3's claim (70% of the accuracy kept with half the function iterations), checked per split."""
    val = [0.2, 0.3, 0.5, 0.6, 0.7, 0.75, 0.78, 0.8]
    test = [0.15, 0.2, 0.25, 0.3, 0.4, 0.45, 0.48, 0.5]
    curve = list(zip(val, test, strict=True))
    path = write_run(tmp_path / "ni", "neural_interpreter", "neutral", 0.8, 0.5, anytime=curve)
    summary = run_plot(plot, [path], tmp_path / "out")
    anytime = summary["groups"][0]["anytime"]
    assert anytime["function_iterations"] == list(range(1, 9))
    assert (anytime["trained"], anytime["half"]) == (8, 4)
    assert anytime["val_kept"] == pytest.approx(0.75) and anytime["val_claim_holds"] is True
    assert anytime["test_kept"] == pytest.approx(0.6) and anytime["test_claim_holds"] is False
    assert anytime["test_kept_above_chance"] == pytest.approx((0.3 - 0.125) / (0.5 - 0.125))
    tables = (tmp_path / "out" / "pgm_tables.md").read_text()
    assert "| neutral | 4 | 60.0 (1) | 30.0 (1) |" in tables
    assert "| neutral | 8 | 4 | 75.0% | 60.0% | 70.4% | 46.7% | yes | no |" in tables


def test_anytime_curves_over_different_iterations_are_refused(plot: ModuleType, tmp_path: Path) -> None:
    paths = [
        write_run(
            tmp_path / "a", "neural_interpreter", "neutral", 0.5, 0.5, anytime=[(0.4, 0.4), (0.5, 0.5)]
        ),
        write_run(tmp_path / "b", "neural_interpreter", "neutral", 0.5, 0.5, anytime=[(0.5, 0.5)]),
    ]
    with pytest.raises(ValueError, match=r"b/pgm_results.json: anytime curve at function iterations \[1\]"):
        plot.summarize(plot.group_runs([plot.load_results(p) for p in paths]))


def test_the_plots_are_pngs_and_the_anytime_plot_needs_a_curve(
    plot: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from matplotlib.image import imread

    ni = write_run(
        tmp_path / "ni", "neural_interpreter", "interpolation", 0.8, 0.6, anytime=[(0.5, 0.4), (0.8, 0.6)]
    )
    vit = write_run(tmp_path / "vit", "vit", "interpolation", 0.85, 0.55)
    run_plot(plot, [ni, vit], tmp_path / "both")
    for name in ("pgm_accuracy.png", "pgm_anytime.png"):
        image = imread(tmp_path / "both" / name)
        assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 300, name
    run_plot(plot, [vit], tmp_path / "vit_only")
    assert (tmp_path / "vit_only" / "pgm_accuracy.png").is_file()
    assert not (tmp_path / "vit_only" / "pgm_anytime.png").exists()
    assert "no pgm_anytime.png: no run has an anytime curve" in capsys.readouterr().out


def bad_file(tmp_path: Path, kind: str) -> tuple[Path, str]:
    """A results path that plot_pgm.py must refuse, and what its message must say."""
    path = tmp_path / kind / "pgm_results.json"
    path.parent.mkdir()
    good = json.loads(write_run(tmp_path / f"{kind}-good", "vit", "neutral", 0.5, 0.5).read_text())
    if kind == "missing":
        return path, "no such file"
    if kind == "folder_without_results":
        return path.parent, "a folder without pgm_results.json"
    if kind == "not_json":
        path.write_text("{'val': 1")
        return path, "not JSON"
    if kind == "list":
        path.write_text("[1, 2]")
        return path, "holds a JSON list"
    if kind == "no_test":
        del good["test"]
        path.write_text(json.dumps(good))
        return path, "no 'test'"
    if kind == "unknown_architecture":
        good["architecture"] = "resnet"
        path.write_text(json.dumps(good))
        return path, "architecture 'resnet'"
    if kind == "nan_accuracy":
        good["val"]["accuracy"] = math.nan
        path.write_text(json.dumps(good))
        return path, "val accuracy is nan, not an accuracy"
    if kind == "nan_relation_with_puzzles":
        good["test"]["accuracy_OR"] = math.nan
        path.write_text(json.dumps(good))
        return path, "test accuracy_OR (of 20 puzzles) is nan"
    raise AssertionError(kind)


@pytest.mark.parametrize(
    "kind",
    ["missing", "folder_without_results", "not_json", "list", "no_test", "unknown_architecture",
     "nan_accuracy", "nan_relation_with_puzzles"],
)  # fmt: skip
def test_a_bad_results_file_is_refused_by_name(
    plot: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture, kind: str
) -> None:
    path, reason = bad_file(tmp_path, kind)
    good = write_run(tmp_path / "good", "neural_interpreter", "neutral", 0.5, 0.5)
    with pytest.raises(SystemExit) as exit_info:
        run_plot(plot, [good, path], tmp_path / "out")
    assert exit_info.value.code == 2
    message = capsys.readouterr().err
    assert str(path) in message and reason in message and "run_pgm.py" in message, message
    assert not (tmp_path / "out").exists()  # nothing written from part of the runs


def test_runs_of_one_group_must_share_their_setting_and_a_file_counts_once(
    plot: ModuleType, tmp_path: Path
) -> None:
    paper = write_run(tmp_path / "a", "vit", "neutral", 0.5, 0.5)
    quick = write_run(tmp_path / "b", "vit", "neutral", 0.5, 0.5, preset="quick")
    with pytest.raises(
        ValueError, match=r"ViT runs on neutral differ in preset: .*a/pgm_results.json \(paper\)"
    ):
        plot.group_runs([plot.load_results(paper), plot.load_results(quick)])
    with pytest.raises(ValueError, match="given twice"):
        plot.group_runs([plot.load_results(paper), plot.load_results(tmp_path / "a")])
    random = write_run(tmp_path / "c", "vit", "neutral", 0.5, 0.5, free_attributes="random")
    constant = write_run(tmp_path / "d", "vit", "neutral", 0.5, 0.5, free_attributes="constant")
    with pytest.raises(ValueError, match=r"differ in free_attributes: .*c/pgm_results.json \(random\)"):
        plot.group_runs([plot.load_results(random), plot.load_results(constant)])


def test_val_and_test_results_alike_are_flagged(
    plot: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A run whose test metrics equal its val metrics in loss and every count most likely read val twice."""
    same = write_run(tmp_path / "same", "neural_interpreter", "neutral", 0.5, 0.5)
    other = write_run(tmp_path / "other", "vit", "neutral", 0.5, 0.5, test_relations={"OR": (0.5, 19)})
    summary = run_plot(plot, [same, other], tmp_path / "out")
    assert len(summary["warnings"]) == 1 and str(same) in summary["warnings"][0]
    assert "--dataloader_persistent_workers" in capsys.readouterr().err
    assert "**Warnings**" in (tmp_path / "out" / "pgm_tables.md").read_text()


def test_a_real_quick_run_of_run_pgm_is_tabulated(tmp_path: Path) -> None:
    """run_pgm.py --preset quick (a Neural Interpreter, with its anytime curve), then plot_pgm.py on it."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf_home"), "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(EXAMPLES.parent / "src"), env.get("PYTHONPATH", "")])
    env["MPLBACKEND"] = "Agg"
    train = [sys.executable, str(EXAMPLES / "run_pgm.py"), "--preset", "quick", "--report_to", "none"]
    done = subprocess.run(
        [*train, "--output_dir", str(tmp_path / "ni")], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    plotted = subprocess.run(
        [sys.executable, str(EXAMPLES / "plot_pgm.py"), "--results", str(tmp_path / "ni"),
         "--output_dir", str(tmp_path / "out")],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert plotted.returncode == 0, plotted.stderr[-3000:]
    results = json.loads((tmp_path / "ni" / "pgm_results.json").read_text())
    summary = no_nan((tmp_path / "out" / "pgm_summary.json").read_text())
    (group,) = summary["groups"]
    assert group["architecture"] == "neural_interpreter" and group["preset"] == "quick"
    assert group["test"]["accuracy"]["mean"] == results["test"]["accuracy"]
    iterations = [row["function_iterations"] for row in results["anytime"]]
    assert group["anytime"]["function_iterations"] == iterations
    assert {p.name for p in (tmp_path / "out").iterdir()} == {
        "pgm_summary.json", "pgm_tables.md", "pgm_accuracy.png", "pgm_anytime.png"
    }  # fmt: skip
    assert "Read 1 run(s): NI neutral (1)" in plotted.stdout
