"""Tests of examples/fuzzy_boolean_checkpoints.py: checkpoints in step order, the parameters that moved, the set norm."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest
import torch
from _scripts import load_script

from ni_hf import NeuralInterpreterConfig, NeuralInterpreterForSetRegression

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "examples" / "fuzzy_boolean_checkpoints.py"


@pytest.fixture(scope="module")
def checkpoints() -> ModuleType:
    return load_script(SCRIPT, "fuzzy_boolean_checkpoints")


def _tiny_model() -> NeuralInterpreterForSetRegression:
    config = NeuralInterpreterConfig.from_paper(
        "fuzzy_boolean", hidden_size=16, code_dim=16, attention_head_size=8, type_inference_hidden_size=16,
        task_names=["a", "b"],
    )  # fmt: skip
    torch.manual_seed(0)
    return NeuralInterpreterForSetRegression(config)


def test_reports_checkpoints_in_step_order_with_the_tensor_that_moved_and_the_set_norm(
    checkpoints: ModuleType, tmp_path: Path
) -> None:
    model = _tiny_model()
    model.save_pretrained(tmp_path / "pretrain")
    run = tmp_path / "adapt-all"
    # Saved out of order, and 16 sorts before 2 as text: the report must follow the step numbers.
    with torch.no_grad():
        model.neural_interpreter.scripts[0].locs[0].value.bias.add_(3.0)  # |change| = 3 * sqrt(16) = 12
    model.save_pretrained(run / "checkpoint-16")
    model.save_pretrained(run / "checkpoint-2")  # the same weights as at step 16: nothing moved in between
    (run / "not-a-checkpoint").mkdir()

    rows = checkpoints.main(
        ["--run_dir", str(run), "--reference", str(tmp_path / "pretrain"), "--top", "2",
         "--output_json", str(tmp_path / "rows.json")]
    )  # fmt: skip
    assert [row["step"] for row in rows] == [0, 2, 16]
    assert "moved_most" not in rows[0]
    moved = rows[1]["moved_most"][0]
    assert moved["name"] == "neural_interpreter.scripts.0.locs.0.value.bias"
    assert moved["change_norm"] == pytest.approx(12.0, rel=1e-5)
    assert moved["relative_change"] == float("inf")  # the bias starts at zero
    assert all(change["change_norm"] == 0 for change in rows[2]["moved_most"])
    probe = torch.rand(256, 5, generator=torch.Generator().manual_seed(0))
    expected = checkpoints.SetNormMonitor(probe).measure(model.eval())
    assert rows[2]["norm"] == expected["norm"]
    assert rows[2]["input_share"] == expected["input_share"]
    assert rows[0]["norm"] != rows[2]["norm"]  # the bias moved the set
    assert len(rows[0]["sigma"]) == len(model.neural_interpreter.scripts)
    assert json.loads((tmp_path / "rows.json").read_text())[1]["moved_most"][0]["name"] == moved["name"]


def test_a_folder_without_checkpoints_is_refused_with_how_to_save_them(
    checkpoints: ModuleType, tmp_path: Path
) -> None:
    with pytest.raises(FileNotFoundError, match="--save_strategy steps"):
        checkpoints.main(["--run_dir", str(tmp_path)])
