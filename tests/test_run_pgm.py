"""examples/run_pgm.py: a quick run end to end on generated puzzles (results, card, checkpoint), evaluation of the
saved model, the ViT baseline, and arguments that cannot be meant refused before any work, naming the flag."""

from __future__ import annotations

import json
from pathlib import Path

import _scripts
import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "examples" / "run_pgm.py"
run_pgm = _scripts.load_script(SCRIPT, "run_pgm")
RELATIONS = ("progression", "XOR", "OR", "AND", "consistent_union")


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pgm") / "ni"
    torch.manual_seed(0)
    run_pgm.main(["--preset", "quick", "--output_dir", str(out), "--report_to", "none"])
    return out


def test_a_quick_run_reports_val_test_per_relation_and_the_anytime_curve(quick_run):
    results = json.loads((quick_run / "pgm_results.json").read_text())
    assert results["architecture"] == "neural_interpreter" and results["regime"] == "neutral"
    assert results["sizes"] == {"train": 64, "val": 32, "test": 32}
    for split in ("val", "test"):
        metrics = results[split]
        assert metrics["num_samples"] == 32 and 0.0 <= metrics["accuracy"] <= 1.0
        # Every puzzle holds one relation (max_triples 1): the per-relation counts add up to the split.
        assert sum(metrics[f"num_samples_{name}"] for name in RELATIONS) == 32
    assert results["val"]["loss"] != results["test"]["loss"]  # each split evaluated on its own puzzles
    assert [row["function_iterations"] for row in results["anytime"]] == [1, 2]
    assert results["anytime"][-1]["test_accuracy"] == pytest.approx(results["test"]["accuracy"])
    card = (quick_run / "README.md").read_text()
    assert "## Results" in card and "Anytime inference" in card and "NI 77.3 / 77.0" in card
    assert (quick_run / "model.safetensors").is_file() and (quick_run / "panel_embedding.py").is_file()


def test_the_saved_model_evaluates_to_the_same_accuracy(quick_run, tmp_path):
    results = json.loads((quick_run / "pgm_results.json").read_text())
    again = run_pgm.main(
        ["--preset", "quick", "--do_train", "false", "--model_name_or_path", str(quick_run),
         "--output_dir", str(tmp_path / "eval"), "--report_to", "none", "--anytime", "false"]
    )  # fmt: skip
    assert again["test"]["accuracy"] == pytest.approx(results["test"]["accuracy"])
    assert again["val"]["loss"] == pytest.approx(results["val"]["loss"], rel=1e-5)


def test_the_vit_baseline_runs_on_the_same_scaffolding(tmp_path):
    results = run_pgm.main(
        ["--preset", "quick", "--architecture", "vit", "--regime", "attr.rels", "--output_dir", str(tmp_path),
         "--report_to", "none"]
    )  # fmt: skip
    assert results["architecture"] == "vit" and "anytime" not in results
    assert results["test"]["num_samples"] == 32
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "ni_multitask_vit"


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--num_train_puzzles", "0"], "--num_train_puzzles must be at least 1"),
        (["--num_eval_puzzles", "-3"], "--num_eval_puzzles must be at least 1"),
        (["--max_triples", "5"], "--max_triples must lie in 1..4"),
        (["--dataset_source", "hub", "--regime", "attr.rels"], "the Hub holds the neutral regime only"),
        (["--dataset_source", "deepmind"], "--dataset_source deepmind needs --data_dir"),
        (["--do_train", "false"], "pass --model_name_or_path"),
        (["--architecture", "vit", "--attn_implementation", "fast"], "--attn_implementation is the Neural"),
        (["--preset", "gpu"], "--preset given 2 times"),
        (["--num_train_epochs", "0"], "--num_train_epochs 0: no training step would run"),
        (["--num_train_epochs", "-1"], "--num_train_epochs -1: no training step would run"),
        (["--config_overrides", "patch_size=4"], "--config_overrides patch_size: a PGM model reads panels"),
        (["--save_strategy", "steps", "--save_steps", "0"], "--save_steps must be a positive number"),
        (["--load_best_model_at_end", "true"], "no evaluation would pick a best model"),
        (["--regime", "everything"], "invalid choice"),
        (["--per_device_train_batch_size", "0"], "--per_device_train_batch_size must be at least 1"),
        (
            ["--dataloader_num_workers", "1", "--dataloader_persistent_workers", "true"],
            "evaluate the val puzzles",
        ),
    ],
)
def test_arguments_that_cannot_be_meant_are_refused_by_name_before_any_work(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        run_pgm.main(["--preset", "quick", "--output_dir", str(tmp_path / "out"), *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # nothing written


def test_a_digits_checkpoint_is_refused_as_a_pgm_model(tmp_path, tester):
    from ni_hf import NeuralInterpreterForImageClassification

    NeuralInterpreterForImageClassification(tester.get_config()).save_pretrained(tmp_path / "digits")
    with pytest.raises(
        ValueError, match="NeuralInterpreterForMultipleChoice scores each candidate .* got True, 5"
    ):
        run_pgm.main(
            ["--preset", "quick", "--do_train", "false", "--model_name_or_path", str(tmp_path / "digits"),
             "--output_dir", str(tmp_path / "out"), "--report_to", "none"]
        )  # fmt: skip
