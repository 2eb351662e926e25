"""Tests for the multi-task digits loaders (sklearn and local sources; Hub specs only, no network)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import numpy as np
import pytest
from datasets import ClassLabel, Dataset, Features, Image
from PIL import Image as PILImage

from ni_hf.data.digits import (
    DIGIT_CLASS_NAMES,
    HUB_DATASETS,
    LOCAL_FOLDER_NAMES,
    PAPER_TASKS,
    SKLEARN_TASK,
    DigitsTransform,
    HubDatasetSpec,
    canonical_task_name,
    known_task_names,
    load_digits_tasks,
    load_task_split,
    resolve_dataset_source,
)

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def _write_parquet(
    path: Path,
    labels: list[int],
    size: int,
    mode: str,
    image_column: str = "image",
    label_column: str = "label",
    label_names: list[str] | None = None,
) -> None:
    """Write a tiny Hub-layout Parquet file whose pixel (0, 0) encodes the row index."""
    channels = 3 if mode == "RGB" else 1
    images = []
    for i in range(len(labels)):
        array = np.zeros((size, size, channels) if channels == 3 else (size, size), dtype=np.uint8)
        array[0, 0] = i
        images.append(array)
    features = Features(
        {image_column: Image(), label_column: ClassLabel(names=label_names or DIGIT_CLASS_NAMES)}
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    Dataset.from_dict({image_column: images, label_column: labels}, features=features).to_parquet(str(path))


def _pixel_ids(ds: Dataset) -> list[int]:
    """Return the row index encoded in pixel (0, 0) of every image."""
    ids = []
    for image in ds["image"]:
        value = np.asarray(image)[0, 0]
        ids.append(int(np.atleast_1d(value)[0]))
    return ids


@pytest.fixture
def local_tree(tmp_path: Path) -> Path:
    """A tiny data_dir with mnist (28x28 L) and mnist_m (32x32 RGB) in the Hub Parquet layout."""
    root = tmp_path / "data"
    _write_parquet(root / "mnist" / "train.parquet", [i % 10 for i in range(20)], 28, "L")
    _write_parquet(root / "mnist" / "test.parquet", [(3 * i) % 10 for i in range(10)], 28, "L")
    _write_parquet(root / "mnist_m" / "train.parquet", [(i + 5) % 10 for i in range(15)], 32, "RGB")
    _write_parquet(root / "mnist_m" / "test.parquet", [(7 * i) % 10 for i in range(8)], 32, "RGB")
    return root


# --------------------------------------------------------------------------- specs and names


def test_hub_specs_well_formed() -> None:
    """Every Hub spec names a repo, its columns and train/test splits."""
    assert set(PAPER_TASKS) <= set(HUB_DATASETS)
    assert {"kmnist", "fashion_mnist"} <= set(HUB_DATASETS)
    for task, spec in HUB_DATASETS.items():
        assert isinstance(spec, HubDatasetSpec)
        repo_id, config, image_column, label_column, splits, data_files = spec
        owner, _, name = repo_id.partition("/")
        assert owner and name and "/" not in name, task
        assert config is None or (isinstance(config, str) and config), task
        assert image_column == "image" and label_column == "label", task
        assert set(splits) == {"train", "test"} and all(isinstance(s, str) for s in splits.values()), task
        if data_files is not None:
            assert set(data_files) <= set(splits), task
            assert all(pattern.endswith(".parquet") for pattern in data_files.values()), task
    assert HUB_DATASETS["mnist"].repo_id == "ylecun/mnist"
    assert HUB_DATASETS["svhn"][:2] == ("ufldl-stanford/svhn", "cropped_digits")


def test_task_names_and_errors() -> None:
    """Aliases canonicalise; unknown tasks and sources fail before any download."""
    assert canonical_task_name("mnist_m") == canonical_task_name("MNIST-M") == "mnistm"
    assert canonical_task_name("Fashion-MNIST") == "fashion_mnist"
    assert known_task_names("sklearn") == [SKLEARN_TASK]
    assert set(known_task_names("local")) == set(LOCAL_FOLDER_NAMES)
    with pytest.raises(ValueError, match="Unknown task.*known tasks.*mnist"):
        load_digits_tasks(["mnist", "cifar10"])
    with pytest.raises(ValueError, match="Unknown task"):
        load_digits_tasks(["mnist"], source="sklearn")
    with pytest.raises(ValueError, match="Unknown digits data source"):
        load_digits_tasks(["mnist"], source="ftp")
    with pytest.raises(ValueError, match="Duplicate"):
        load_digits_tasks(["mnistm", "mnist_m"], source="local", data_dir="/nonexistent")
    with pytest.raises(ValueError, match="needs --data_dir"):
        load_digits_tasks(["mnist"], source="local")
    with pytest.raises(ValueError, match="Unknown split"):
        load_task_split(SKLEARN_TASK, "validation", source="sklearn")


# --------------------------------------------------------------------------- sklearn


def test_sklearn_source_shapes_and_split() -> None:
    """sklearn digits: 1797 images split 1437/360, 8x8 uint8 images, labels 0..9, stratified."""
    dd, names = load_digits_tasks(["sklearn_digits"], source="sklearn")
    assert names == [SKLEARN_TASK]
    assert set(dd) == {"train", "test"}
    assert (dd["train"].num_rows, dd["test"].num_rows) == (1437, 360)
    assert dd["train"].column_names == ["image", "label", "task_id"]
    assert isinstance(dd["train"].features["image"], Image)
    assert dd["train"].features["label"].names == DIGIT_CLASS_NAMES
    assert dd["train"].features["task_id"].names == [SKLEARN_TASK]
    image = dd["train"][0]["image"]
    assert image.size == (8, 8) and image.mode == "L"
    pixels = np.stack([np.asarray(im) for im in dd["test"]["image"]])
    assert pixels.dtype == np.uint8 and pixels.max() == 255 and pixels.min() == 0
    for split in ("train", "test"):
        labels = np.asarray(dd[split]["label"])
        assert labels.min() == 0 and labels.max() == 9
        assert set(np.asarray(dd[split]["task_id"]).tolist()) == {0}
    test_counts = np.bincount(np.asarray(dd["test"]["label"]), minlength=10)
    assert test_counts.min() >= 35 and test_counts.max() <= 37  # stratified: ~36 per class


def test_sklearn_determinism_and_seed() -> None:
    """Same seed gives the same data; another seed reshuffles train but keeps the test set."""
    a, _ = load_digits_tasks(["digits"], source="sklearn", seed=1)
    b, _ = load_digits_tasks(["sklearn"], source="sklearn", seed=1)
    c, _ = load_digits_tasks([SKLEARN_TASK], source="sklearn", seed=2)
    assert a["train"]["label"][:] == b["train"]["label"][:]
    assert np.array_equal(np.asarray(a["train"][5]["image"]), np.asarray(b["train"][5]["image"]))
    assert a["test"]["label"][:] == c["test"]["label"][:]
    assert a["train"]["label"][:] != c["train"]["label"][:]
    assert sorted(a["train"]["label"][:]) == sorted(c["train"]["label"][:])


def test_sklearn_max_samples() -> None:
    """max_*_samples cap each task's rows, deterministically."""
    dd, _ = load_digits_tasks(["sklearn_digits"], source="sklearn", max_train_samples=50, max_eval_samples=20)
    assert (dd["train"].num_rows, dd["test"].num_rows) == (50, 20)
    again, _ = load_digits_tasks(
        ["sklearn_digits"], source="sklearn", max_train_samples=50, max_eval_samples=20
    )
    assert dd["test"]["label"][:] == again["test"]["label"][:]
    big, _ = load_digits_tasks(["sklearn_digits"], source="sklearn", max_train_samples=10**6)
    assert big["train"].num_rows == 1437


# --------------------------------------------------------------------------- local


def test_local_source(local_tree: Path) -> None:
    """Local Parquet tree: task ids, per-task counts, stable test order, shuffled train."""
    dd, names = load_digits_tasks(["mnist", "mnist_m"], source="local", data_dir=str(local_tree), seed=3)
    assert names == ["mnist", "mnistm"]
    assert (dd["train"].num_rows, dd["test"].num_rows) == (35, 18)
    assert dd["test"].features["task_id"].names == names
    test_tasks = np.asarray(dd["test"]["task_id"])
    assert test_tasks.tolist() == [0] * 10 + [1] * 8
    assert dd["test"]["label"][:] == [(3 * i) % 10 for i in range(10)] + [(7 * i) % 10 for i in range(8)]
    assert _pixel_ids(dd["test"]) == list(range(10)) + list(range(8))
    train_tasks = np.asarray(dd["train"]["task_id"])
    assert np.bincount(train_tasks).tolist() == [20, 15]
    assert train_tasks.tolist() != sorted(train_tasks.tolist())  # shuffled across tasks
    for row in dd["train"]:
        expected_size = (28, 28) if row["task_id"] == 0 else (32, 32)
        assert row["image"].size == expected_size
        assert row["image"].mode == ("L" if row["task_id"] == 0 else "RGB")
    # Label follows its image through the shuffle.
    for row in dd["train"].select(range(10)):
        i = int(np.atleast_1d(np.asarray(row["image"])[0, 0])[0])
        assert row["label"] == (i % 10 if row["task_id"] == 0 else (i + 5) % 10)
    again, _ = load_digits_tasks(["mnist", "mnistm"], source="local", data_dir=local_tree, seed=3)
    assert again["train"]["label"][:] == dd["train"]["label"][:]
    assert again["train"]["task_id"][:] == dd["train"]["task_id"][:]


def test_local_max_samples_per_task(local_tree: Path) -> None:
    """max_*_samples apply per task; the test subset keeps the original order."""
    dd, _ = load_digits_tasks(
        ["mnistm", "mnist"], source="local", data_dir=local_tree, max_train_samples=6, max_eval_samples=4
    )
    assert np.bincount(np.asarray(dd["train"]["task_id"])).tolist() == [6, 6]
    assert np.asarray(dd["test"]["task_id"]).tolist() == [0] * 4 + [1] * 4
    ids = _pixel_ids(dd["test"])
    assert ids[:4] == sorted(ids[:4]) and ids[4:] == sorted(ids[4:])
    assert len(set(ids[:4])) == 4


def test_local_missing_folder_and_split(local_tree: Path) -> None:
    """Missing task folders and splits say which path and layout were expected."""
    with pytest.raises(FileNotFoundError, match=r"svhn.*train\.parquet"):
        load_digits_tasks(["svhn"], source="local", data_dir=local_tree)
    with pytest.raises(FileNotFoundError, match="not a known task"):
        load_digits_tasks(["usps"], source="local", data_dir=local_tree)
    (local_tree / "mnist" / "test.parquet").unlink()
    with pytest.raises(FileNotFoundError, match=r"No test split.*test\.parquet"):
        load_digits_tasks(["mnist"], source="local", data_dir=local_tree)


def test_local_column_variants_and_labels(tmp_path: Path) -> None:
    """Other column names are normalised; SVHN-style label 10 becomes 0; bad labels fail."""
    root = tmp_path / "data"
    _write_parquet(
        root / "svhn" / "train.parquet",
        [10, 1, 2, 10],
        32,
        "RGB",
        "img",
        "labels",
        [str(i) for i in range(11)],
    )
    _write_parquet(
        root / "svhn" / "test.parquet", [3, 10], 32, "RGB", "img", "labels", [str(i) for i in range(11)]
    )
    dd, names = load_digits_tasks(["svhn"], source="local", data_dir=root)
    assert names == ["svhn"]
    assert dd["test"].column_names == ["image", "label", "task_id"]
    assert dd["test"]["label"][:] == [3, 0]
    assert sorted(dd["train"]["label"][:]) == [0, 0, 1, 2]
    _write_parquet(root / "bad" / "train.parquet", [0, 10], 8, "L", label_names=[str(i) for i in range(11)])
    _write_parquet(root / "bad" / "test.parquet", [0], 8, "L")
    with pytest.raises(ValueError, match="expected 0..9"):
        load_digits_tasks(["bad"], source="local", data_dir=root)


def test_local_image_folders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Image folders <task>/<split>/<label>/*.png load, with folder names read as digits."""
    import datasets.config

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_datasets")
    root = tmp_path / "data"
    for split, digits in (("train", (3, 7)), ("test", (7,))):
        for digit in digits:
            folder = root / "kmnist" / split / str(digit)
            folder.mkdir(parents=True)
            for k in range(2):
                PILImage.fromarray(np.full((28, 28), 10 * digit + k, dtype=np.uint8)).save(
                    folder / f"{k}.png"
                )
    dd, names = load_digits_tasks(["kmnist"], source="local", data_dir=root)
    assert names == ["kmnist"]
    assert sorted(dd["train"]["label"][:]) == [3, 3, 7, 7]
    assert dd["test"]["label"][:] == [7, 7]
    assert dd["train"][0]["image"].size == (28, 28)


def test_shared_data_if_present() -> None:
    """The real MNIST / MNIST-M copies under <repo>/../shared/data load (skipped when absent)."""
    if not ((SHARED_DATA / "mnist" / "train.parquet").is_file() and (SHARED_DATA / "mnist_m").is_dir()):
        pytest.skip(f"no shared digit data at {SHARED_DATA}")
    start = time.perf_counter()
    dd, names = load_digits_tasks(
        ["mnist", "mnist_m"], source="local", data_dir=SHARED_DATA, max_train_samples=32, max_eval_samples=16
    )
    elapsed = time.perf_counter() - start
    assert names == ["mnist", "mnistm"]
    assert (dd["train"].num_rows, dd["test"].num_rows) == (64, 32)
    sizes = {(row["task_id"], row["image"].size, row["image"].mode) for row in dd["test"]}
    assert sizes == {(0, (28, 28), "L"), (1, (32, 32), "RGB")}
    labels = np.asarray(dd["train"]["label"])
    assert labels.min() >= 0 and labels.max() <= 9
    assert elapsed < 30, f"loading took {elapsed:.1f} s"


def test_hub_loading_path_with_fake_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hub source (no network): right repo/config/split per task, SVHN per-split files, column cleanup."""
    import ni_hf.data.digits as digits_data

    calls = []

    def fake_load_dataset(path: str, name: str | None = None, *, split: str, data_files=None) -> Dataset:
        """Stand in for datasets.load_dataset with a 3-row dataset carrying an extra column."""
        calls.append((path, name, split, data_files))
        features = Features({"image": Image(), "label": ClassLabel(names=DIGIT_CLASS_NAMES)})
        images = [np.zeros((4, 4), dtype=np.uint8)] * 3
        ds = Dataset.from_dict({"image": images, "label": [1, 2, 3]}, features=features)
        return ds.add_column("extra", ["a", "b", "c"])

    monkeypatch.setattr(digits_data, "load_dataset", fake_load_dataset)
    dd, names = load_digits_tasks(["mnist", "svhn"], max_train_samples=2)
    assert names == ["mnist", "svhn"]
    assert dd["train"].column_names == ["image", "label", "task_id"]
    assert (dd["train"].num_rows, dd["test"].num_rows) == (4, 6)
    svhn = HUB_DATASETS["svhn"]
    assert calls == [
        ("ylecun/mnist", "mnist", "train", None),
        ("ylecun/mnist", "mnist", "test", None),
        ("ufldl-stanford/svhn", None, "train", {"train": svhn.data_files["train"]}),
        ("ufldl-stanford/svhn", None, "test", {"test": svhn.data_files["test"]}),
    ]

    def no_files_then_config(path: str, name: str | None = None, *, split: str, data_files=None) -> Dataset:
        """Fail like the Hub does when data_files match nothing, then defer to the fake."""
        if data_files is not None:
            raise FileNotFoundError("no files")
        return fake_load_dataset(path, name, split=split)

    calls.clear()
    monkeypatch.setattr(digits_data, "load_dataset", no_files_then_config)
    load_task_split("svhn", "test")
    assert calls == [("ufldl-stanford/svhn", "cropped_digits", "test", None)]


def test_data_dir_alone_means_local_data_in_the_library_too(tmp_path) -> None:
    # A local lookup that names the missing task folder, not a download from the Hub.
    with pytest.raises(FileNotFoundError, match="No local data for task 'mnist'"):
        load_digits_tasks(["mnist"], data_dir=str(tmp_path))
    with pytest.raises(ValueError, match="empty string"):
        resolve_dataset_source("", None)


# -------------------------------------------------------------------------------------------------- bad data


def _image_folders(root: Path, layout: dict[str, dict[str, int]], size: int = 28) -> Path:
    """Write <root>/kmnist/<split>/<folder>/<k>.png, `count` images per folder, pixel value = 10 * folder index."""
    for split, folders in layout.items():
        for position, (folder, count) in enumerate(sorted(folders.items())):
            path = root / "kmnist" / split / folder
            path.mkdir(parents=True)
            for k in range(count):
                PILImage.fromarray(np.full((size, size), 10 * position + k, dtype=np.uint8)).save(
                    path / f"{k}.png"
                )
    return root


@pytest.fixture
def hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets.config

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_datasets")


@pytest.mark.parametrize("name", ["seven", "07x", "10", "-1"])
def test_image_folders_not_named_by_a_digit_are_refused_naming_them(
    tmp_path: Path, hf_cache, name: str
) -> None:
    """`train/seven` next to `train/8` would shift 8 -> 7 and 9 -> 8 silently: the folder is named instead."""
    root = _image_folders(tmp_path / "data", {"train": {"3": 1, name: 1, "8": 1}, "test": {"3": 1}})
    bad = str(root / "kmnist" / "train" / name)
    with pytest.raises(ValueError, match=rf"named by their digit label.*{re.escape(repr(bad))}"):
        load_digits_tasks(["kmnist"], source="local", data_dir=root)


def test_image_folder_labels_are_the_digits_their_names_spell_in_every_split(
    tmp_path: Path, hf_cache
) -> None:
    """Splits with different sets of class folders give each folder the same label."""
    layout = {"train": {"0": 2, "4": 2, "8": 2, "9": 2}, "test": {"8": 2, "9": 1}}
    dd, _ = load_digits_tasks(["kmnist"], source="local", data_dir=_image_folders(tmp_path / "data", layout))
    assert sorted(dd["train"]["label"][:]) == [0, 0, 4, 4, 8, 8, 9, 9]
    assert sorted(dd["test"]["label"][:]) == [8, 8, 9]
    # Pixel 10 * (folder position) + k follows the label: folder "8" is the first of the test split.
    for row in dd["test"]:
        position = int(np.asarray(row["image"])[0, 0]) // 10
        assert row["label"] == {0: 8, 1: 9}[position]


def _truncated_png(path: Path) -> None:
    noise = np.random.default_rng(0).integers(0, 256, size=(64, 64), dtype=np.uint8)
    PILImage.fromarray(noise).save(path)
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * 0.7)])


def test_bad_images_in_image_folders_are_named_or_skipped(
    tmp_path: Path, hf_cache, caplog: pytest.LogCaptureFixture
) -> None:
    root = _image_folders(tmp_path / "data", {"train": {"1": 3, "2": 3}, "test": {"1": 2}})
    garbage = root / "kmnist" / "train" / "1" / "garbage.png"
    garbage.write_bytes(b"not an image at all")
    truncated = root / "kmnist" / "train" / "2" / "truncated.png"
    _truncated_png(truncated)
    with pytest.raises(ValueError, match=r"2 of the 8 images of the train split of task 'kmnist'") as caught:
        load_digits_tasks(["kmnist"], source="local", data_dir=root)
    assert str(garbage) in str(caught.value) and str(truncated) in str(caught.value)
    assert "skip_bad_images=True" in str(caught.value) and "--skip_bad_images" in str(caught.value)
    with caplog.at_level("WARNING", logger="ni_hf.data.images"):
        dd, _ = load_digits_tasks(["kmnist"], source="local", data_dir=root, skip_bad_images=True)
    assert dd["train"].num_rows == 6 and sorted(dd["train"]["label"][:]) == [1, 1, 1, 2, 2, 2]
    assert "Skipped 2 of the 8 images" in caplog.text and str(truncated) in caplog.text
    for row in dd["train"]:  # every kept image decodes
        assert row["image"].size == (28, 28)


def test_bad_images_in_parquet_files_are_named_by_file_and_row(tmp_path: Path, caplog) -> None:
    import pyarrow.parquet as pq

    root = tmp_path / "data"
    _write_parquet(root / "mnist" / "train.parquet", [i % 10 for i in range(6)], 28, "L")
    _write_parquet(root / "mnist" / "test.parquet", [1, 2], 28, "L")
    path = root / "mnist" / "train.parquet"
    table = pq.read_table(path)
    images = table.column("image").to_pylist()
    images[4] = {"bytes": images[4]["bytes"][:40], "path": None}
    pq.write_table(table.set_column(0, "image", pa_array(images, table.schema.field("image").type)), path)
    with pytest.raises(
        ValueError, match=rf"(?s)1 of the 6 images.*{re.escape(str(path))} \(row 4\): not an image"
    ):
        load_digits_tasks(["mnist"], source="local", data_dir=root)
    with caplog.at_level("WARNING", logger="ni_hf.data.images"):
        dd, _ = load_digits_tasks(["mnist"], source="local", data_dir=root, skip_bad_images=True, seed=1)
    assert sorted(dd["train"]["label"][:]) == [0, 1, 2, 3, 5]
    assert f"{path} (row 4)" in caplog.text


def test_bad_image_rows_are_named_by_their_file_row_after_sampling(tmp_path: Path, caplog) -> None:
    """Odd rows are bad: of 10 rows sampled from 20, the kept ones are the even rows, the named ones the odd."""
    import pyarrow.parquet as pq

    root = tmp_path / "data"
    _write_parquet(root / "mnist" / "train.parquet", [i % 10 for i in range(20)], 28, "L")
    _write_parquet(root / "mnist" / "test.parquet", [1], 28, "L")
    path = root / "mnist" / "train.parquet"
    table = pq.read_table(path)
    images = [
        image if row % 2 == 0 else {"bytes": b"junk", "path": None}
        for row, image in enumerate(table.column("image").to_pylist())
    ]
    pq.write_table(table.set_column(0, "image", pa_array(images, table.schema.field("image").type)), path)
    with caplog.at_level("WARNING", logger="ni_hf.data.images"):
        dd, _ = load_digits_tasks(
            ["mnist"], source="local", data_dir=root, max_train_samples=10, skip_bad_images=True
        )
    named = [int(row) for row in re.findall(r"\(row (\d+)\)", caplog.text)]
    kept = _pixel_ids(dd["train"])
    assert named and all(row % 2 == 1 for row in named) and all(row % 2 == 0 for row in kept)
    assert len(named) + len(kept) == 10 and len(set(named) | set(kept)) == 10


def pa_array(values: list, type_) -> object:
    import pyarrow as pa

    return pa.array(values, type=type_)


def test_the_transform_gives_the_models_task_ids_and_draws_no_random_numbers():
    import torch

    from ni_hf import NeuralInterpreterImageProcessor

    processor = NeuralInterpreterImageProcessor()
    rng = np.random.default_rng(0)
    batch = {
        "image": [PILImage.fromarray(rng.integers(0, 255, (28, 28), dtype=np.uint8)) for _ in range(4)],
        "label": [1, 2, 3, 4],
        "task_id": [0, 1, 0, 1],
    }
    state = torch.random.get_rng_state()
    out = DigitsTransform(processor)(batch)
    assert torch.equal(
        torch.random.get_rng_state(), state
    )  # it runs in DataLoader workers: nothing to replay
    assert out["labels"] == [1, 2, 3, 4] and out["task_ids"] == [0, 1, 0, 1]
    assert all(image.dtype == np.float32 and image.shape == (3, 32, 32) for image in out["pixel_values"])
    assert DigitsTransform(processor, model_task_ids=[2, 0])(batch)["task_ids"] == [2, 0, 2, 0]
    assert DigitsTransform(processor, task_id=5)(batch)["task_ids"] == [5] * 4


def test_load_task_split_takes_the_local_source_from_data_dir(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"No local data for task 'mnist'.*{tmp_path}"):
        load_task_split("mnist", "test", data_dir=tmp_path)
