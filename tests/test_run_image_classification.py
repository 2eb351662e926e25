"""examples/run_image_classification.py: a user's own images (class folders, Parquet files, several datasets as
tasks) train end to end with their class names; a saved model is fine-tuned on new labels with fresh heads, or
evaluated; what cannot be meant is refused before any work, naming the flag."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import _scripts
import numpy as np
import pytest
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "examples" / "run_image_classification.py"
FASHION_MNIST = REPO.parent / "shared" / "data" / "fashion_mnist"
run_ic = _scripts.load_script(SCRIPT, "run_image_classification")
TINY = (
    "hidden_size=16,code_dim=8,num_functions=3,attention_head_size=8,type_inference_hidden_size=12,type_dim=6"
)


def write_class_folders(
    root: Path, classes: list[str], per_class: int, size: tuple[int, int], seed: int
) -> Path:
    """``root/<class>/<i>.png``: images whose brightness tells the class apart."""
    rng = np.random.default_rng(seed)
    for c, name in enumerate(classes):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.random((size[1], size[0], 3)) * 60 + c * 190 / max(len(classes) - 1, 1)
            Image.fromarray(pixels.astype("uint8")).save(root / name / f"{i}.png")
    return root


def write_parquet(path: Path, classes: list[str], rows: int, seed: int) -> Path:
    """A Parquet file with an Image and a ClassLabel column, as ``Dataset.to_parquet`` writes it."""
    from datasets import ClassLabel, Dataset, Features
    from datasets import Image as ImageFeature

    rng = np.random.default_rng(seed)
    labels = [i % len(classes) for i in range(rows)]
    images = [
        Image.fromarray((rng.random((12, 12)) * 40 + 200 * label).astype("uint8"), "L") for label in labels
    ]
    features = Features({"image": ImageFeature(), "label": ClassLabel(names=classes)})
    Dataset.from_dict({"image": images, "label": labels}, features=features).to_parquet(path)
    return path


def tiny_args(output_dir: Path, *data: str, epochs: str = "2") -> list[str]:
    return [
        *data, "--output_dir", str(output_dir), "--image_size", "16", "--patch_size", "4",
        "--config_overrides", TINY, "--num_train_epochs", epochs, "--per_device_train_batch_size", "8",
        "--randaugment", "false", "--save_strategy", "no", "--eval_strategy", "no", "--report_to", "none",
        "--use_cpu", "true", "--learning_rate", "3e-3",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("own_images")
    write_class_folders(root / "train", ["cats", "dogs", "owls"], 10, (20, 24), seed=0)
    write_class_folders(root / "val", ["cats", "dogs", "owls"], 4, (20, 24), seed=1)
    return root


@pytest.fixture(scope="module")
def trained(folders, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "pets"
    with _scripts.one_thread():
        run_ic.main(
            tiny_args(out, "--train_dir", str(folders / "train"), "--validation_dir", str(folders / "val"))
        )
    return out


def test_class_folders_train_with_their_names_in_the_config_and_the_card(trained):
    config = json.loads((trained / "config.json").read_text())
    assert config["id2label"] == {"0": "cats", "1": "dogs", "2": "owls"} and len(config["id2label"]) == 3
    assert (config["image_size"], config["patch_size"]) == (16, 4)
    results = json.loads((trained / "all_results.json").read_text())
    assert results["eval_num_samples"] == 12 and 0 <= results["eval_accuracy"] <= 1
    card = (trained / "README.md").read_text()
    assert (
        "cats, dogs, owls" in card and "run_image_classification.py" in card and "Validation accuracy" in card
    )
    assert (trained / "routing_path.png").is_file() and (trained / "weights_sha256.json").is_file()


def test_the_trained_folder_serves_a_pipeline_with_the_class_names(trained, folders):
    from transformers import pipeline

    classify = pipeline("image-classification", model=str(trained), trust_remote_code=True)
    scores = classify(Image.open(next((folders / "val" / "dogs").glob("*.png"))))
    assert {score["label"] for score in scores} <= {"cats", "dogs", "owls"}
    assert sum(score["score"] for score in scores) == pytest.approx(1.0, abs=1e-4)


def test_two_datasets_are_two_tasks_each_with_its_own_labels(folders, tmp_path):
    parquet = write_parquet(tmp_path / "letters.parquet", ["a", "b"], rows=24, seed=2)
    args = tiny_args(
        tmp_path / "two", "--train_dir", str(folders / "train"), "--dataset_name", str(parquet),
        "--task_names", "letters", "pets", "--train_val_split", "0.25",
    )  # fmt: skip
    with _scripts.one_thread():
        results = run_ic.main(args)
    config = json.loads((tmp_path / "two" / "config.json").read_text())
    # --dataset_name values come first, then --train_dir values; each head has the larger task's 3 outputs.
    assert config["task_names"] == ["letters", "pets"] and len(config["id2label"]) == 3
    assert results["eval_num_samples_letters"] == 6 and results["eval_num_samples_pets"] > 0


def test_a_saved_model_fine_tunes_on_new_labels_with_fresh_heads(trained, tmp_path, caplog):
    new = write_class_folders(tmp_path / "birds", ["crow", "gull", "jay", "tit"], 6, (16, 16), seed=3)
    args = tiny_args(tmp_path / "tuned", "--train_dir", str(new), "--model_name_or_path", str(trained))
    args = [arg for arg in args if arg not in ("--image_size", "16", "--patch_size", "4")]
    drop = args.index("--config_overrides")
    del args[drop : drop + 2]
    with _scripts.one_thread(), caplog.at_level(logging.WARNING):
        run_ic.main(args)
    assert any("fresh CLS tokens and heads (4 labels)" in record.getMessage() for record in caplog.records)
    config = json.loads((tmp_path / "tuned" / "config.json").read_text())
    assert (
        len(config["id2label"]) == 4
        and config["id2label"]["3"] == "tit"
        and config["task_names"] == ["birds"]
    )


def test_do_train_false_evaluates_a_saved_model(trained, folders, tmp_path):
    args = [
        "--train_dir", str(folders / "train"), "--validation_dir", str(folders / "val"), "--model_name_or_path",
        str(trained), "--do_train", "false", "--output_dir", str(tmp_path / "eval"), "--report_to", "none",
        "--use_cpu", "true",
    ]  # fmt: skip
    with _scripts.one_thread():
        again = run_ic.main(args)
    first = json.loads((trained / "all_results.json").read_text())
    assert again["eval_accuracy"] == pytest.approx(first["eval_accuracy"])


@pytest.mark.parametrize(
    ("extra", "error"),
    [
        ([], "No data: pass --dataset_name"),
        (["--train_dir", "a", "b", "--validation_dir", "c"], "--validation_dir: one per --train_dir"),
        (["--train_dir", "a", "--num_channels", "2"], "--num_channels 2: expected 1"),
        (["--train_dir", "a", "--image_size", "0"], "--image_size must be at least 1"),
        (["--train_dir", "a", "--train_val_split", "1.0"], r"--train_val_split 1.0: must lie in \[0, 1\)"),
        (["--train_dir", "a", "--config_overrides", "image_size=64"], "pass --image_size instead"),
        (["--train_dir", "a", "--config_overrides", "panel_size=16"], "no panel CNN to read it"),
        (["--train_dir", "a", "--randaugment", "false", "--randaugment_num_ops", "3"], "--randaugment false"),
        (["--train_dir", "a", "--num_train_epochs", "0"], "no training step would run"),
        (["--train_dir", "a", "--task_names", "x", "y"], "--task_names: one per dataset"),
        (["--train_dir", "a", "--do_train", "false"], "needs --model_name_or_path"),
        (["--train_dir", "a", "--preset", "small", "--preset", "small"], "--preset given 2 times"),
    ],
)
def test_what_cannot_be_meant_is_refused_before_any_work(tmp_path, extra, error):
    with _scripts.refused(error):
        run_ic.main(["--output_dir", str(tmp_path / "out"), "--report_to", "none", *extra])
    assert not (tmp_path / "out").exists()


def test_settings_of_a_new_model_are_refused_with_a_saved_one(trained, tmp_path):
    with _scripts.refused("--image_size with --model_name_or_path"):
        run_ic.main(["--train_dir", "a", "--model_name_or_path", str(trained), "--image_size", "32",
                     "--output_dir", str(tmp_path / "out")])  # fmt: skip


@pytest.mark.skipif(
    not FASHION_MNIST.is_dir(), reason="needs ../shared/data/fashion_mnist (development machines)"
)
def test_fashion_mnist_trains_with_its_named_classes(tmp_path):
    args = tiny_args(tmp_path / "fmnist", "--dataset_name", str(FASHION_MNIST), epochs="1")
    args += ["--max_train_samples", "64", "--max_eval_samples", "32"]
    with _scripts.one_thread():
        results = run_ic.main(args)
    config = json.loads((tmp_path / "fmnist" / "config.json").read_text())
    assert len(config["id2label"]) == 10 and "Sneaker" in config["id2label"].values()
    assert results["eval_num_samples"] == 32
