"""Image-classification datasets as tasks: one dataset, one task (its own CLS token and head, as in Sec. 4.2).

:func:`load_image_tasks` reads one or several :class:`ImageDatasetSource` into one ``DatasetDict`` with the splits
``train`` and ``validation``, whose rows are::

    image    PIL image (``datasets.Image`` feature; mode and size as in the data)
    label    int, the class index within the row's task (a ``ClassLabel`` when every task has the same label
             names, else int64: each task's names are in its :class:`ImageTask`)
    task_id  int, index of the row's task (``ClassLabel`` whose names are the task names)

and one :class:`ImageTask` per source, in order: its name, label names, row counts and what it was read from.

A source is one of (the names follow transformers' ``run_image_classification.py``):

- ``dataset_name``: a dataset on the Hugging Face Hub (with ``dataset_config_name``; ``data_files`` pick files of
  it), or a local folder or file: a folder of Parquet or Arrow files per split (``train.parquet``,
  ``train-*.parquet``, ``data/train-*.parquet``, ``train/*.parquet``, the same with ``.arrow``), a folder written by
  ``save_to_disk``, image folders ``<folder>/<split>/<class>/<image>``, or one Parquet or Arrow file (the train
  split);
- ``train_dir`` (and ``validation_dir``): image folders ``<dir>/<class>/<image>``, the class the name of the folder
  below ``<dir>`` (images may sit deeper inside it);
- ``data_files`` (a split name or a list of files per split), ``train_file`` and ``validation_file``: local Parquet
  or Arrow files.

The validation split is ``validation_split`` when given, else the data's ``validation`` split (or ``valid``,
``val``, ``dev``), else its ``test`` split, else ``train_val_split`` of the train rows, split off stratified by
class and seeded (classes with a single row stay in training).

Label names come from the data: a ``ClassLabel`` feature's names, or the class folders' names (sorted). String or
integer label columns are encoded as class labels (names sorted; logged). Validation classes are matched to the
training classes by name; one that training does not have is refused, naming it.

Every image of the loaded rows is decoded once (in threads, with a progress bar) before training: an image that
cannot be decoded (file path, or Parquet file and row), or one smaller than ``min_image_size`` pixels on a side, is
named and refused, or with ``skip_bad_images=True`` left out with a warning that counts and names it. Images of
several modes (gray "L" and "RGB") are logged once with their counts: the processor converts each to its number
of channels. ``max_train_samples`` / ``max_eval_samples`` cap the rows of each task, drawn at random (seeded by
``seed``, the task and the split) and kept in their order; the train split is then shuffled with ``seed``, the
validation split keeps the tasks one after another, in order.
"""

from __future__ import annotations

import glob
import hashlib
import io
import logging
import math
import os
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import PIL.Image
import pyarrow as pa
import pyarrow.parquet as pq
from datasets import (
    ClassLabel,
    Dataset,
    DatasetDict,
    Features,
    Image,
    Value,
    concatenate_datasets,
    load_dataset,
    load_from_disk,
)
from datasets.packaged_modules.imagefolder.imagefolder import ImageFolder
from tqdm.auto import tqdm

logger = logging.getLogger(__name__)

IMAGE_FILE_EXTENSIONS: frozenset[str] = frozenset(ImageFolder.EXTENSIONS)
DATA_FILE_EXTENSIONS: tuple[str, ...] = (".parquet", ".arrow")
VALIDATION_SPLIT_NAMES: tuple[str, ...] = ("validation", "valid", "val", "dev", "test")
SPLIT_FILE_PATTERNS: tuple[str, ...] = (
    "{split}{ext}",
    "{split}-*{ext}",
    "data/{split}-*{ext}",
    "{split}/*{ext}",
)
MAX_LISTED = 20  # rows named in an error about labels (an image error names every image)


@dataclass
class ImageDatasetSource:
    """One image-classification dataset, read as one task (see the module docstring for the layouts)."""

    name: str | None = None
    dataset_name: str | None = None
    dataset_config_name: str | None = None
    train_dir: str | None = None
    validation_dir: str | None = None
    data_files: str | list[str] | dict[str, str | list[str]] | None = None
    train_file: str | None = None
    validation_file: str | None = None
    image_column_name: str = "image"
    label_column_name: str = "label"
    train_split: str = "train"
    validation_split: str | None = None

    def __post_init__(self) -> None:
        for option in ("image_column_name", "label_column_name", "train_split"):
            if not isinstance(getattr(self, option), str) or not getattr(self, option).strip():
                raise ValueError(f"{option} must be a non-empty string, got {getattr(self, option)!r}.")
        if self.image_column_name == self.label_column_name:
            raise ValueError(f"image_column_name and label_column_name are both {self.image_column_name!r}.")
        if self.name is not None and (not isinstance(self.name, str) or not self.name.strip()):
            raise ValueError(f"name (the task name) must be a non-empty string or None, got {self.name!r}.")
        given = {
            "dataset_name": self.dataset_name is not None,
            "train_dir/validation_dir": self.train_dir is not None or self.validation_dir is not None,
            "train_file/validation_file": self.train_file is not None or self.validation_file is not None,
            "data_files": self.data_files is not None
            and self.dataset_name is None,  # with a dataset: its files
        }
        kinds = [kind for kind, present in given.items() if present]
        if len(kinds) != 1:
            raise ValueError(
                "Give one dataset per ImageDatasetSource: dataset_name (a Hub dataset or a local folder or file, "
                "optionally with data_files), train_dir (and validation_dir: image folders), train_file (and "
                f"validation_file) or data_files (local Parquet or Arrow files); got {kinds or 'none of them'}."
            )
        if self.validation_dir is not None and self.train_dir is None:
            raise ValueError(f"validation_dir {self.validation_dir} needs a train_dir beside it.")
        if self.validation_file is not None and self.train_file is None:
            raise ValueError(f"validation_file {self.validation_file} needs a train_file beside it.")
        if self.dataset_config_name is not None and self.dataset_name is None:
            raise ValueError(f"dataset_config_name {self.dataset_config_name!r} needs a dataset_name.")

    @property
    def task_name(self) -> str:
        """The task's name: ``name``, else the dataset's (the Hub id's last part, the folder's or the file's)."""
        if self.name is not None:
            return self.name.strip()
        if self.dataset_name is not None:
            path = Path(self.dataset_name.rstrip("/"))
            return path.stem if path.suffix in DATA_FILE_EXTENSIONS else path.name
        if self.train_dir is not None:
            path = Path(self.train_dir).expanduser().resolve()
            return path.parent.name if _canonical_split(path.name) == "train" else path.name
        path = Path(self.train_file or _first_file(self.data_files)).expanduser()
        stem = path.name.split(".")[0].split("-")[0]  # train.parquet, train-00000-of-00002.parquet
        return path.resolve().parent.name if _canonical_split(stem) or stem == "data" else path.stem


@dataclass(frozen=True)
class ImageTask:
    """One loaded task: its name, label names (class index -> name), row counts and where it was read from."""

    name: str
    label_names: list[str]
    num_train: int
    num_eval: int
    source: str
    image_modes: dict[str, int] = field(default_factory=dict)
    image_sizes: tuple[tuple[int, int], tuple[int, int]] | None = None  # smallest and largest (width, height)

    @property
    def num_labels(self) -> int:
        return len(self.label_names)

    @property
    def id2label(self) -> dict[int, str]:
        return dict(enumerate(self.label_names))

    @property
    def label2id(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.label_names)}


@dataclass
class ImageSplit:
    """One split of one task before sampling: ``image`` and ``label`` columns, optionally a subset of its rows.

    ``origin(row)`` names where row ``row`` of ``dataset`` comes from (a file, or a file and row); None names it by
    ``where`` and the row. ``rows`` (None: every row) are the rows of ``dataset`` that form the split.
    """

    dataset: Dataset
    where: str
    origin: Callable[[int], str] | None = None
    rows: np.ndarray | None = None

    def name_row(self, row: int) -> str:
        """Name where row ``row`` of ``dataset`` comes from."""
        return self.origin(row) if self.origin is not None else f"{self.where} (row {row})"


@dataclass
class TaskSplits:
    """One task's splits (split name -> :class:`ImageSplit`), its label names and its one-line description."""

    name: str
    label_names: list[str]
    splits: dict[str, ImageSplit]
    source: str


class FileRows:
    """Names row ``i`` of Parquet or Arrow files read one after another as ``<file> (row <r>)``."""

    def __init__(self, files: Sequence[Path], num_rows: Sequence[int]) -> None:
        self.files = list(files)
        self.starts = np.cumsum([0, *num_rows])

    def __call__(self, row: int) -> str:
        index = int(np.searchsorted(self.starts, row, side="right")) - 1
        return f"{self.files[index]} (row {row - self.starts[index]})"


# --------------------------------------------------------------------------- checks of the arguments


def check_max_samples(max_samples: Any, option: str, split: str) -> None:
    """Refuse a per-task row cap that is not None or a positive integer (0 would leave the split empty)."""
    if max_samples is None:
        return
    if isinstance(max_samples, bool) or not isinstance(max_samples, (int, np.integer)) or max_samples < 1:
        raise ValueError(
            f"{option} (rows per task of the {split} split) must be a positive integer or None (every row), "
            f"got {max_samples!r}: the {split} split would be empty."
        )


def _check_options(train_val_split: Any, min_image_size: Any) -> None:
    """Refuse a ``train_val_split`` outside (0, 1) and a ``min_image_size`` that is not a positive integer."""
    if train_val_split is not None and (
        isinstance(train_val_split, bool)
        or not isinstance(train_val_split, (int, float))
        or not 0 <= train_val_split < 1
    ):
        raise ValueError(
            f"train_val_split (the fraction of the train rows split off for validation when a dataset has no "
            f"validation split) must be in [0, 1), got {train_val_split!r}."
        )
    if min_image_size is not None and (
        isinstance(min_image_size, bool)
        or not isinstance(min_image_size, (int, np.integer))
        or min_image_size < 1
    ):
        raise ValueError(
            f"min_image_size must be a positive integer (pixels) or None, got {min_image_size!r}."
        )


def check_not_empty(ds: Dataset, task: str, split: str, where: str) -> None:
    """Refuse a split without rows, naming it (an empty split fails much later, with an unrelated error)."""
    if len(ds) == 0:
        raise ValueError(f"The {split} split of task {task!r} has no usable rows ({where}).")


def _canonical_split(name: str) -> str | None:
    """ "train", "validation" or "test" for a split name or its usual aliases ("val", "testing", ...), else None."""
    from datasets.data_files import SPLIT_KEYWORDS

    for split, keywords in SPLIT_KEYWORDS.items():
        if name.lower() in keywords:
            return str(split)
    return None


def _first_file(data_files: str | list[str] | dict[str, str | list[str]] | None) -> str:
    """The first file (or pattern) named by ``data_files``."""
    if isinstance(data_files, dict):
        data_files = next(iter(data_files.values()), "")
    if isinstance(data_files, (list, tuple)):
        data_files = data_files[0] if data_files else ""
    return str(data_files)


# --------------------------------------------------------------------------- local files


def find_split_files(folder: Path, split: str) -> list[Path]:
    """The Parquet (else Arrow) files of one split in a folder, by the first layout that matches."""
    for ext in DATA_FILE_EXTENSIONS:
        for pattern in SPLIT_FILE_PATTERNS:
            files = sorted(folder.glob(pattern.format(split=split, ext=ext)))
            if files:
                return files
    return []


def has_image_folder(folder: Path) -> bool:
    """Tell whether ``folder`` holds class folders (sub-folders not starting with a dot)."""
    return folder.is_dir() and any(p.is_dir() and not p.name.startswith(".") for p in folder.iterdir())


def read_data_files(files: Sequence[Path | str]) -> ImageSplit:
    """Read Parquet or Arrow files into one Dataset, each row named by its file and row.

    Parquet is read with pyarrow straight into memory (no cache files); Arrow files are memory-mapped. A file that
    cannot be read, or files whose columns differ, are refused by name.
    """
    files = [Path(f).expanduser() for f in files]
    parts, num_rows = [], []
    for path in files:
        if not path.is_file():
            raise FileNotFoundError(f"No such data file: {path}")
        if path.suffix not in DATA_FILE_EXTENSIONS:
            raise ValueError(f"{path}: expected a Parquet (.parquet) or Arrow (.arrow) file.")
        try:
            part = _read_parquet(path) if path.suffix == ".parquet" else _read_arrow(path)
        except (OSError, pa.ArrowException) as error:
            raise ValueError(f"{path} cannot be read as {path.suffix[1:]}: {error}") from None
        parts.append(part)
        num_rows.append(len(part))
    where = ", ".join(str(f) for f in files)
    columns = {tuple(part.column_names) for part in parts}
    if len(columns) > 1:
        raise ValueError(f"The files {where} have different columns: {sorted(columns)}")
    try:
        ds = parts[0] if len(parts) == 1 else concatenate_datasets(parts)
    except ValueError as error:
        raise ValueError(f"The files {where} cannot be read as one split: {error}") from None
    return ImageSplit(ds, where, FileRows(files, num_rows))


def _read_parquet(path: Path) -> Dataset:
    """One Parquet file as an in-memory Dataset (features from the file's metadata when ``datasets`` wrote it)."""
    table = pq.read_table(path)
    stat = path.stat()
    # A fingerprint from the file's identity spares datasets from hashing the whole table (~1 s for MNIST-M).
    digest = hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode())
    return Dataset(table, fingerprint=digest.hexdigest()[:16])


def _read_arrow(path: Path) -> Dataset:
    """One Arrow file: ``datasets``' stream format memory-mapped, else an Arrow IPC file read into memory."""
    try:
        return Dataset.from_file(str(path))
    except (OSError, pa.ArrowException):
        with pa.memory_map(str(path)) as source:
            return Dataset(pa.ipc.open_file(source).read_all())


def read_image_folder(
    folder: Path | str, split: str, task: str, label_names: Sequence[str] | None = None
) -> ImageSplit:
    """Image folders ``<folder>/<class>/<image>``: one row per image, the label its class folder's name.

    The label names are the class folders' names, sorted, or ``label_names`` (a validation split takes its training
    split's): a class folder not among them, one with no images, and images outside any class folder are refused by
    name; files that are not images by their extension are named in a warning.
    """
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise FileNotFoundError(f"No image folder {folder} for the {split} split of task {task!r}.")
    entries = sorted(p for p in folder.iterdir() if not p.name.startswith("."))
    classes = [p for p in entries if p.is_dir()]
    loose = [str(p) for p in entries if p.is_file() and p.suffix.lower() in IMAGE_FILE_EXTENSIONS]
    if loose or not classes:
        found = f"images outside any class folder: {loose[:MAX_LISTED]}" if loose else "no class folders"
        raise ValueError(
            f"The {split} split of task {task!r} ({folder}) has {found}; expected image folders "
            f"{folder}/<class>/<image>, one folder per class."
        )
    images: dict[str, list[Path]] = {}
    others = [str(p) for p in entries if p.is_file() and p.suffix.lower() not in IMAGE_FILE_EXTENSIONS]
    for class_dir in classes:
        files = sorted(p for p in class_dir.rglob("*") if p.is_file() and not p.name.startswith("."))
        images[class_dir.name] = [p for p in files if p.suffix.lower() in IMAGE_FILE_EXTENSIONS]
        others += [str(p) for p in files if p.suffix.lower() not in IMAGE_FILE_EXTENSIONS]
    empty = [str(folder / name) for name, paths in images.items() if not paths]
    if len(empty) == len(images):
        raise ValueError(
            f"The {split} split of task {task!r} has no usable rows ({folder}: no images in {empty})."
        )
    if empty:
        raise ValueError(f"Class folders with no images in the {split} split of task {task!r}: {empty}")
    names = sorted(images) if label_names is None else list(label_names)
    unknown = sorted(set(images) - set(names))
    if unknown:
        raise ValueError(
            f"The {split} split of task {task!r} ({folder}) has classes that training does not have: {unknown} "
            f"(training classes: {names})."
        )
    if others:
        logger.warning(
            "Left out %d files of %s that are not images by their extension: %s", len(others), folder, others
        )
    paths = [str(path) for name in images for path in images[name]]
    labels = [names.index(name) for name in images for _ in images[name]]
    features = Features({"image": Image(), "label": ClassLabel(names=names)})
    return ImageSplit(
        Dataset.from_dict({"image": paths, "label": labels}, features=features),
        str(folder),
        paths.__getitem__,
    )


# --------------------------------------------------------------------------- sources -> raw splits


def _read_source(
    source: ImageDatasetSource, task: str, cache_dir: str | None, token: Any
) -> tuple[dict[str, ImageSplit], str]:
    """Read every split a source holds: (split name -> ImageSplit, a one-line description of the source)."""
    if source.train_dir is not None:
        splits = {"train": read_image_folder(source.train_dir, "train", task)}
        if source.validation_dir is not None:
            names = splits["train"].dataset.features["label"].names
            splits["validation"] = read_image_folder(source.validation_dir, "validation", task, names)
        return splits, "image folders " + ", ".join(
            f"{split.where} ({name})" for name, split in splits.items()
        )
    if source.dataset_name is None:
        files = source.data_files or {"train": source.train_file}
        if source.validation_file is not None:
            files = {"train": source.train_file, "validation": source.validation_file}
        return _read_local_files(files, Path.cwd()), "local files " + _describe_files(files)
    path = Path(source.dataset_name).expanduser()
    if path.exists():
        return _read_local_dataset(path, source, task)
    if source.dataset_name.startswith(("/", "./", "../", "~")) or path.suffix in DATA_FILE_EXTENSIONS:
        raise FileNotFoundError(
            f"No such local dataset folder or file: {path} (dataset_name of task {task!r})."
        )
    return _read_hub(source, cache_dir, token)


def _describe_files(files: str | list[str] | dict[str, str | list[str]]) -> str:
    """``a.parquet (train), b.parquet (validation)`` for ``data_files``."""
    files = files if isinstance(files, dict) else {"train": files}
    return ", ".join(f"{value} ({split})" for split, value in files.items())


def _read_local_files(
    files: str | list[str] | dict[str, str | list[str]], base: Path
) -> dict[str, ImageSplit]:
    """``data_files`` (patterns or files per split, relative to ``base``) read as local Parquet or Arrow."""
    files = files if isinstance(files, dict) else {"train": files}
    splits = {}
    for split, patterns in files.items():
        patterns = [patterns] if isinstance(patterns, (str, os.PathLike)) else list(patterns)
        paths = []
        for pattern in patterns:
            full = Path(pattern).expanduser()
            full = full if full.is_absolute() else base / full
            matches = sorted(glob.glob(str(full), recursive=True))
            if not matches:
                raise FileNotFoundError(f"No file matches {full} (data_files of the {split} split).")
            paths += matches
        splits[split] = read_data_files(paths)
    return splits


def _read_local_dataset(
    path: Path, source: ImageDatasetSource, task: str
) -> tuple[dict[str, ImageSplit], str]:
    """A local ``dataset_name``: one file, a ``save_to_disk`` folder, or a folder of split files or image folders."""
    if path.is_file():
        return {"train": read_data_files([path])}, f"local file {path}"
    if source.data_files is not None:
        return _read_local_files(
            source.data_files, path
        ), f"local files {_describe_files(source.data_files)} of {path}"
    if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
        saved = load_from_disk(str(path))
        saved = saved if isinstance(saved, DatasetDict) else DatasetDict({"train": saved})
        return {
            name: ImageSplit(ds, f"{path} ({name})") for name, ds in saved.items()
        }, f"saved dataset {path}"
    splits = {}
    validation_names = [source.validation_split] if source.validation_split else VALIDATION_SPLIT_NAMES
    for split in dict.fromkeys([source.train_split, *validation_names]):
        files = find_split_files(path, split)
        if files:
            splits[split] = read_data_files(files)
        elif has_image_folder(path / split):
            label = splits[source.train_split].dataset.features.get("label") if splits else None
            names = (
                label.names if isinstance(label, ClassLabel) else None
            )  # validation folders: train's classes
            splits[split] = read_image_folder(path / split, split, task, names)
        if split != source.train_split and split in splits:
            break  # the first validation split found
    if source.train_split not in splits:
        raise FileNotFoundError(
            f"No {source.train_split} split for task {task!r} in {path}: expected "
            f"{path / (source.train_split + '.parquet')} (or -*.parquet, data/<split>-*.parquet, <split>/*.parquet, "
            f"the same in .arrow), a folder written by save_to_disk, or image folders "
            f"{path / source.train_split}/<class>/<image>; for a folder of class folders, use train_dir."
        )
    return splits, f"local folder {path} (splits {', '.join(splits)})"


def _read_hub(
    source: ImageDatasetSource, cache_dir: str | None, token: Any
) -> tuple[dict[str, ImageSplit], str]:
    """A Hub dataset through ``datasets.load_dataset``: every split it has (only ``data_files`` when given)."""
    kwargs: dict[str, Any] = {"cache_dir": cache_dir, "token": token}
    if source.data_files is not None:
        kwargs["data_files"] = source.data_files
    loaded = load_dataset(source.dataset_name, source.dataset_config_name, **kwargs)
    if not isinstance(loaded, DatasetDict):
        loaded = DatasetDict({"train": loaded})
    where = source.dataset_name + (
        f" (config {source.dataset_config_name})" if source.dataset_config_name else ""
    )
    splits = {name: ImageSplit(ds, f"{where} {name}") for name, ds in loaded.items()}
    return splits, f"Hub dataset {where}"


def _choose_splits(
    splits: dict[str, ImageSplit], source: ImageDatasetSource, task: str
) -> tuple[ImageSplit, ImageSplit | None]:
    """The train split and the validation split (None: to be split off the train rows) of a source."""
    if source.train_split not in splits:
        raise ValueError(
            f"No split {source.train_split!r} (train_split) in task {task!r}; its splits are {list(splits)}."
        )
    if source.validation_split is not None:
        if source.validation_split not in splits:
            raise ValueError(
                f"No split {source.validation_split!r} (validation_split) in task {task!r}; its splits are "
                f"{list(splits)}."
            )
        return splits[source.train_split], splits[source.validation_split]
    for name in VALIDATION_SPLIT_NAMES:
        if name in splits and name != source.train_split:
            return splits[source.train_split], splits[name]
    return splits[source.train_split], None


def select_columns(
    split: ImageSplit, image_column: str, label_column: str, task: str, split_name: str
) -> ImageSplit:
    """Keep the image and label columns, renamed ``image`` and ``label``, the images as a ``datasets.Image``."""
    ds = split.dataset
    for option, column in (("image_column_name", image_column), ("label_column_name", label_column)):
        if column not in ds.column_names:
            raise ValueError(
                f"--{option} {column!r} not found in the {split_name} split of task {task!r} ({split.where}); "
                f"its columns are {ds.column_names}. Set --{option} to one of them."
            )
    ds = ds.select_columns([image_column, label_column])
    ds = ds.rename_columns({image_column: "__image", label_column: "__label"})
    ds = ds.rename_columns({"__image": "image", "__label": "label"})
    if not isinstance(ds.features["image"], Image):
        feature = ds.features["image"]
        try:
            ds = ds.cast_column("image", Image())
        except (TypeError, ValueError, pa.ArrowException):
            raise ValueError(
                f"The image column {image_column!r} of the {split_name} split of task {task!r} ({split.where}) "
                f"holds {feature}: expected images (a datasets Image feature, image bytes or file paths)."
            ) from None
    return ImageSplit(ds, split.where, split.origin, split.rows)


def label_ids(ds: Dataset) -> np.ndarray:
    """The ``label`` column of ``ds`` (its selected rows) as int64, read through Arrow."""
    values = ds.select_columns(["label"]).with_format("arrow")[:]["label"]
    return values.to_numpy(zero_copy_only=False).astype(np.int64)


def _label_error(split: ImageSplit, rows: np.ndarray, what: str, task: str, split_name: str) -> ValueError:
    """An error naming (the first of) the rows of a split whose labels are ``what``."""
    named = ", ".join(split.name_row(int(row)) for row in rows[:MAX_LISTED])
    more = f" and {len(rows) - MAX_LISTED} more" if len(rows) > MAX_LISTED else ""
    return ValueError(f"{len(rows)} rows of the {split_name} split of task {task!r} {what}: {named}{more}")


def encode_labels(
    split: ImageSplit, task: str, split_name: str, label_names: Sequence[str] | None = None
) -> tuple[ImageSplit, list[str]]:
    """The split with its labels as a ``ClassLabel``; its label names (or, given, ``label_names``, matched by name).

    A ``ClassLabel`` keeps its names; string or integer labels are encoded (names sorted, logged). A label outside
    the class label, a missing one, or a class ``label_names`` does not have is refused, naming the rows or classes.
    """
    ds, feature = split.dataset, split.dataset.features["label"]
    values = ds.select_columns(["label"]).with_format("arrow")[:]["label"]
    values = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    if values.null_count:
        missing = np.flatnonzero(np.asarray(values.is_null(), dtype=bool))
        raise _label_error(split, missing, "have no label", task, split_name)
    if isinstance(feature, ClassLabel):
        ids = values.to_numpy(zero_copy_only=False).astype(np.int64)
        outside = np.flatnonzero((ids < 0) | (ids >= feature.num_classes))
        if len(outside):
            what = f"have labels outside 0..{feature.num_classes - 1} of their class label (-1: no label)"
            raise _label_error(split, outside, what, task, split_name)
        if label_names is None or list(feature.names) == list(label_names):
            return split, list(feature.names)
        classes = np.asarray(feature.names, dtype=object)[ids]
    elif isinstance(feature, Value) and (
        pa.types.is_integer(values.type)
        or pa.types.is_string(values.type)
        or pa.types.is_large_string(values.type)
    ):
        classes = np.asarray(values.to_pylist(), dtype=object)
        if label_names is None:
            unique = sorted(set(classes.tolist()))
            label_names = [str(value) for value in unique]
            logger.info(
                "Task %r: label column of %s holds %s values, encoded as a class label of %d classes (sorted): %s",
                task,
                split.where,
                feature.dtype,
                len(label_names),
                label_names,
            )
        classes = np.asarray([str(value) for value in classes.tolist()], dtype=object)
    else:
        raise ValueError(
            f"The label column of the {split_name} split of task {task!r} ({split.where}) holds {feature}: expected "
            "a class label (a datasets ClassLabel, or integer or string classes)."
        )
    return _relabel(split, classes, list(label_names), task, split_name)


def _relabel(
    split: ImageSplit, classes: np.ndarray, names: list[str], task: str, split_name: str
) -> tuple[ImageSplit, list[str]]:
    """Replace the label column by the index of each row's class name in ``names``; refuse names not there."""
    index = {name: i for i, name in enumerate(names)}
    unknown = sorted(set(classes.tolist()) - set(index))
    if unknown:
        raise ValueError(
            f"The {split_name} split of task {task!r} ({split.where}) has classes that training does not have: "
            f"{unknown} (training classes: {names})."
        )
    ids = np.asarray([index[name] for name in classes.tolist()], dtype=np.int64)
    ds = split.dataset.remove_columns("label").add_column("label", ids, feature=ClassLabel(names=names))
    return ImageSplit(ds, split.where, split.origin, split.rows), names


def split_off_validation(
    split: ImageSplit, fraction: float, seed: int, task: str
) -> tuple[ImageSplit, ImageSplit]:
    """Split ``fraction`` of the rows off for validation, stratified by class and seeded.

    Each class gives its share, rounded so that the validation split has ``ceil(fraction * rows)`` rows; a class
    with a single row stays in training (logged).
    """
    labels = label_ids(split.dataset)
    rng = _rng(seed, task, "train_val_split")
    classes, counts = np.unique(labels, return_counts=True)
    target = math.ceil(fraction * len(labels))
    share = np.minimum(np.floor(fraction * counts), counts - 1).astype(np.int64)
    room = np.flatnonzero(share < counts - 1)
    remainder = fraction * counts - np.floor(fraction * counts)
    order = room[np.lexsort((rng.random(len(room)), -remainder[room]))]
    share[order[: max(0, target - int(share.sum()))]] += 1
    if share.sum() == 0 or share.sum() == len(labels):
        raise ValueError(
            f"Task {task!r} has no validation split and its {len(labels)} train rows ({split.where}) cannot give "
            f"{fraction:.0%} of them to one (each class needs 2 rows); give a validation split."
        )
    single = [split.dataset.features["label"].names[c] for c in classes[counts == 1]]
    if single:
        logger.info("Task %r: classes with one row stay in training: %s", task, single)
    validation = np.sort(
        np.concatenate(
            [
                rng.choice(np.flatnonzero(labels == c), size=k, replace=False)
                for c, k in zip(classes, share, strict=True)
            ]
        )
    )
    train = np.setdiff1d(np.arange(len(labels)), validation)
    where = f"{split.where}, {fraction:.0%} split off for validation"
    return (
        ImageSplit(split.dataset, split.where, split.origin, train),
        ImageSplit(split.dataset, where, split.origin, validation),
    )


# --------------------------------------------------------------------------- sampling, image checks, merging


def _rng(seed: int, task: str, split: str) -> np.random.Generator:
    """A generator seeded by the global seed, the task and the split."""
    return np.random.default_rng([seed, zlib.crc32(task.encode()), zlib.crc32(split.encode())])


def sample_indices(num_rows: int, max_samples: int | None, rng: np.random.Generator) -> np.ndarray | None:
    """At most ``max_samples`` sorted random row indices, or None to keep every row."""
    if max_samples is None or max_samples >= num_rows:
        return None
    return np.sort(rng.choice(num_rows, size=max_samples, replace=False))


def _inspect_image(value: dict[str, Any] | None) -> tuple[str | None, str | None, tuple[int, int] | None]:
    """(why it cannot be used or None, mode, (width, height)) of an undecoded ``datasets.Image`` value."""
    if value is None or not (value.get("bytes") or value.get("path")):
        return "no image (an empty cell)", None, None
    try:
        source = io.BytesIO(value["bytes"]) if value.get("bytes") else value["path"]
        with PIL.Image.open(source) as image:
            image.load()  # decodes every pixel: a truncated file fails here, not at open
            mode, size = image.mode, image.size
    except PIL.UnidentifiedImageError:
        return "not an image PIL can identify (unknown format, or a truncated header)", None, None
    except Exception as error:  # noqa: BLE001 - any decoder failure makes the file unusable
        return f"{type(error).__name__}: {error}", None, None
    if size[0] == 0 or size[1] == 0:
        return f"an empty image ({size[0]}x{size[1]})", mode, size
    return None, mode, size


def inspect_images(
    ds: Dataset, description: str
) -> list[tuple[str | None, str | None, tuple[int, int] | None]]:
    """Decode every image of ``ds`` once, in threads, with a progress bar: per row, (error, mode, size)."""
    undecoded = ds.select_columns(["image"]).cast_column("image", Image(decode=False))
    results: list[tuple[str | None, str | None, tuple[int, int] | None]] = []
    with (
        ThreadPoolExecutor(min(8, os.cpu_count() or 1)) as pool,
        tqdm(total=len(ds), desc=f"Checking the images of {description}", unit="img") as bar,
    ):
        for start in range(0, len(ds), 8192):  # a block at a time: the undecoded bytes of a block in memory
            values = undecoded[start : start + 8192]["image"]
            chunks = [values[i : i + 256] for i in range(0, len(values), 256)]
            for inspected in pool.map(lambda chunk: [_inspect_image(value) for value in chunk], chunks):
                results.extend(inspected)
                bar.update(len(inspected))
    return results


def _by_area(size: tuple[int, int]) -> tuple[int, tuple[int, int]]:
    """Sort key of an image size (width, height): its area, then the size."""
    return size[0] * size[1], size


@dataclass
class SplitReport:
    """What the image check found in the kept rows of one split: their number, modes, smallest and largest size."""

    num_rows: int = 0
    modes: Counter = field(default_factory=Counter)
    smallest: tuple[int, int] | None = None
    largest: tuple[int, int] | None = None

    @classmethod
    def of(cls, modes: list[str], sizes: list[tuple[int, int]]) -> SplitReport:
        """The report of the kept images' modes and sizes."""
        if not sizes:
            return cls()
        return cls(len(sizes), Counter(modes), min(sizes, key=_by_area), max(sizes, key=_by_area))

    def __add__(self, other: SplitReport) -> SplitReport:
        sizes = [size for size in (self.smallest, self.largest, other.smallest, other.largest) if size]
        return SplitReport(
            self.num_rows + other.num_rows,
            self.modes + other.modes,
            min(sizes, key=_by_area) if sizes else None,
            max(sizes, key=_by_area) if sizes else None,
        )


def check_images(
    split: ImageSplit,
    ds: Dataset,
    rows: np.ndarray | None,
    description: str,
    skip: bool,
    min_image_size: int | None,
) -> tuple[Dataset, SplitReport]:
    """Check that every image of ``ds`` (rows ``rows`` of the split) decodes and is at least ``min_image_size``.

    Every bad image is named; then refused (default) or, with ``skip``, left out with a warning.
    """
    inspected = inspect_images(ds, description)
    errors = [error for error, _, _ in inspected]
    if min_image_size is not None:
        for position, (error, _, size) in enumerate(inspected):
            if error is None and min(size) < min_image_size:
                errors[position] = f"{size[0]}x{size[1]} pixels, smaller than min_image_size {min_image_size}"
    bad = [position for position, error in enumerate(errors) if error is not None]
    if bad:
        names = [split.name_row(int(rows[p]) if rows is not None else p) for p in bad]
        listing = "\n".join(f"  {name}: {errors[p]}" for name, p in zip(names, bad, strict=True))
        if not skip:
            raise ValueError(
                f"{len(bad)} of the {len(ds)} images of {description} cannot be used:\n{listing}\nFix or remove "
                "them, or pass skip_bad_images=True (--skip_bad_images in the example scripts) to leave them out."
            )
        logger.warning(
            "Skipped %d of the %d images of %s (cannot be used):\n%s", len(bad), len(ds), description, listing
        )
        ds = ds.select(np.setdiff1d(np.arange(len(ds)), np.asarray(bad)), keep_in_memory=True)
    kept = [(mode, size) for (_, mode, size), error in zip(inspected, errors, strict=True) if error is None]
    report = SplitReport.of([mode for mode, _ in kept], [size for _, size in kept])
    return ds, report


def _finish_split(
    task: TaskSplits,
    split_name: str,
    max_samples: int | None,
    seed: int,
    skip: bool,
    min_image_size: int | None,
) -> tuple[Dataset, SplitReport]:
    """Sample the rows of one split of one task, then check their images; refuse a split left without rows."""
    split = task.splits[split_name]
    num_rows = len(split.rows) if split.rows is not None else len(split.dataset)
    picked = sample_indices(num_rows, max_samples, _rng(seed, task.name, split_name))
    rows = split.rows if picked is None else (picked if split.rows is None else split.rows[picked])
    # Row indices in memory: no cache file written beside the data (a user's folder may be read-only).
    ds = split.dataset if rows is None else split.dataset.select(rows, keep_in_memory=True)
    check_not_empty(ds, task.name, split_name, split.where)
    description = f"the {split_name} split of task {task.name!r} ({split.where})"
    ds, report = check_images(split, ds, rows, description, skip, min_image_size)
    check_not_empty(ds, task.name, split_name, split.where)
    return ds, report


def _with_task_ids(tasks: list[TaskSplits]) -> list[TaskSplits]:
    """Add ``task_id`` to every task's datasets (before any row selection: a selection would copy the images).

    ``label`` stays a ``ClassLabel`` when every task has the same label names, else becomes int64.
    """
    task_feature = ClassLabel(names=[task.name for task in tasks])
    shared_labels = all(task.label_names == tasks[0].label_names for task in tasks)
    out = []
    for task_id, task in enumerate(tasks):
        done: dict[int, Dataset] = {}
        splits = {}
        for name, split in task.splits.items():
            # A validation split taken from the train rows shares their dataset: one task_id column for both.
            if id(split.dataset) not in done:
                ds = split.dataset
                if not shared_labels:  # a new column, not cast_column: that would rewrite every row
                    labels = label_ids(ds)
                    ds = ds.remove_columns("label").add_column("label", labels, feature=Value("int64"))
                task_ids = np.full(len(ds), task_id, dtype=np.int64)
                done[id(split.dataset)] = ds.add_column("task_id", task_ids, feature=task_feature)
            splits[name] = ImageSplit(done[id(split.dataset)], split.where, split.origin, split.rows)
        out.append(TaskSplits(task.name, task.label_names, splits, task.source))
    return out


def assemble_tasks(
    tasks: list[TaskSplits],
    max_samples: dict[str, int | None],
    seed: int = 42,
    skip_bad_images: bool = False,
    min_image_size: int | None = None,
    shuffle: Sequence[str] = ("train",),
) -> tuple[DatasetDict, list[dict[str, SplitReport]]]:
    """Tasks -> one ``DatasetDict`` (one split per key of ``max_samples``) with ``image``, ``label``, ``task_id``.

    Each task's rows of a split are sampled (at most ``max_samples[split]``, kept in order) and their images
    checked; the tasks follow each other, and the splits named in ``shuffle`` are then shuffled with ``seed``.
    Returns the datasets and, per task, each split's :class:`SplitReport`.
    """
    tasks = _with_task_ids(tasks)
    reports: list[dict[str, SplitReport]] = [{} for _ in tasks]
    out = {}
    for split_name, cap in max_samples.items():
        parts = []
        for task, report in zip(tasks, reports, strict=True):
            ds, report[split_name] = _finish_split(
                task, split_name, cap, seed, skip_bad_images, min_image_size
            )
            parts.append(ds)
        merged = parts[0] if len(parts) == 1 else concatenate_datasets(parts)
        out[split_name] = merged.shuffle(seed=seed, keep_in_memory=True) if split_name in shuffle else merged
    _log_modes(tasks, reports)
    return DatasetDict(out), reports


def _log_modes(tasks: list[TaskSplits], reports: list[dict[str, SplitReport]]) -> None:
    """Log once when the images are of several modes (gray and RGB): how many of which, per task."""
    modes = [sum(report.values(), SplitReport()).modes for report in reports]
    if len(set().union(*modes)) < 2:
        return
    listing = "; ".join(
        f"{task.name}: " + ", ".join(f"{count} {mode}" for mode, count in sorted(counts.items()))
        for task, counts in zip(tasks, modes, strict=True)
    )
    log = logger.warning if any(len(counts) > 1 for counts in modes) else logger.info
    log(
        "The images are of several modes (the processor converts each to its number of channels): %s", listing
    )


# --------------------------------------------------------------------------- public API


def _prepare_task(
    source: ImageDatasetSource,
    name: str,
    train_val_split: float | None,
    seed: int,
    cache_dir: str | None,
    token: Any,
) -> TaskSplits:
    """Read one source into its train and validation splits with ``image`` and ``ClassLabel`` ``label`` columns."""
    splits, description = _read_source(source, name, cache_dir, token)
    train, validation = _choose_splits(splits, source, name)
    columns = (source.image_column_name, source.label_column_name)
    train = select_columns(train, *columns, name, "train")
    train, label_names = encode_labels(train, name, "train")
    if validation is not None:
        validation = select_columns(validation, *columns, name, "validation")
        validation, _ = encode_labels(validation, name, "validation", label_names)
    elif train_val_split:
        train, validation = split_off_validation(train, train_val_split, seed, name)
        description += f", {train_val_split:.0%} of train split off for validation"
    else:
        raise ValueError(
            f"Task {name!r} ({description}) has no validation split (looked for {list(VALIDATION_SPLIT_NAMES)}): "
            "give one (validation_dir, validation_file, validation_split) or a train_val_split above 0."
        )
    return TaskSplits(name, label_names, {"train": train, "validation": validation}, description)


def load_image_tasks(
    sources: ImageDatasetSource | Sequence[ImageDatasetSource],
    train_val_split: float | None = 0.15,
    max_train_samples: int | None = None,
    max_eval_samples: int | None = None,
    seed: int = 42,
    skip_bad_images: bool = False,
    min_image_size: int | None = None,
    cache_dir: str | None = None,
    token: str | bool | None = None,
) -> tuple[DatasetDict, list[ImageTask]]:
    """Load image-classification datasets, one task each, into one ``DatasetDict(train, validation)``.

    Rows have ``image``, ``label`` (the class index within the row's task) and ``task_id``; the returned
    :class:`ImageTask` list (in the order of ``sources``) holds each task's label names and counts. ``cache_dir``
    and ``token`` go to ``datasets.load_dataset`` for Hub datasets. See the module docstring for the rest.
    """
    sources = [sources] if isinstance(sources, ImageDatasetSource) else list(sources)
    if not sources or not all(isinstance(source, ImageDatasetSource) for source in sources):
        raise ValueError(f"sources must be one or more ImageDatasetSource, got {sources!r}.")
    check_max_samples(max_train_samples, "max_train_samples", "train")
    check_max_samples(max_eval_samples, "max_eval_samples", "validation")
    _check_options(train_val_split, min_image_size)
    names = [source.task_name for source in sources]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"Several datasets have the task name(s) {repeated}: give each a distinct name.")
    prepared = [
        _prepare_task(source, name, train_val_split, seed, cache_dir, token)
        for source, name in zip(sources, names, strict=True)
    ]
    caps = {"train": max_train_samples, "validation": max_eval_samples}
    dataset, reports = assemble_tasks(prepared, caps, seed, skip_bad_images, min_image_size)
    tasks = []
    for task, report in zip(prepared, reports, strict=True):
        both = report["train"] + report["validation"]
        sizes = (both.smallest, both.largest) if both.smallest else None
        counts = (report["train"].num_rows, report["validation"].num_rows)
        tasks.append(ImageTask(task.name, task.label_names, *counts, task.source, dict(both.modes), sizes))
        _log_task(tasks[-1])
    return dataset, tasks


def _log_task(task: ImageTask) -> None:
    """One line per task: its classes, rows, image sizes and modes, and where it was read from."""
    sizes = task.image_sizes
    shown = (
        ""
        if sizes is None
        else f"{sizes[0][0]}x{sizes[0][1]}"
        + ("" if sizes[0] == sizes[1] else f" to {sizes[1][0]}x{sizes[1][1]}")
    )
    logger.info(
        "Task %r: %d classes %s, %d train / %d validation images (%s; %s) from %s",
        task.name,
        task.num_labels,
        task.label_names,
        task.num_train,
        task.num_eval,
        shown,
        ", ".join(f"{count} {mode}" for mode, count in sorted(task.image_modes.items())),
        task.source,
    )


@dataclass
class ImageClassificationTransform:
    """Dataset transform: images -> the processor's (C, H, W) float arrays, labels and the model's task ids.

    The task id is ``task_id`` for every sample if given, else the row's ``task_id`` mapped through
    ``model_task_ids`` (a saved model evaluated on some of its tasks, or in another order). It draws no random
    numbers: it runs in DataLoader workers, whose random state a checkpoint does not keep, so augmentation happens on
    the batch in the training step. A class at module level, not a closure, so that workers started by spawn or
    forkserver can unpickle it.
    """

    processor: Any  # an image processor called with do_patchify=False (NeuralInterpreterImageProcessor)
    model_task_ids: list[int] | None = None
    task_id: int | None = None

    def __call__(self, batch: dict[str, list[Any]]) -> dict[str, Any]:
        pixel_values = self.processor(images=batch["image"], do_patchify=False)["pixel_values"]
        if self.task_id is not None:
            task_ids = [self.task_id] * len(batch["label"])
        else:
            task_ids = [int(task_id) for task_id in batch["task_id"]]
            if self.model_task_ids is not None:
                task_ids = [self.model_task_ids[task_id] for task_id in task_ids]
        return {
            "pixel_values": [np.asarray(image, dtype=np.float32) for image in pixel_values],
            "labels": [int(label) for label in batch["label"]],
            "task_ids": task_ids,
        }


__all__ = [
    "IMAGE_FILE_EXTENSIONS",
    "ImageClassificationTransform",
    "ImageDatasetSource",
    "ImageSplit",
    "ImageTask",
    "TaskSplits",
    "assemble_tasks",
    "encode_labels",
    "load_image_tasks",
    "read_data_files",
    "read_image_folder",
    "select_columns",
    "split_off_validation",
]
