"""examples/visualize_routing.py and make_readme_figure.py refuse a bad argument by name (exit status 2) before they
write anything."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import _scripts
import numpy as np
import pytest
import torch
from conftest import NeuralInterpreterModelTester
from PIL import Image

import ni_hf

ROOT = Path(__file__).resolve().parents[1]
visualize_routing = _scripts.load_script(ROOT / "examples" / "visualize_routing.py", "visualize_routing")
make_readme_figure = _scripts.load_script(ROOT / "examples" / "make_readme_figure.py", "make_readme_figure")


@pytest.fixture(scope="module")
def paths(tmp_path_factory) -> dict[str, Path]:
    """A good image-classifier checkpoint, folders that are no such checkpoint, and files that are no images."""
    root = tmp_path_factory.mktemp("ckpt")
    tester = NeuralInterpreterModelTester.digits_like(task_names=["mnist", "sklearn_digits"])
    good = tester.save_image_classifier(root / "good")
    five = tester.get_config(num_labels=5, id2label={i: str(i) for i in range(5)})
    found = {"checkpoint": good, "five_classes": tester.save_image_classifier(root / "five", five)}
    for name, removed in (("no_config", "config.json"), ("no_processor", "preprocessor_config.json")):
        found[name] = shutil.copytree(good, root / name)
        (found[name] / removed).unlink()
    found["no_weights"] = shutil.copytree(good, root / "no_weights")
    (found["no_weights"] / "model.safetensors").unlink()
    found["bad_json"] = shutil.copytree(good, root / "bad_json")
    (found["bad_json"] / "config.json").write_text("{not json")
    small = NeuralInterpreterModelTester()
    torch.manual_seed(0)
    found["pgm"] = root / "pgm"
    ni_hf.NeuralInterpreterForMultipleChoice(small.get_pgm_config()).save_pretrained(found["pgm"])
    found["set"] = root / "set"
    set_config = small.get_set_regression_config(num_input_variables=5)
    ni_hf.NeuralInterpreterForSetRegression(set_config).save_pretrained(found["set"])
    found["a_file"] = root / "a_file"
    found["a_file"].write_text("x")
    found["not_an_image"] = root / "not_an_image.png"
    found["not_an_image"].write_text("hello")
    png = root / "digit.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (28, 28), dtype=np.uint8)).save(png)
    found["truncated"] = root / "truncated.png"
    found["truncated"].write_bytes(png.read_bytes()[: len(png.read_bytes()) // 2])
    found["digit"] = png
    return found


BAD_ARGUMENTS = [
    (["--batch_size", "0"], "--batch_size must be at least 1, got 0"),
    (["--num_drawn", "-1"], "--num_drawn must be at least 0, got -1"),
    (["--max_samples", "0"], "--max_samples must be at least 1, got 0"),
    (
        ["--model", "runs/no-such-model"],
        r"--model runs/no-such-model: is no folder here \(.*runs/no-such-model\)",
    ),
    (["--model", "./no-such-model"], "--model ./no-such-model: no such directory"),
    (["--model", "{no_config}"], "--model {no_config}: the folder holds no config.json"),
    (["--model", "{bad_json}"], "--model {bad_json}: {bad_json}/config.json is not valid JSON"),
    (["--model", "{no_weights}"], "--model {no_weights}: .*no file named model.safetensors"),
    (["--model", "{no_processor}"], "--model {no_processor}: the folder holds no preprocessor_config.json"),
    (["--model", "{pgm}"], "--model {pgm}: a NeuralInterpreterForMultipleChoice checkpoint"),
    (["--model", "{set}"], "--model {set}: a NeuralInterpreterForSetRegression checkpoint"),
    (["--model", "{five_classes}"], r"--dataset sklearn_digits: labels \[5, 6, 7, 8, 9\] are not classes"),
    (["--output_dir", "{a_file}"], "--output_dir {a_file}: is a file"),
    (["--disabled_functions", "1", "9"], r"--disabled_functions 9: the model has functions 0..2"),
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
    (["--images", "{digit}", "--max_samples", "2"], "--max_samples is for --dataset"),
    (["--images", "{digit}", "--split", "test"], "--split is for --dataset"),
    (
        ["--images", "{digit}", "{empty}/missing.png"],
        "--images {empty}/missing.png: cannot be read as an image",
    ),
    (
        ["--images", "{not_an_image}"],
        r"--images {not_an_image}: cannot be read as an image \(cannot identify",
    ),
    (
        ["--images", "{digit}", "{truncated}"],
        r"--images {truncated}: cannot be read as an image \(image file is truncated",
    ),
]


def case_id(case) -> str:
    return " ".join(case[0])


def filled(text: str, paths: dict[str, Path]) -> str:
    for name, path in paths.items():
        text = text.replace("{" + name + "}", str(path))
    return text


@pytest.mark.parametrize(("extra", "error"), BAD_ARGUMENTS, ids=[case_id(case) for case in BAD_ARGUMENTS])
def test_a_bad_argument_is_refused_by_name(paths, tmp_path, capsys, monkeypatch, extra, error):
    monkeypatch.chdir(tmp_path)
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # a Hub id is not looked up
    empty = tmp_path / "empty"
    empty.mkdir()
    paths = {**paths, "empty": empty}
    extra = [filled(value, paths) for value in extra]
    if "--images" in extra:
        defaults = ["--model", str(paths["checkpoint"])]
    else:
        defaults = ["--model", str(paths["checkpoint"]), "--dataset", "sklearn_digits"]
    argv = [*defaults, "--output_dir", str(tmp_path / "out"), *extra]
    with pytest.raises(SystemExit) as exit_info:
        visualize_routing.main(argv)
    message = capsys.readouterr().err + str(exit_info.value.code)
    assert exit_info.value.code == 2, message
    assert re.search(filled(error, paths), message), message
    assert not (tmp_path / "out").exists()  # refused before anything is written


def test_the_dataset_source_follows_data_dir_and_the_dataset():
    def source(*argv: str) -> str:
        return visualize_routing.dataset_source(
            visualize_routing.parse_args(["--model", "m", "--output_dir", "o", *argv])
        )

    assert source("--dataset", "sklearn_digits") == "sklearn"
    assert source("--dataset", "mnist") == "hub"
    assert source("--dataset", "mnist", "--data_dir", "d") == "local"
    assert source("--dataset", "mnist", "--dataset_source", "sklearn") == "sklearn"


README_FIGURE_REFUSALS = [
    (["--index", "360"], r"--index 360: the test split has 360 images \(0..359\)"),
    (["--model", "{pgm}"], "--model {pgm}: a NeuralInterpreterForMultipleChoice checkpoint"),
    (["--model", "{no_config}"], "--model {no_config}: the folder holds no config.json"),
    (
        ["--model", "{other_tasks}"],
        r"--model {other_tasks}: its tasks \['a', 'b'\] do not include sklearn_digits",
    ),
    (["--output_dir", "{a_file}"], "--output_dir {a_file}: is a file"),
]


@pytest.mark.parametrize(
    ("extra", "error"), README_FIGURE_REFUSALS, ids=[case_id(case) for case in README_FIGURE_REFUSALS]
)
def test_make_readme_figure_refuses_a_bad_argument_by_name(paths, tmp_path, capsys, extra, error):
    other_tasks = NeuralInterpreterModelTester.digits_like(task_names=["a", "b"])
    paths = {**paths, "other_tasks": other_tasks.save_image_classifier(tmp_path / "other_tasks")}
    argv = ["--model", str(paths["checkpoint"]), "--output_dir", str(tmp_path / "out"), *extra]
    with pytest.raises(SystemExit) as exit_info:
        make_readme_figure.main([filled(value, paths) for value in argv])
    message = capsys.readouterr().err
    assert exit_info.value.code == 2, message
    assert re.search(filled(error, paths), message), message
    assert not (tmp_path / "out").exists()
