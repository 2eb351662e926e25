"""examples/visualize_routing.py refuses a bad argument by name (exit status 2) before it draws anything."""

from __future__ import annotations

import re
from pathlib import Path

import _scripts
import pytest
from conftest import NeuralInterpreterModelTester

ROOT = Path(__file__).resolve().parents[1]
visualize_routing = _scripts.load_script(ROOT / "examples" / "visualize_routing.py", "visualize_routing")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    tester = NeuralInterpreterModelTester.digits_like(task_names=["mnist", "sklearn_digits"])
    return tester.save_image_classifier(tmp_path_factory.mktemp("ckpt"))


BAD_ARGUMENTS = [
    (["--batch_size", "0"], "--batch_size must be at least 1, got 0"),
    (["--num_drawn", "-1"], "--num_drawn must be at least 0, got -1"),
    (["--max_samples", "0"], "--max_samples must be at least 1, got 0"),
    (
        ["--model", "runs/no-such-model"],
        r"--model runs/no-such-model: is no folder here \(.*runs/no-such-model\)",
    ),
    (["--model", "./no-such-model"], "--model ./no-such-model: no such directory"),
    (["--dataset", "mnist", "--data_dir", "{empty}"], r"--data_dir {empty}: No local data for task 'mnist'"),
    (
        ["--dataset", "mnist", "--dataset_source", "sklearn"],
        r"Unknown task\(s\) \['mnist'\] for source 'sklearn'",
    ),
    (
        ["--dataset", "sklearn_digits", "--dataset_source", "sklearn", "--data_dir", "{empty}"],
        "--data_dir only",
    ),
    (["--dataset", "sklearn_digits", "--split", "validation"], "Unknown split 'validation'"),
    (["--dataset", "sklearn_digits", "--task", "svhn"], "--task 'svhn' is not one of the model's tasks"),
]


def case_id(case) -> str:
    return " ".join(case[0])


@pytest.mark.parametrize(("extra", "error"), BAD_ARGUMENTS, ids=[case_id(case) for case in BAD_ARGUMENTS])
def test_a_bad_argument_is_refused_by_name(checkpoint, tmp_path, capsys, monkeypatch, extra, error):
    monkeypatch.chdir(tmp_path)
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # a Hub id is not looked up
    empty = tmp_path / "empty"
    empty.mkdir()
    extra = [value.replace("{empty}", str(empty)) for value in extra]
    argv = [
        "--model",
        str(checkpoint),
        "--dataset",
        "sklearn_digits",
        "--output_dir",
        str(tmp_path / "out"),
        *extra,
    ]
    with pytest.raises(SystemExit) as exit_info:
        visualize_routing.main(argv)
    message = capsys.readouterr().err + str(exit_info.value.code)
    assert exit_info.value.code == 2, message
    assert re.search(error.replace("{empty}", str(empty)), message), message
    assert not (tmp_path / "out" / "routing.json").exists()


def test_the_dataset_source_follows_data_dir_and_the_dataset():
    def source(*argv: str) -> str:
        return visualize_routing.dataset_source(
            visualize_routing.parse_args(["--model", "m", "--output_dir", "o", *argv])
        )

    assert source("--dataset", "sklearn_digits") == "sklearn"
    assert source("--dataset", "mnist") == "hub"
    assert source("--dataset", "mnist", "--data_dir", "d") == "local"
    assert source("--dataset", "mnist", "--dataset_source", "sklearn") == "sklearn"
