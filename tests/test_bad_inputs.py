"""Bad inputs to the configs, the image processor and the digits loader: each gives a clear error naming what was
expected. One table; each row builds its input under a temporary folder."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import PIL.Image
import pytest
from datasets import ClassLabel, Dataset, Features, Image

from ni_hf.data.digits import DIGIT_CLASS_NAMES, load_digits_tasks
from ni_hf.models.multitask_vit.configuration_multitask_vit import MultiTaskViTConfig
from ni_hf.models.neural_interpreter.configuration_neural_interpreter import NeuralInterpreterConfig
from ni_hf.models.neural_interpreter.image_processing_neural_interpreter import (
    NeuralInterpreterImageProcessor,
)

RGB = np.zeros((32, 32, 3), np.uint8)


def parquet_split(
    root: Path, task: str, split: str, labels: list[int], images: list[Any] | None = None
) -> None:
    """Write <root>/<task>/<split>.parquet with 8x8 gray images (or the given image values)."""
    images = [np.zeros((8, 8), np.uint8) for _ in labels] if images is None else images
    features = Features({"image": Image(), "label": ClassLabel(names=DIGIT_CLASS_NAMES)})
    (root / task).mkdir(parents=True, exist_ok=True)
    Dataset.from_dict({"image": images, "label": labels}, features=features).to_parquet(
        str(root / task / f"{split}.parquet")
    )


def digits_data(root: Path, train: list[int] | None = None, test: list[int] | None = None) -> Path:
    parquet_split(root, "mnist", "train", [1, 2, 3] if train is None else train)
    parquet_split(root, "mnist", "test", [4, 5] if test is None else test)
    return root


def image_folder(root: Path, folders: dict[str, dict[str, int]]) -> Path:
    """<root>/kmnist/<split>/<folder>/ with `count` 8x8 PNGs each."""
    for split, counts in folders.items():
        for folder, count in counts.items():
            path = root / "kmnist" / split / folder
            path.mkdir(parents=True)
            for k in range(count):
                PIL.Image.fromarray(np.zeros((8, 8), np.uint8)).save(path / f"{k}.png")
    return root


def all_images_bad(root: Path) -> Path:
    parquet_split(root, "mnist", "train", [1, 2], images=[{"bytes": b"junk", "path": None}] * 2)
    parquet_split(root, "mnist", "test", [3])
    return root


def high_depth(values: np.ndarray) -> PIL.Image.Image:
    return PIL.Image.fromarray(values)


CASES: dict[str, tuple[Callable[[Path], Any], type[Exception], str]] = {
    # configs
    "config misspelt keyword": (
        lambda _: NeuralInterpreterConfig(hiden_size=32),
        TypeError,
        r"unknown setting.*'hiden_size' \(did you mean 'hidden_size'\?\)",
    ),
    "vit config misspelt keyword": (
        lambda _: MultiTaskViTConfig(num_hiden_layers=2),
        TypeError,
        r"'num_hiden_layers' \(did you mean 'num_hidden_layers'\?\)",
    ),
    "kernel_eps 0": (
        lambda _: NeuralInterpreterConfig(kernel_eps=0),
        ValueError,
        r"`kernel_eps` must be > 0, got 0",
    ),
    "attention_eps 0": (
        lambda _: NeuralInterpreterConfig(attention_eps=0.0),
        ValueError,
        r"`attention_eps` must be > 0, got 0.0",
    ),
    "num_labels 0": (
        lambda _: NeuralInterpreterConfig(num_labels=0),
        ValueError,
        r"`num_labels` must be a positive integer.*got 0",
    ),
    "num_labels -3": (
        lambda _: NeuralInterpreterConfig(num_labels=-3),
        ValueError,
        r"`num_labels` must be a positive integer.*got -3",
    ),
    "vit num_labels 0": (
        lambda _: MultiTaskViTConfig(num_labels=0),
        ValueError,
        r"`num_labels` must be a positive integer.*got 0",
    ),
    # the image processor
    "0x0 PIL image": (
        lambda _: NeuralInterpreterImageProcessor()(PIL.Image.new("RGB", (0, 0))),
        ValueError,
        r"empty image of shape \(0, 0\): expected a height and a width of at least 1",
    ),
    "0x5 array": (
        lambda _: NeuralInterpreterImageProcessor()(np.zeros((0, 5, 3), np.uint8)),
        ValueError,
        r"empty image of shape \(0, 5, 3\)",
    ),
    "image_std 0 at construction": (
        lambda _: NeuralInterpreterImageProcessor(image_std=0.0),
        ValueError,
        r"`image_std` must be non-zero",
    ),
    "image_std with a 0 at call time": (
        lambda _: NeuralInterpreterImageProcessor()(RGB, image_std=[0.5, 0.0, 0.5]),
        ValueError,
        r"`image_std` must be non-zero.*\(0.5, 0.0, 0.5\)",
    ),
    "32-bit image with negative values": (
        lambda _: NeuralInterpreterImageProcessor()(high_depth(np.full((8, 8), -5, np.int32))),
        ValueError,
        r"mode 'I' has values in \[-5.0, -5.0\]: expected values from 0",
    ),
    "float image with NaN": (
        lambda _: NeuralInterpreterImageProcessor()(high_depth(np.full((8, 8), np.nan, np.float32))),
        ValueError,
        r"mode 'F' contains NaN or infinite values",
    ),
    # empty splits
    "max_train_samples 0": (
        lambda root: load_digits_tasks(["mnist"], data_dir=digits_data(root), max_train_samples=0),
        ValueError,
        r"max_train_samples \(rows per task of the train split\) must be a positive integer.*got 0",
    ),
    "max_eval_samples 0": (
        lambda root: load_digits_tasks(["mnist"], data_dir=digits_data(root), max_eval_samples=0),
        ValueError,
        r"max_eval_samples \(rows per task of the test split\) must be a positive integer.*got 0",
    ),
    "max_eval_samples 0, sklearn": (
        lambda _: load_digits_tasks(["sklearn"], source="sklearn", max_eval_samples=0),
        ValueError,
        r"max_eval_samples .*got 0: the test split would be empty",
    ),
    "max_train_samples 1.5": (
        lambda _: load_digits_tasks(["sklearn"], source="sklearn", max_train_samples=1.5),
        ValueError,
        r"max_train_samples .*got 1.5",
    ),
    "empty Parquet test split": (
        lambda root: load_digits_tasks(["mnist"], data_dir=digits_data(root, test=[])),
        ValueError,
        r"The test split of task 'mnist' has no usable rows \(.*test.parquet\)",
    ),
    "empty image folders": (
        lambda root: load_digits_tasks(
            ["kmnist"], data_dir=image_folder(root, {"train": {"1": 0}, "test": {"1": 1}})
        ),
        ValueError,
        r"The train split of task 'kmnist' has no usable rows",
    ),
    "every image bad, skipped": (
        lambda root: load_digits_tasks(["mnist"], data_dir=all_images_bad(root), skip_bad_images=True),
        ValueError,
        r"The train split of task 'mnist' has no usable rows",
    ),
    # image folders and undecodable files
    "class folder not a digit": (
        lambda root: load_digits_tasks(
            ["kmnist"], data_dir=image_folder(root, {"train": {"1": 1, "seven": 1}})
        ),
        ValueError,
        r"must be named by their digit label, 0..9.*kmnist/train/seven",
    ),
    "undecodable image": (
        lambda root: load_digits_tasks(["mnist"], data_dir=all_images_bad(root)),
        ValueError,
        r"(?s)2 of the 2 images of the train split of task 'mnist'.*train.parquet \(row 1\): not an image",
    ),
}


@pytest.fixture(autouse=True)
def hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets.config

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_datasets")


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_gives_a_clear_error(case: str, tmp_path: Path) -> None:
    build, error, message = CASES[case]
    with pytest.raises(error, match=message):
        build(tmp_path / "data")
