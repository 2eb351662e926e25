"""The generated PGM candidates say nothing without the context: context-blind rules find the answer at chance.

The quick version of ``benchmarks/pgm_context_blind.py`` (whose 1,000-puzzle numbers per regime, with the
candidates-only CNN, are in ``docs/pgm/context_blind.md``): ``PUZZLES`` test-split puzzles of every regime at
``max_triples=4``, plus neutral at ``max_triples=1`` and with ``free_attributes="random"``, at 32 px. Chance is
12.5%. Each heuristic must stay in ``POOLED_BOUNDS`` over all of them (3.5 standard deviations of chance) and under
``SETTING_BOUND`` in each setting. The generator whose distractors were built from the answer's objects (commit
25627e9) fails both by far, measured with this very function on the same puzzle indices: pooled, its
object-overlap medoid found the answer in 34.2% of them (44.3% in its worst setting), the L1 pixel medoid in
32.6%, the L2 one in 24.2%, the closest-to-median candidate in 32.6%, and the candidate farthest from the last
context panel in 6.8%.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from ni_hf.data.pgm_generator import REGIMES, Line, Panel, PuzzleStructure, Shape, audit, puzzle_structure

REPO = Path(__file__).resolve().parents[1]
PUZZLES = 120
PANEL_SIZE = 32
SETTINGS = [(regime, 4, "constant") for regime in REGIMES] + [
    ("neutral", 1, "constant"),
    ("neutral", 4, "random"),
]
POOLED_BOUNDS = (0.09, 0.165)
SETTING_BOUND = 0.3


def context_blind_accuracies(
    make_structure, settings=SETTINGS, puzzles=PUZZLES
) -> dict[tuple, dict[str, float]]:
    """Every heuristic's accuracy per setting, ``make_structure(regime, index, max_triples, free_attributes)``."""
    accuracies = {}
    for regime, max_triples, free in settings:
        structures = [make_structure(regime, i, max_triples, free) for i in range(puzzles)]
        accuracies[regime, max_triples, free] = audit.heuristic_accuracies(
            structures, audit.render_structures(structures, PANEL_SIZE)
        )
    return accuracies


@functools.cache
def _measured() -> dict[tuple, dict[str, float]]:
    return context_blind_accuracies(
        lambda regime, i, max_triples, free: puzzle_structure(
            regime, "test", i, 0, max_triples, free_attributes=free
        )
    )


@pytest.mark.parametrize("heuristic", list(audit.HEURISTICS))
def test_no_context_blind_heuristic_finds_the_answer(heuristic):
    per_setting = {setting: accuracies[heuristic] for setting, accuracies in _measured().items()}
    pooled = float(np.mean(list(per_setting.values())))
    low, high = POOLED_BOUNDS
    assert low <= pooled <= high, (heuristic, pooled, per_setting)
    assert max(per_setting.values()) <= SETTING_BOUND, (heuristic, per_setting)


def test_the_bounds_hold_chance_and_refuse_a_shortcut():
    """Chance sits 3 standard deviations or more inside the pooled bounds; the old medoid's 34.2% far outside."""
    low, high = POOLED_BOUNDS
    spread = (0.125 * 0.875 / (PUZZLES * len(SETTINGS))) ** 0.5
    assert (0.125 - low) / spread > 3 and (high - 0.125) / spread > 3.5
    assert high < 0.342 / 2 and SETTING_BOUND < 0.443


# --- The heuristics themselves ----------------------------------------------------------------------------------


def _puzzle(candidates: list[Panel], target: int) -> tuple[PuzzleStructure, np.ndarray]:
    structure = PuzzleStructure((("shape", "color", "XOR"),), (Panel(),) * 8, tuple(candidates), target)
    return structure, audit.render_structures([structure], 24)[0]


def test_each_heuristic_finds_what_it_names():
    # Candidate 3 holds shapes A and B; four others hold A and a shape of their own, three B and one of their own:
    # 3 shares an object with each, and sits in the middle of them in pixels.
    a, b = Shape(0, 1, 5, 9), Shape(8, 1, 5, 9)
    own = [Shape(cell, 1, 5, 9) for cell in (1, 2, 3, 5, 6, 7, 4)]
    candidates = [Panel((a, own[k])) for k in range(4)] + [Panel((own[k], b)) for k in range(4, 7)]
    candidates.insert(3, Panel((a, b)))
    structure, panels = _puzzle(candidates, 3)
    for name in ("object_medoid", "pixel_medoid_l1", "pixel_medoid_l2", "closest_to_median"):
        assert audit.credit(audit.HEURISTICS[name](structure, panels), 3) == 1.0, name
    # Candidate 3 alone is light grey: the rarest values, and the nearest to an empty last context panel.
    candidates = [Panel((Shape(4, 0, 5, 1 if k == 3 else 9),)) for k in range(8)]
    structure, panels = _puzzle(candidates, 3)
    expected = {"rarest_values": 1.0, "most_frequent_values": 0.0}
    expected |= {"nearest_to_last_context": 1.0, "farthest_from_last_context": 0.0}
    for name, credit in expected.items():
        assert audit.credit(audit.HEURISTICS[name](structure, panels), 3) == credit, name


def test_ties_share_the_credit_and_the_band_is_chances():
    assert audit.credit(np.zeros(8), 5) == pytest.approx(1 / 8)
    assert audit.credit(np.array([1, 1, 0, 0, 0, 0, 0, 0.0]), 1) == 0.5
    assert audit.credit(np.array([1, 1, 0, 0, 0, 0, 0, 0.0]), 2) == 0.0
    low, high = audit.chance_band(1000)
    assert round(low, 3) == 0.105 and round(high, 3) == 0.145


def test_bad_inputs_are_refused_by_name():
    structure, panels = _puzzle(
        [Panel(lines=(Line(t, 9),)) for t in range(6)] + [Panel(), Panel((Shape(0, 0, 0, 0),))], 0
    )
    with pytest.raises(ValueError, match=r"unknown heuristics \['medoid'\]"):
        audit.heuristic_accuracies([structure], [panels], ["medoid"])
    with pytest.raises(ValueError, match="as many panel arrays as structures"):
        audit.heuristic_accuracies([structure], [])
    with pytest.raises(ValueError, match=r"train_panels must be \(N, 8, H, W\)"):
        audit.train_candidates_only(np.zeros((4, 7, 16, 16), np.uint8), np.zeros(4))


def test_the_candidates_only_cnn_learns_a_shortcut_when_there_is_one():
    """The CNN of the benchmark is no straw man: it finds the one dark candidate among light ones."""
    pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    panels = rng.integers(150, 256, size=(600, 8, 16, 16), dtype=np.uint8)
    targets = rng.integers(0, 8, size=600)
    panels[np.arange(600), targets, 4:12, 4:12] = 40
    model = audit.train_candidates_only(panels[:400], targets[:400], epochs=3, channels=8)
    assert audit.candidates_only_accuracy(model, panels[400:], targets[400:]) > 0.9


# --- The benchmark script ---------------------------------------------------------------------------------------


def _benchmark():
    spec = importlib.util.spec_from_file_location(
        "ni_pgm_context_blind", REPO / "benchmarks" / "pgm_context_blind.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_benchmark_reports_every_heuristic_and_the_cnn(tmp_path, capsys):
    pytest.importorskip("torch")
    out = tmp_path / "report.json"
    argv = [
        "--regimes",
        "neutral",
        "attrs.pairs",
        "--max-triples",
        "4",
        "1",
        "--num-test",
        "6",
        "--num-train",
        "8",
    ]
    report = _benchmark().main(
        [*argv, "--epochs", "1", "--panel-size", "16", "--quiet", "--output-json", str(out)]
    )
    settings = [(row["regime"], row["max_triples"]) for row in report["rows"]]
    assert settings == [("neutral", 4), ("attrs.pairs", 4), ("neutral", 1)]  # attrs.pairs needs >= 2 triples
    for row in report["rows"]:
        assert set(audit.HEURISTICS) | {"cnn_val", "cnn_test"} <= set(row)
        assert all(0.0 <= row[name] <= 1.0 for name in audit.HEURISTICS)
    printed = capsys.readouterr().out
    assert "| attrs.pairs | 1-4 | constant |" in printed and "95% band on 6 puzzles" in printed


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--max-triples", "5"], "expected 1-4 triples a puzzle, got 5"),
        (["--regimes", "attrs.pairs", "--max-triples", "1"], "have puzzles of at least 2 triples"),
        (["--free-attributes", "fixed"], "invalid choice: 'fixed'"),
        (["--num-test", "0"], "--num-test: expected an integer >= 1, got 0"),
    ],
)
def test_the_benchmark_refuses_a_bad_argument_by_name(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        _benchmark().main(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
