"""Tests of examples/fuzzy_boolean_draws.py: the spread of an adaptation row over draws of the new functions."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from _scripts import load_script

from ni_hf.fuzzy_boolean import make_fuzzy_boolean_tensors

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "examples" / "fuzzy_boolean_draws.py"
POINTS, TEST_FRACTION = 640, 0.25


@pytest.fixture(scope="module")
def draws() -> ModuleType:
    return load_script(SCRIPT, "fuzzy_boolean_draws")


def fake_run(folder: Path, adapt_seed: int | None, r2: np.ndarray) -> Path:
    """A results file as run_fuzzy_boolean.py writes it, reduced to what the script reads."""
    folder.mkdir()
    arguments = {"num_pretrain_functions": 20, "num_adapt_functions": 10, "dataset_seed": 0}
    result = {
        "arguments": arguments | {"adapt_dataset_seed": adapt_seed},
        "protocol": {"points_per_function": POINTS, "test_fraction": TEST_FRACTION},
        "adaptation": {"cls_tokens": {"r2_per_function": r2.tolist(), "paper_r2_mean": 0.9202}},
    }
    (folder / "fuzzy_boolean_results.json").write_text(json.dumps(result))
    return folder


def test_variance_fit_recovers_r2_that_follows_the_variance_of_each_draws_own_test_targets(draws, tmp_path):
    # R^2 made an exact function of the variance of each run's own new functions on its own test split: the fit
    # recovers it only if the script regenerates those functions and points from the run's arguments.
    folders = []
    for seed in (None, 3, 4):
        targets = make_fuzzy_boolean_tensors(
            points_per_function=POINTS, test_fraction=TEST_FRACTION, seed=0, adapt_seed=seed
        )["adapt"]["test"][1].double()
        r2 = 1.0 + 0.05 * np.log(targets.var(dim=0, unbiased=False).numpy())
        folders.append(str(fake_run(tmp_path / f"draw{seed}", seed, r2)))
    summary = draws.main(["--results", *folders, "--simulated_draws", "50", "--variance_points", "256"])
    assert summary["fit_intercept"] == pytest.approx(1.0, abs=1e-9)
    assert summary["fit_slope_per_log_variance"] == pytest.approx(0.05, abs=1e-9)
    assert summary["fit_explained_share"] == pytest.approx(1.0, abs=1e-9)
    assert summary["fit_residual_std"] < 1e-9
    means = [d["r2_mean"] for d in summary["draws"]]
    assert summary["mean_of_draw_means"] == pytest.approx(np.mean(means))
    assert summary["std_of_draw_means"] == pytest.approx(np.std(means, ddof=1))
    assert summary["paper_in_draw_stds"] == pytest.approx((0.9202 - np.mean(means)) / np.std(means, ddof=1))
    assert 0.0 < summary["simulated_draw_means_std"] < 1.0


def test_a_run_without_the_setting_is_refused_with_the_settings_it_has(draws, tmp_path):
    folder = fake_run(tmp_path / "run", None, np.zeros(10))
    with pytest.raises(ValueError, match=r"no 'all' adaptation; it has \['cls_tokens'\]"):
        draws.main(["--results", str(folder), "--setting", "all"])
    with pytest.raises(FileNotFoundError, match="fuzzy_boolean_results.json"):
        draws.main(["--results", str(tmp_path / "missing")])
