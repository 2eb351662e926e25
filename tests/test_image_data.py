"""Tests for the general image-classification loader (image folders, local Parquet/Arrow, a stand-in Hub)."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datasets import ClassLabel, Dataset, DatasetDict, Features, Image, Value
from PIL import Image as PILImage

import ni_hf.data.images as images_module
from ni_hf.data.digits import DigitsTransform
from ni_hf.data.images import ImageClassificationTransform, ImageDatasetSource, ImageTask, load_image_tasks

SHARED_DATA = Path(__file__).parents[2] / "shared" / "data"
LOGGER = "ni_hf.data.images"


def _pixel(image: PILImage.Image) -> int:
    """The value of pixel (0, 0), which the writers below set to identify the image."""
    return int(np.atleast_1d(np.asarray(image)[0, 0])[0])


def _class_pixel(image: PILImage.Image) -> int:
    """The value of pixel (0, 1), which :func:`image_folders` sets to the position of the image's class folder."""
    return int(np.atleast_1d(np.asarray(image)[0, 1])[0])


def image_folders(
    root: Path, counts: dict[str, int], size: int = 12, mode: str = "L", start: int = 0
) -> Path:
    """<root>/<class>/<k>.png, `counts[class]` images each; pixel (0, 0) numbers the images from `start`, pixel
    (0, 1) is the class folder's position in `counts`."""
    number = start
    for position, (name, count) in enumerate(counts.items()):
        folder = root / name
        folder.mkdir(parents=True)
        for k in range(count):
            array = np.full((size, size, 3) if mode == "RGB" else (size, size), number, np.uint8)
            array[0, 1] = position
            PILImage.fromarray(array).save(folder / f"{k}.png")
            number += 1
    return root


def parquet_file(
    path: Path,
    labels: list,
    label_feature: ClassLabel | Value | None = None,
    size: int = 8,
    image_column: str = "image",
    label_column: str = "label",
) -> Path:
    """A Parquet file written by datasets: gray images whose pixel (0, 0) is the row, and the given labels."""
    images = [np.full((size, size), row, np.uint8) for row in range(len(labels))]
    feature = label_feature or ClassLabel(names=sorted({str(label) for label in labels}))
    features = Features({image_column: Image(), label_column: feature})
    path.parent.mkdir(parents=True, exist_ok=True)
    Dataset.from_dict({image_column: images, label_column: labels}, features=features).to_parquet(str(path))
    return path


def truncated_png(path: Path) -> Path:
    noise = np.random.default_rng(0).integers(0, 256, size=(48, 48), dtype=np.uint8)
    PILImage.fromarray(noise).save(path)
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * 0.7)])
    return path


def corrupt_rows(path: Path, rows: list[int]) -> None:
    """Replace the image bytes of the given rows of a Parquet file by bytes no decoder reads."""
    table = pq.read_table(path)
    images = table.column("image").to_pylist()
    for row in rows:
        images[row] = {"bytes": b"junk", "path": None}
    column = pa.array(images, type=table.schema.field("image").type)
    pq.write_table(table.set_column(table.schema.get_field_index("image"), "image", column), path)


# --------------------------------------------------------------------------- image folders


def test_image_folders_give_named_classes_and_labels_that_follow_their_images(tmp_path: Path) -> None:
    train = image_folders(tmp_path / "pets" / "train", {"cat": 4, "dog": 3, "eel": 2})
    val = image_folders(tmp_path / "pets" / "val", {"cat": 1, "eel": 2})
    dd, tasks = load_image_tasks(ImageDatasetSource(train_dir=str(train), validation_dir=str(val)))
    (task,) = tasks
    assert isinstance(task, ImageTask) and task.name == "pets"  # the folder above train/
    assert task.label_names == ["cat", "dog", "eel"] and task.num_labels == 3
    assert task.id2label == {0: "cat", 1: "dog", 2: "eel"} and task.label2id["eel"] == 2
    assert (task.num_train, task.num_eval) == (9, 3) == (dd["train"].num_rows, dd["validation"].num_rows)
    assert task.image_modes == {"L": 12} and task.image_sizes == ((12, 12), (12, 12))
    assert str(train) in task.source and str(val) in task.source
    assert dd["train"].column_names == ["image", "label", "task_id"]
    assert dd["train"].features["label"].names == ["cat", "dog", "eel"]
    assert dd["train"].features["task_id"].names == ["pets"]
    for row in dd["train"]:
        assert row["label"] == _class_pixel(row["image"]) and row["task_id"] == 0
    # validation has no dog folder: eel keeps its training index 2, not 1
    assert sorted(dd["validation"]["label"][:]) == [0, 2, 2]


def test_a_validation_split_is_split_off_stratified_seeded_and_disjoint(tmp_path: Path, caplog) -> None:
    train = image_folders(tmp_path / "shapes", {"circle": 18, "square": 9, "star": 1})
    with caplog.at_level(logging.INFO, logger=LOGGER):
        dd, (task,) = load_image_tasks(ImageDatasetSource(train_dir=str(train)), train_val_split=0.2, seed=3)
    assert task.name == "shapes" and (task.num_train, task.num_eval) == (22, 6)  # ceil(0.2 * 28) = 6
    # shares 3.6, 1.8 and 0.2: 3 + 1, then one more each to the largest remainders (square, circle); star: none
    assert sorted(dd["validation"]["label"][:]) == [0, 0, 0, 0, 1, 1]
    assert "classes with one row stay in training: ['star']" in caplog.text
    train_ids = {_pixel(image) for image in dd["train"]["image"]}
    val_ids = {_pixel(image) for image in dd["validation"]["image"]}
    assert not train_ids & val_ids and len(train_ids | val_ids) == 28
    again, _ = load_image_tasks(ImageDatasetSource(train_dir=str(train)), train_val_split=0.2, seed=3)
    other, _ = load_image_tasks(ImageDatasetSource(train_dir=str(train)), train_val_split=0.2, seed=4)
    assert [_pixel(i) for i in again["validation"]["image"]] == [_pixel(i) for i in dd["validation"]["image"]]
    assert {_pixel(i) for i in other["validation"]["image"]} != val_ids


def test_no_validation_and_no_split_is_refused(tmp_path: Path) -> None:
    train = image_folders(tmp_path / "a", {"x": 2, "y": 2})
    with pytest.raises(ValueError, match=r"Task 'a' .* has no validation split.*train_val_split above 0"):
        load_image_tasks(ImageDatasetSource(train_dir=str(train)), train_val_split=None)
    one_each = image_folders(tmp_path / "b", {"x": 1, "y": 1})
    with pytest.raises(ValueError, match=r"each class needs 2 rows"):
        load_image_tasks(ImageDatasetSource(train_dir=str(one_each)))


# --------------------------------------------------------------------------- local Parquet and Arrow


def test_a_local_parquet_folder_uses_its_test_split_for_validation(tmp_path: Path) -> None:
    names = ClassLabel(names=["ant", "bee", "wasp"])
    parquet_file(tmp_path / "insects" / "train.parquet", [0, 1, 2, 2, 1, 0], names)
    parquet_file(tmp_path / "insects" / "test.parquet", [2, 0], names)
    dd, (task,) = load_image_tasks(ImageDatasetSource(dataset_name=str(tmp_path / "insects")))
    assert task.name == "insects" and task.label_names == ["ant", "bee", "wasp"]
    assert dd["validation"]["label"][:] == [2, 0]  # in order
    assert [_pixel(image) for image in dd["validation"]["image"]] == [0, 1]
    assert sorted(dd["train"]["label"][:]) == [0, 0, 1, 1, 2, 2]


def test_string_labels_are_encoded_and_validation_matched_by_name(tmp_path: Path, caplog) -> None:
    train = parquet_file(tmp_path / "train.parquet", ["wasp", "ant", "bee", "ant"], Value("string"))
    val = parquet_file(tmp_path / "val.parquet", ["bee", "wasp"], Value("string"))
    source = ImageDatasetSource(name="bugs", train_file=str(train), validation_file=str(val))
    with caplog.at_level(logging.INFO, logger=LOGGER):
        dd, (task,) = load_image_tasks(source)
    assert task.label_names == ["ant", "bee", "wasp"]
    assert "holds string values, encoded as a class label of 3 classes (sorted)" in caplog.text
    assert dd["validation"]["label"][:] == [1, 2]
    assert dd["validation"].features["label"] == ClassLabel(names=["ant", "bee", "wasp"])
    # a class label of other names is matched by name, not by index
    parquet_file(tmp_path / "named.parquet", [0, 1], ClassLabel(names=["wasp", "ant"]))
    dd, _ = load_image_tasks(
        ImageDatasetSource(data_files={"train": str(train), "test": str(tmp_path / "named.parquet")})
    )
    assert dd["validation"]["label"][:] == [2, 0]


def test_integer_labels_are_encoded_in_numeric_order_and_data_files_take_patterns(
    tmp_path: Path, monkeypatch, caplog
) -> None:
    for shard, labels in enumerate(([10, 2, 2], [33, 10, 33])):
        parquet_file(tmp_path / "shards" / f"train-{shard:05d}-of-00002.parquet", labels, Value("int64"))
    parquet_file(tmp_path / "shards" / "eval.parquet", [33, 2], Value("int64"))
    monkeypatch.chdir(tmp_path)
    source = ImageDatasetSource(
        data_files={"train": "shards/train-*.parquet", "validation": "shards/eval.parquet"}
    )
    with caplog.at_level(logging.INFO, logger=LOGGER):
        dd, (task,) = load_image_tasks(source)
    assert task.name == "shards" and task.label_names == ["2", "10", "33"]  # 2 < 10 < 33, not "10" < "2"
    assert "holds int64 values, encoded as a class label of 3 classes" in caplog.text
    assert sorted(dd["train"]["label"][:]) == [0, 0, 1, 1, 2, 2] and dd["validation"]["label"][:] == [2, 0]
    with pytest.raises(
        FileNotFoundError, match=r"No file matches .*shards/test-\*.parquet \(data_files of the"
    ):
        load_image_tasks(ImageDatasetSource(data_files={"train": "shards/test-*.parquet"}))


def test_a_local_folder_of_split_image_folders_matches_validation_classes_to_training(tmp_path: Path) -> None:
    image_folders(tmp_path / "flowers" / "train", {"iris": 3, "rose": 3, "tulip": 3})
    image_folders(tmp_path / "flowers" / "val", {"tulip": 2})
    dd, (task,) = load_image_tasks(ImageDatasetSource(dataset_name=str(tmp_path / "flowers")))
    assert task.label_names == ["iris", "rose", "tulip"] and dd["validation"]["label"][:] == [2, 2]
    assert "splits train, val" in task.source


def test_validation_classes_that_training_does_not_have_are_named(tmp_path: Path) -> None:
    train = parquet_file(tmp_path / "train.parquet", ["ant", "bee"], Value("string"))
    val = parquet_file(tmp_path / "val.parquet", ["bee", "moth", "gnat"], Value("string"))
    with pytest.raises(ValueError, match=r"classes that training does not have: \['gnat', 'moth'\]"):
        load_image_tasks(ImageDatasetSource(train_file=str(train), validation_file=str(val)))
    image_folders(tmp_path / "tr", {"ant": 2})
    image_folders(tmp_path / "va", {"ant": 1, "moth": 1})
    with pytest.raises(
        ValueError, match=r"validation split .* classes that training does not have: \['moth'\]"
    ):
        load_image_tasks(
            ImageDatasetSource(train_dir=str(tmp_path / "tr"), validation_dir=str(tmp_path / "va"))
        )


def test_arrow_files_and_saved_datasets_load(tmp_path: Path) -> None:
    features = Features({"image": Image(), "label": ClassLabel(names=["no", "yes"])})
    images = [np.full((8, 8), row, np.uint8) for row in range(6)]
    saved = DatasetDict(
        {
            "train": Dataset.from_dict({"image": images, "label": [0, 1, 0, 1, 0, 1]}, features=features),
            "validation": Dataset.from_dict({"image": images[:2], "label": [1, 0]}, features=features),
        }
    )
    saved.save_to_disk(str(tmp_path / "saved"))
    dd, (task,) = load_image_tasks(ImageDatasetSource(dataset_name=str(tmp_path / "saved")))
    assert task.label_names == ["no", "yes"] and (task.num_train, task.num_eval) == (6, 2)
    arrow_files = sorted((tmp_path / "saved" / "train").glob("data-*.arrow"))
    assert len(arrow_files) == 1 and not list((tmp_path / "saved").rglob("cache-*"))  # nothing written beside
    dd, (task,) = load_image_tasks(ImageDatasetSource(name="yesno", dataset_name=str(arrow_files[0])))
    assert task.name == "yesno" and (task.num_train, task.num_eval) == (5, 1)


# --------------------------------------------------------------------------- several tasks


def test_several_datasets_are_tasks_with_their_own_labels(tmp_path: Path, caplog) -> None:
    image_folders(tmp_path / "pets" / "train", {"cat": 6, "dog": 6}, mode="RGB")
    image_folders(tmp_path / "pets" / "validation", {"cat": 2, "dog": 2}, mode="RGB")
    names = ClassLabel(names=["ant", "bee", "wasp"])
    parquet_file(tmp_path / "bugs" / "train.parquet", [i % 3 for i in range(9)], names, size=10)
    parquet_file(tmp_path / "bugs" / "validation.parquet", [2, 1, 0], names, size=10)
    sources = [
        ImageDatasetSource(dataset_name=str(tmp_path / "pets")),
        ImageDatasetSource(dataset_name=str(tmp_path / "bugs")),
    ]
    with caplog.at_level(logging.INFO, logger=LOGGER):
        dd, tasks = load_image_tasks(sources, max_train_samples=5, max_eval_samples=3, seed=1)
    assert [task.name for task in tasks] == ["pets", "bugs"]
    assert [task.label_names for task in tasks] == [["cat", "dog"], ["ant", "bee", "wasp"]]
    assert [(task.num_train, task.num_eval) for task in tasks] == [(5, 3), (5, 3)]
    assert dd["train"].features["label"] == Value("int64")  # the tasks' label names differ
    assert dd["train"].features["task_id"].names == ["pets", "bugs"]
    task_ids = dd["train"]["task_id"][:]
    assert sorted(task_ids) == [0] * 5 + [1] * 5 and task_ids != sorted(task_ids)  # shuffled
    assert dd["validation"]["task_id"][:] == [0, 0, 0, 1, 1, 1]  # tasks in order
    assert {row["image"].mode for row in dd["train"] if row["task_id"] == 0} == {"RGB"}
    messages = [r.getMessage() for r in caplog.records if "several modes" in r.getMessage()]
    assert messages == [
        "The images are of several modes (the processor converts each to its number of "
        "channels): pets: 8 RGB; bugs: 8 L"
    ]
    with pytest.raises(ValueError, match=r"task name\(s\) \['pets'\]"):
        load_image_tasks([sources[0], sources[0]])


def test_a_gray_and_rgb_mix_within_a_task_is_a_warning_with_counts(tmp_path: Path, caplog) -> None:
    root = tmp_path / "mix"
    image_folders(root / "a", {"x": 3}, mode="L")
    image_folders(root / "b", {"y": 2}, mode="RGB")
    (root / "b" / "y").rename(root / "a" / "y")
    with caplog.at_level(logging.INFO, logger=LOGGER):
        _, (task,) = load_image_tasks(ImageDatasetSource(train_dir=str(root / "a")), train_val_split=0.4)
    assert task.image_modes == {"L": 3, "RGB": 2}
    warnings = [
        r for r in caplog.records if r.levelno == logging.WARNING and "several modes" in r.getMessage()
    ]
    assert len(warnings) == 1 and "a: 3 L, 2 RGB" in warnings[0].getMessage()


# --------------------------------------------------------------------------- the Hub (stand-in)


def test_a_hub_dataset_goes_through_load_dataset_and_the_shared_checks(monkeypatch, tmp_path: Path) -> None:
    calls = []
    features = Features(
        {"img": Image(), "fine_label": ClassLabel(names=["apple", "pear"]), "extra": Value("int64")}
    )

    def split(labels: list[int]) -> Dataset:
        images = [np.full((9, 7, 3), i, np.uint8) for i in range(len(labels))]
        return Dataset.from_dict({"img": images, "fine_label": labels, "extra": labels}, features=features)

    def fake_load_dataset(path, name=None, **kwargs):
        calls.append((path, name, kwargs))
        if path == "someone/only-train":
            return DatasetDict({"train": split([0, 1] * 10)})
        return DatasetDict({"train": split([0, 1, 1, 0]), "validation": split([1, 0]), "test": split([0])})

    monkeypatch.setattr(images_module, "load_dataset", fake_load_dataset)
    source = ImageDatasetSource(
        dataset_name="someone/fruit",
        dataset_config_name="small",
        image_column_name="img",
        label_column_name="fine_label",
    )
    dd, (task,) = load_image_tasks(source, cache_dir=str(tmp_path), token="t")
    assert calls == [("someone/fruit", "small", {"cache_dir": str(tmp_path), "token": "t"})]
    assert task.name == "fruit" and task.label_names == ["apple", "pear"]
    assert (task.num_train, task.num_eval) == (4, 2)  # validation, not test
    assert task.image_sizes == ((7, 9), (7, 9)) and task.image_modes == {"RGB": 6}
    assert dd["train"].column_names == ["image", "label", "task_id"]
    assert "Hub dataset someone/fruit (config small)" in task.source
    dd, (task,) = load_image_tasks(
        [
            ImageDatasetSource(
                dataset_name="someone/fruit",
                image_column_name="img",
                label_column_name="fine_label",
                validation_split="test",
            )
        ]
    )
    assert task.num_eval == 1
    dd, (task,) = load_image_tasks(
        ImageDatasetSource(
            dataset_name="someone/only-train", image_column_name="img", label_column_name="fine_label"
        )
    )
    assert (task.num_train, task.num_eval) == (17, 3) and sorted(dd["validation"]["label"][:]) == [0, 1, 1]
    calls.clear()
    fruit = {"image_column_name": "img", "label_column_name": "fine_label"}
    load_image_tasks(
        ImageDatasetSource(dataset_name="someone/fruit", data_files={"train": "a/*.parquet"}, **fruit)
    )
    assert calls == [
        ("someone/fruit", None, {"cache_dir": None, "token": None, "data_files": {"train": "a/*.parquet"}})
    ]
    with pytest.raises(
        ValueError, match=r"No split 'dev' \(validation_split\).*\['train', 'validation', 'test'\]"
    ):
        load_image_tasks(ImageDatasetSource(dataset_name="someone/fruit", validation_split="dev"))
    with pytest.raises(
        ValueError, match=r"--image_column_name 'image' not found.*\['img', 'fine_label', 'extra'\]"
    ):
        load_image_tasks(ImageDatasetSource(dataset_name="someone/fruit"))


# --------------------------------------------------------------------------- bad data


def test_undecodable_and_truncated_images_are_named_or_skipped(tmp_path: Path, caplog) -> None:
    train = image_folders(tmp_path / "t" / "train", {"a": 3, "b": 3})
    garbage = train / "a" / "garbage.png"
    garbage.write_bytes(b"not an image")
    truncated = truncated_png(train / "b" / "truncated.png")
    source = ImageDatasetSource(
        train_dir=str(train), validation_dir=str(image_folders(tmp_path / "v", {"a": 1}))
    )
    with pytest.raises(ValueError, match=r"2 of the 8 images of the train split of task 't'") as caught:
        load_image_tasks(source)
    assert f"{garbage}: not an image PIL can identify" in str(caught.value)
    assert f"{truncated}: OSError" in str(caught.value) and "skip_bad_images=True" in str(caught.value)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        dd, (task,) = load_image_tasks(source, skip_bad_images=True)
    assert task.num_train == 6 and sorted(dd["train"]["label"][:]) == [0, 0, 0, 1, 1, 1]
    assert (
        "Skipped 2 of the 8 images" in caplog.text
        and str(garbage) in caplog.text
        and str(truncated) in caplog.text
    )


def test_bad_parquet_rows_are_named_by_file_and_row(tmp_path: Path, caplog) -> None:
    train = parquet_file(tmp_path / "d" / "train.parquet", [0, 1] * 5)
    parquet_file(tmp_path / "d" / "validation.parquet", [0, 1])
    corrupt_rows(train, [3, 8])
    with pytest.raises(
        ValueError, match=rf"(?s)2 of the 10 images.*{re.escape(str(train))} \(row 3\): not an image"
    ):
        load_image_tasks(ImageDatasetSource(dataset_name=str(tmp_path / "d")))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        dd, _ = load_image_tasks(ImageDatasetSource(dataset_name=str(tmp_path / "d")), skip_bad_images=True)
    assert f"{train} (row 8)" in caplog.text
    assert sorted(_pixel(image) for image in dd["train"]["image"]) == [0, 1, 2, 4, 5, 6, 7, 9]


def test_rows_split_off_for_validation_are_named_by_their_file_row(tmp_path: Path, caplog) -> None:
    """Odd rows are bad: the validation rows split off are named by their row of the file, the kept ones are even."""
    train = parquet_file(tmp_path / "train.parquet", [0, 1] * 10)
    corrupt_rows(train, list(range(1, 20, 2)))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        dd, _ = load_image_tasks(
            ImageDatasetSource(train_file=str(train)), train_val_split=0.25, skip_bad_images=True
        )
    (message,) = [r.getMessage() for r in caplog.records if "of the validation split" in r.getMessage()]
    named = [int(row) for row in re.findall(r"\(row (\d+)\)", message)]
    kept = [_pixel(image) for image in dd["validation"]["image"]]
    assert named and all(row % 2 == 1 for row in named) and all(row % 2 == 0 for row in kept)
    assert len(set(named) | set(kept)) == len(named) + len(kept) == 5  # ceil(0.25 * 20)
    assert not set(kept) & {_pixel(image) for image in dd["train"]["image"]}
    corrupt_rows(train, list(range(20)))
    with pytest.raises(ValueError, match=rf"The train split of task '{tmp_path.name}' has no usable rows"):
        load_image_tasks(ImageDatasetSource(train_file=str(train)), skip_bad_images=True)


def test_images_smaller_than_min_image_size_are_named_with_their_size(tmp_path: Path) -> None:
    train = image_folders(tmp_path / "s" / "train", {"a": 2}, size=16)
    image_folders(tmp_path / "small", {"a": 1}, size=3)
    (tmp_path / "small" / "a" / "0.png").rename(train / "a" / "tiny.png")
    source = ImageDatasetSource(
        train_dir=str(train), validation_dir=str(image_folders(tmp_path / "v", {"a": 1}))
    )
    with pytest.raises(ValueError, match=r"tiny.png: 3x3 pixels, smaller than min_image_size 4"):
        load_image_tasks(source, min_image_size=4)
    _, (task,) = load_image_tasks(source, min_image_size=3)
    assert task.image_sizes == ((3, 3), (16, 16))
    _, (task,) = load_image_tasks(source, min_image_size=4, skip_bad_images=True)
    assert task.num_train == 2


def test_class_folder_problems_are_named(tmp_path: Path, caplog) -> None:
    train = image_folders(tmp_path / "c" / "train", {"full": 2})
    (train / "empty").mkdir()
    with pytest.raises(
        ValueError, match=rf"Class folders with no images .*\['{re.escape(str(train / 'empty'))}'\]"
    ):
        load_image_tasks(ImageDatasetSource(train_dir=str(train)))
    (train / "empty").rmdir()
    loose = image_folders(tmp_path / "loose", {"x": 1})
    (loose / "x" / "0.png").rename(loose / "stray.png")
    (loose / "y").mkdir()
    (loose / "y" / "0.png").write_bytes((train / "full" / "0.png").read_bytes())
    with pytest.raises(ValueError, match=r"images outside any class folder: \[.*stray.png'\]"):
        load_image_tasks(ImageDatasetSource(train_dir=str(loose)))
    (train / "full" / "notes.txt").write_text("not an image")
    nested = train / "full" / "2024"
    nested.mkdir()
    (nested / "deep.png").write_bytes((train / "full" / "0.png").read_bytes())
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        _, (task,) = load_image_tasks(ImageDatasetSource(train_dir=str(train)), train_val_split=0.3)
    assert task.num_train + task.num_eval == 3  # the image in a sub-folder of its class counts
    assert "Left out 1 files" in caplog.text and "notes.txt" in caplog.text


def test_label_and_image_column_problems_say_what_they_are(tmp_path: Path) -> None:
    path = parquet_file(tmp_path / "a.parquet", [0, 1], image_column="picture", label_column="target")
    with pytest.raises(
        ValueError, match=r"--label_column_name 'label' not found .* columns are \['picture', 'target'\]"
    ):
        load_image_tasks(ImageDatasetSource(train_file=str(path), image_column_name="picture"))
    with pytest.raises(ValueError, match=r"--image_column_name 'image' not found .* \['picture', 'target'\]"):
        load_image_tasks(ImageDatasetSource(train_file=str(path), label_column_name="target"))
    floats = parquet_file(tmp_path / "f.parquet", [0.5, 1.5], Value("float32"))
    with pytest.raises(ValueError, match=r"holds Value\('float32'\): expected a class label"):
        load_image_tasks(ImageDatasetSource(train_file=str(floats)))
    pq.write_table(
        pa.table({"image": pa.array([1, 2]), "label": pa.array(["a", "b"])}), tmp_path / "ints.parquet"
    )
    with pytest.raises(ValueError, match=r"image column 'image' .* holds Value\('int64'\): expected images"):
        load_image_tasks(ImageDatasetSource(train_file=str(tmp_path / "ints.parquet")))
    unlabeled = parquet_file(tmp_path / "u.parquet", [0, -1, 1, -1], ClassLabel(names=["a", "b"]))
    with pytest.raises(
        ValueError, match=r"2 rows of the train split .* outside 0..1 .*\(row 1\), .*\(row 3\)"
    ):
        load_image_tasks(ImageDatasetSource(train_file=str(unlabeled)))


def test_bad_arguments_are_refused_naming_them(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"Give one dataset per ImageDatasetSource.*none of them"):
        ImageDatasetSource()
    with pytest.raises(ValueError, match=r"got \['dataset_name', 'train_dir/validation_dir'\]"):
        ImageDatasetSource(dataset_name="x/y", train_dir="d")
    with pytest.raises(ValueError, match=r"validation_dir .* needs a train_dir"):
        ImageDatasetSource(validation_dir="v")
    with pytest.raises(ValueError, match=r"image_column_name and label_column_name are both 'x'"):
        ImageDatasetSource(dataset_name="x/y", image_column_name="x", label_column_name="x")
    source = ImageDatasetSource(train_dir=str(image_folders(tmp_path / "d", {"a": 2, "b": 2})))
    for option, value, message in (
        ("train_val_split", 1.0, r"train_val_split .* must be in \[0, 1\), got 1.0"),
        ("min_image_size", 0, r"min_image_size must be a positive integer"),
        ("max_train_samples", 0, r"max_train_samples \(rows per task of the train split\) .* got 0"),
        ("max_eval_samples", 2.5, r"max_eval_samples \(rows per task of the validation split\) .* got 2.5"),
    ):
        with pytest.raises(ValueError, match=message):
            load_image_tasks(source, **{option: value})
    with pytest.raises(FileNotFoundError, match=r"No such local dataset folder or file: .*missing.parquet"):
        load_image_tasks(ImageDatasetSource(dataset_name=str(tmp_path / "missing.parquet")))
    with pytest.raises(FileNotFoundError, match=r"No train split for task 'empty' .*use train_dir"):
        (tmp_path / "empty").mkdir()
        load_image_tasks(ImageDatasetSource(dataset_name=str(tmp_path / "empty")))


# --------------------------------------------------------------------------- Fashion-MNIST and the transform


def test_fashion_mnist_loads_with_its_ten_named_classes() -> None:
    if not (SHARED_DATA / "fashion_mnist" / "train.parquet").is_file():
        pytest.skip(f"no Fashion-MNIST at {SHARED_DATA / 'fashion_mnist'}")
    source = ImageDatasetSource(dataset_name=str(SHARED_DATA / "fashion_mnist"))
    dd, (task,) = load_image_tasks(source, max_train_samples=300, max_eval_samples=100)
    assert task.name == "fashion_mnist" and task.num_labels == 10
    assert task.label_names[0] == "T-shirt/top" and task.label_names[-1] == "Ankle boot"
    assert (task.num_train, task.num_eval) == (300, 100)  # its test split is the validation split
    assert task.image_modes == {"L": 400} and task.image_sizes == ((28, 28), (28, 28))
    assert len(set(dd["train"]["label"][:])) == 10


def test_the_transform_is_the_digits_transform_and_follows_task_ids() -> None:
    from ni_hf import NeuralInterpreterImageProcessor

    assert DigitsTransform is ImageClassificationTransform
    rng = np.random.default_rng(0)
    batch = {
        "image": [PILImage.fromarray(rng.integers(0, 255, (20, 28, 3), dtype=np.uint8)) for _ in range(3)],
        "label": [2, 0, 1],
        "task_id": [1, 0, 1],
    }
    out = ImageClassificationTransform(NeuralInterpreterImageProcessor(), model_task_ids=[4, 7])(batch)
    assert out["labels"] == [2, 0, 1] and out["task_ids"] == [7, 4, 7]
    assert all(image.dtype == np.float32 and image.ndim == 3 for image in out["pixel_values"])
