"""Weights that do not fit the model, or differ from the SHA-256 recorded when they were saved, are refused where a
user gives them (run_digits.py, visualize_routing.py, the demo), naming the file and the counts or both hashes;
--allow_mismatched_weights loads weights that do not fit anyway. Resume points and the run lock are in
tests/test_resume.py and tests/test_run_digits.py."""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
from pathlib import Path

import _scripts
import pytest
import torch
from _digits_runs import tiny_args, write_tiny_digits
from conftest import NeuralInterpreterModelTester

import ni_hf
from ni_hf.training.checkpoints import (
    CHECKSUM_NAME,
    last_complete_checkpoint,
    load_checked,
    resolve_resume_checkpoint,
    verify_weights_checksum,
    write_weights_checksum,
)

ROOT = Path(__file__).resolve().parents[1]
run_digits = _scripts.load_script(ROOT / "examples" / "run_digits.py", "run_digits")
visualize_routing = _scripts.load_script(ROOT / "examples" / "visualize_routing.py", "visualize_routing")
demo_app = _scripts.load_script(ROOT / "demo" / "app.py", "ni_demo_app")

TESTER = NeuralInterpreterModelTester.digits_like()


def save_ni(path: Path, **overrides) -> Path:
    return TESTER.save_image_classifier(path, TESTER.get_config(**overrides))


def tiny_vit() -> ni_hf.MultiTaskViTForImageClassification:
    return ni_hf.MultiTaskViTForImageClassification(TESTER.get_vit_config())


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """A good Neural Interpreter checkpoint and four that do not fit one, by name."""
    root = tmp_path_factory.mktemp("checkpoints")
    good = save_ni(root / "good")
    vit = root / "vit"
    tiny_vit().save_pretrained(vit)
    TESTER.get_image_processor(TESTER.get_vit_config()).save_pretrained(vit)
    other = shutil.copytree(good, root / "other_config")  # the weights of a wider model under this config
    shutil.copy(save_ni(root / "wide", hidden_size=24) / "model.safetensors", other / "model.safetensors")
    truncated = shutil.copytree(good, root / "truncated")
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:200])
    pickled = shutil.copytree(good, root / "bin_of_another_model")
    (pickled / "model.safetensors").unlink()
    torch.save(tiny_vit().state_dict(), pickled / "pytorch_model.bin")
    return {"good": good, "vit": vit, "other_config": other, "truncated": truncated, "bin": pickled}


REFUSALS = {
    "vit": r"its config.json describes a 'ni_multitask_vit' model; NeuralInterpreterForImageClassification reads",
    "other_config": r"other_config/model.safetensors does not fit .*: \d+ have another shape \(.*in the file",
    "truncated": r"truncated/model.safetensors is not a readable safetensors file",
    "bin": r"bin_of_another_model/pytorch_model.bin does not fit .*: \d+ of the model's \d+ tensors are missing from "
    r"it .*; \d+ of its tensors are not the model's \(vit\.",
}


@pytest.mark.parametrize("name", list(REFUSALS))
def test_the_demo_refuses_weights_that_do_not_fit(checkpoints, name):
    with pytest.raises(ValueError, match=REFUSALS[name]):
        demo_app.InterpreterDemo(str(checkpoints[name]))


@pytest.mark.parametrize("name", list(REFUSALS))
def test_visualize_routing_refuses_weights_that_do_not_fit(checkpoints, name, tmp_path, capsys):
    argv = ["--model", str(checkpoints[name]), "--dataset", "sklearn_digits", "--output_dir", str(tmp_path)]
    with pytest.raises(SystemExit) as exit_info:
        visualize_routing.main(argv)
    assert exit_info.value.code == 2
    stderr = capsys.readouterr().err
    assert "--model" in stderr
    assert re.search(REFUSALS[name], stderr), stderr
    assert not (tmp_path / "routing.json").exists()


@pytest.fixture
def no_data_loading(monkeypatch):
    """Loading data is an error: the weights must be refused before it."""

    def refuse(*args, **kwargs):
        raise AssertionError("the datasets were loaded")

    monkeypatch.setattr(run_digits, "load_digits_tasks", refuse)


def evaluate_args(path: Path, output_dir: Path, *extra: str) -> list[str]:
    return [
        "--model_name_or_path", str(path), "--do_train", "false", "--output_dir", str(output_dir),
        "--dataset_source", "sklearn", "--use_cpu", "true", "--report_to", "none", *extra,
    ]  # fmt: skip


def refused_by_run_digits(argv: list[str], pattern: str, capsys) -> str:
    """run_digits.main(argv) refuses, with a ValueError or (in its argument checks) argparse's exit status 2 and the
    message on stderr; the message, which must match ``pattern``."""
    try:
        run_digits.main(argv)
    except ValueError as error:
        message = str(error)
    except SystemExit as exit_info:
        assert exit_info.code == 2
        message = capsys.readouterr().err
    else:
        pytest.fail("run_digits.py did not refuse")
    assert re.search(pattern, message), message
    return message


@pytest.mark.parametrize("name", ["other_config", "truncated", "bin"])
def test_run_digits_refuses_weights_that_do_not_fit_before_loading_data(
    checkpoints, name, no_data_loading, tmp_path, capsys
):
    pattern = REFUSALS[name].replace("NeuralInterpreterForImageClassification", ".*")
    refused_by_run_digits(evaluate_args(checkpoints[name], tmp_path / "eval"), pattern, capsys)


def test_run_digits_refuses_a_vit_config_with_a_neural_interpreters_weights(
    checkpoints, no_data_loading, tmp_path
):
    mixed = shutil.copytree(checkpoints["vit"], tmp_path / "mixed")
    shutil.copy(checkpoints["good"] / "model.safetensors", mixed / "model.safetensors")
    with pytest.raises(
        ValueError, match=r"mixed/model.safetensors does not fit MultiTaskViTForImageClassification"
    ):
        run_digits.main(evaluate_args(mixed, tmp_path / "eval"))


def test_allow_mismatched_weights_loads_them_with_a_warning(checkpoints, no_data_loading, tmp_path, caplog):
    with pytest.raises(AssertionError, match="the datasets were loaded"):  # got past the weights
        run_digits.main(
            evaluate_args(checkpoints["other_config"], tmp_path / "eval", "--allow_mismatched_weights")
        )
    assert any("--allow_mismatched_weights: the missing and mismatched" in m for m in caplog.messages)
    demo = demo_app.InterpreterDemo(str(checkpoints["bin"]), allow_mismatched_weights=True)
    assert demo.model.config.hidden_size == TESTER.settings["hidden_size"]


def test_a_fitting_checkpoint_loads_with_its_trained_weights(checkpoints):
    model = load_checked(ni_hf.NeuralInterpreterForImageClassification, str(checkpoints["good"]))
    torch.manual_seed(0)
    expected = ni_hf.NeuralInterpreterForImageClassification(TESTER.get_config())
    for name, tensor in expected.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name


def test_resume_points_are_complete_checkpoints(tmp_path):
    for step, state in ((2, '{"global_step": 2}'), (4, '{"global_step": 4}'), (6, '{"global_st'), (8, None)):
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        if state is not None:
            (folder / "trainer_state.json").write_text(state)
    assert last_complete_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-4")  # 6 truncated, 8 without
    assert resolve_resume_checkpoint("last", str(tmp_path)) == str(tmp_path / "checkpoint-4")
    assert resolve_resume_checkpoint(None, str(tmp_path)) is None
    assert resolve_resume_checkpoint(str(tmp_path / "checkpoint-2"), "unused") == str(
        tmp_path / "checkpoint-2"
    )
    with pytest.raises(ValueError, match="checkpoint-8: no trainer_state.json, so not a finished checkpoint"):
        resolve_resume_checkpoint(str(tmp_path / "checkpoint-8"), "unused")
    with pytest.raises(ValueError, match="no such folder"):
        resolve_resume_checkpoint(str(tmp_path / "checkpoint-9"), "unused")


# ------------------------------------------------------------------------------------------- the weights' checksum


def flip_data_bytes(weights: Path, count: int = 64) -> None:
    """Invert ``count`` bytes spread over the tensor data of a safetensors file (its header stays readable)."""
    data = bytearray(weights.read_bytes())
    start = 8 + int.from_bytes(
        data[:8], "little"
    )  # an 8-byte header length, the JSON header, then the tensors
    for i in range(count):
        data[start + i * (len(data) - start) // count] ^= 0xFF
    weights.write_bytes(bytes(data))


def hashes_in(message: str) -> list[str]:
    return re.findall(r"\b[0-9a-f]{64}\b", message)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A tiny run of run_digits.py: 4 steps, a checkpoint every 2, the final model (each with its checksum)."""
    root = tmp_path_factory.mktemp("trained")
    run_digits.main(tiny_args(root / "run", write_tiny_digits(root / "data"), "--report_to", "none"))
    return root / "run"


def test_a_run_records_the_sha256_of_its_weights_and_of_each_checkpoints(trained):
    for folder in (trained, trained / "checkpoint-2", trained / "checkpoint-4"):
        record = json.loads((folder / CHECKSUM_NAME).read_text())
        assert record["algorithm"] == "sha256" and list(record["files"]) == ["model.safetensors"]
        assert (
            record["files"]["model.safetensors"]
            == hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()
        )
    assert not list(trained.glob(f"_{CHECKSUM_NAME}*"))  # no temporary file left


def test_run_digits_refuses_weights_whose_bytes_changed_before_loading_data(
    trained, no_data_loading, tmp_path, capsys
):
    """64 flipped bytes in the tensor data: safetensors still reads the file, the checksum does not match."""
    changed = shutil.copytree(trained, tmp_path / "changed", ignore=shutil.ignore_patterns("checkpoint-*"))
    expected = json.loads((changed / CHECKSUM_NAME).read_text())["files"]["model.safetensors"]
    flip_data_bytes(changed / "model.safetensors")
    found = hashlib.sha256((changed / "model.safetensors").read_bytes()).hexdigest()
    pattern = r"--model_name_or_path .*changed/model.safetensors has SHA-256"
    message = refused_by_run_digits(evaluate_args(changed, tmp_path / "eval"), pattern, capsys)
    assert hashes_in(message) == [found, expected]
    assert not (tmp_path / "eval" / "eval_results.json").exists()
    with pytest.raises(
        ValueError, match=f"--model .*has SHA-256 {found}, but .*{CHECKSUM_NAME} records {expected}"
    ):
        demo_app.InterpreterDemo(str(changed))
    argv = ["--model", str(changed), "--dataset", "sklearn_digits", "--output_dir", str(tmp_path / "routing")]
    with pytest.raises(SystemExit) as exit_info:
        visualize_routing.main(argv)
    assert exit_info.value.code == 2


def test_resuming_from_a_checkpoint_whose_weights_changed_is_refused(trained, tmp_path):
    run = shutil.copytree(trained, tmp_path / "run")
    flip_data_bytes(run / "checkpoint-4" / "model.safetensors")
    with pytest.raises(
        ValueError, match=r"--resume_from_checkpoint .*checkpoint-4/model.safetensors has SHA-256"
    ):
        resolve_resume_checkpoint("last", str(run))
    assert resolve_resume_checkpoint(str(run / "checkpoint-2"), str(run)) == str(run / "checkpoint-2")


def test_a_folder_without_a_checksum_loads_as_before_saying_so(checkpoints, caplog):
    assert not (checkpoints["good"] / CHECKSUM_NAME).exists()  # save_pretrained alone writes none
    with caplog.at_level(logging.INFO, logger="ni_hf.training.checkpoints"):
        load_checked(ni_hf.NeuralInterpreterForImageClassification, str(checkpoints["good"]))
    assert f"no {CHECKSUM_NAME}, so its weights are loaded without a checksum check" in caplog.text


def test_the_checksum_file_itself_is_checked(checkpoints, tmp_path):
    folder = shutil.copytree(checkpoints["good"], tmp_path / "ckpt")
    digests = write_weights_checksum(folder)
    assert verify_weights_checksum(folder) is True
    (folder / CHECKSUM_NAME).write_text('{"algorithm": "md5", "files": {}}')
    with pytest.raises(ValueError, match="records 'md5' hashes; expected 'sha256'"):
        verify_weights_checksum(folder)
    (folder / CHECKSUM_NAME).write_text("{not json")
    with pytest.raises(ValueError, match=f"{CHECKSUM_NAME} is not a readable checksum file"):
        verify_weights_checksum(folder)
    record = {"algorithm": "sha256", "files": {**digests, "model-00002-of-00002.safetensors": "0" * 64}}
    (folder / CHECKSUM_NAME).write_text(json.dumps(record))
    with pytest.raises(
        ValueError, match="records model-00002-of-00002.safetensors, which is not in the folder"
    ):
        verify_weights_checksum(folder)
    with pytest.raises(ValueError, match="no weights file"):
        write_weights_checksum(tmp_path)


def test_the_checksum_mixin_writes_beside_weights_and_warns_without_them(tmp_path, caplog):
    from types import SimpleNamespace

    from safetensors.torch import save_file

    from ni_hf.training.checkpoints import WeightsChecksumMixin

    class Saver:
        args = SimpleNamespace(should_save=True, output_dir=str(tmp_path))

        def save_model(self, output_dir=None, _internal_call=False):
            self.saved = output_dir

    class ChecksumSaver(WeightsChecksumMixin, Saver):
        pass

    ChecksumSaver().save_model()  # a sharded FSDP or DeepSpeed save writes no weights file of these names
    assert not (tmp_path / CHECKSUM_NAME).exists() and f"so no {CHECKSUM_NAME}" in caplog.text
    (tmp_path / "checkpoint-3").mkdir()
    save_file({"w": torch.ones(2)}, tmp_path / "checkpoint-3" / "model.safetensors")
    ChecksumSaver().save_model(str(tmp_path / "checkpoint-3"), _internal_call=True)
    assert verify_weights_checksum(tmp_path / "checkpoint-3") is True
