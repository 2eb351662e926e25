"""examples/run_pgm.py: a quick run end to end on generated puzzles (results, card, checkpoint), evaluation of the
saved model, the ViT baseline, and arguments that cannot be meant refused before any work, naming the flag."""

from __future__ import annotations

import json
from pathlib import Path

import _scripts
import numpy as np
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
        (["--skip_bad_files", "true"], "--skip_bad_files: they apply to files"),
        (["--dataset_source", "hub", "--free_attributes", "random"], "--free_attributes: the generator's"),
        (["--free_attributes", "sometimes"], "invalid choice"),
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
    with pytest.raises(ValueError, match="is a checkpoint of NeuralInterpreterForImageClassification"):
        run_pgm.main(
            ["--preset", "quick", "--do_train", "false", "--model_name_or_path", str(tmp_path / "digits"),
             "--output_dir", str(tmp_path / "out"), "--report_to", "none"]
        )  # fmt: skip


# ------------------------------------------------------------------------------ DeepMind's and the Hub's files

TINY_PAPER = (
    "hidden_size=16,code_dim=8,num_functions=3,num_attention_heads=2,attention_head_size=4,"
    "type_inference_hidden_size=12,type_dim=6,num_function_iterations=2,panel_size=16,panel_cnn_layers=2,"
    "panel_cnn_channels=4"
)


def source_args(tmp_path: Path, preset: str, *source: str) -> list[str]:
    """A short run of ``preset`` on files: one epoch of 2-puzzle batches (the paper preset's model made tiny)."""
    size = ["--config_overrides", TINY_PAPER] if preset == "paper" else []
    return [
        "--preset", preset, *source, *size, "--output_dir", str(tmp_path / "out"), "--report_to", "none",
        "--num_train_epochs", "1", "--per_device_train_batch_size", "2", "--per_device_eval_batch_size", "4",
        "--eval_strategy", "no", "--save_strategy", "no", "--anytime", "false",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def deepmind_files(tmp_path_factory) -> dict[str, Path]:
    import _pgm_files

    root = tmp_path_factory.mktemp("deepmind")
    folder = _pgm_files.write_deepmind_folder(
        root, {"train": range(6), "val": range(6, 10), "test": range(10, 14)}
    )
    archive = _pgm_files.write_deepmind_archive(root / "neutral.tar.gz", folder)
    hub = _pgm_files.write_hub_parquet(
        tmp_path_factory.mktemp("hub"),
        {"train": [range(6)], "validation": [range(6, 10)], "test": [range(10, 14)]},
    )
    return {"folder": folder, "archive": archive, "hub": hub}


@pytest.mark.parametrize("preset", ["paper", "cpu"])
@pytest.mark.parametrize("source", ["archive", "hub"])
def test_deepmind_archives_and_hub_parquet_train_end_to_end(deepmind_files, tmp_path, preset, source):
    """Trainer counts its steps from the sources' lengths, and the card's picture takes their first puzzles."""
    data = [
        "--dataset_source",
        "deepmind" if source == "archive" else "hub",
        "--data_dir",
        str(deepmind_files[source]),
    ]
    with _scripts.one_thread():
        results = run_pgm.main(source_args(tmp_path, preset, *data))
    assert results["sizes"] == {"train": 6, "val": 4, "test": 4}
    assert results["train"]["global_step"] == 3 and results["skipped_files"] == {
        "train": 0,
        "val": 0,
        "test": 0,
    }
    assert results["test"]["num_samples"] == 4 and results["test_other_context"]["num_samples"] == 4
    assert (tmp_path / "out" / "README.md").is_file() and (tmp_path / "out" / "routing_path.png").is_file()


def test_a_bad_training_file_is_refused_before_training_or_skipped_and_counted(deepmind_files, tmp_path):
    import shutil

    import _pgm_files

    folder = tmp_path / "neutral"
    shutil.copytree(deepmind_files["folder"], folder)
    bad = _pgm_files.write_bad_npz(folder / "PGM_neutral_train_99.npz", "target 9")
    data = ["--dataset_source", "deepmind", "--data_dir", str(folder)]
    with pytest.raises(ValueError, match=f"{bad.name}.*'target' is 9"):
        run_pgm.main(source_args(tmp_path, "cpu", *data))
    assert not (tmp_path / "out" / "model.safetensors").exists()  # refused before any training
    with _scripts.one_thread():
        results = run_pgm.main(source_args(tmp_path, "cpu", *data, "--skip_bad_files", "true"))
    assert results["skipped_files"]["train"] == 1 and results["sizes"]["train"] == 6
    assert bad.name in (tmp_path / "out" / "pgm_skipped.tsv").read_text()


def test_the_context_of_another_puzzle_keeps_each_puzzles_candidates():
    puzzles = [{"panels": np.full((16, 2, 2), i), "target": i} for i in range(3)]
    shuffled = run_pgm.with_other_context(puzzles)
    assert [int(p["panels"][0, 0, 0]) for p in shuffled] == [1, 2, 0]  # the next puzzle's context
    assert [int(p["panels"][8, 0, 0]) for p in shuffled] == [0, 1, 2]  # its own candidates
    assert [p["target"] for p in shuffled] == [0, 1, 2]


def test_the_context_blind_baseline_trains_on_the_same_scaffolding(tmp_path):
    """The panel CNN and scorer seeing the candidates only: no anytime curve, no routing picture; its other-context
    accuracy equals its own (it never reads the context)."""
    with _scripts.one_thread():
        results = run_pgm.main(
            ["--preset", "quick", "--architecture", "candidates_only", "--output_dir", str(tmp_path), "--report_to",
             "none"]
        )  # fmt: skip
    assert results["architecture"] == "candidates_only" and "anytime" not in results
    assert results["test_other_context"]["accuracy"] == pytest.approx(results["test"]["accuracy"])
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "ni_context_blind"
    assert not (tmp_path / "routing_path.png").exists()
