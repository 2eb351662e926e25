"""Digit datasets for multi-task training (MNIST, MNIST-M, SVHN, ...), each sample tagged with its task.

The Neural Interpreters paper trains one model jointly on MNIST, MNIST-M and SVHN
(cropped digits) and adapts it to new tasks such as K-MNIST (Sec. 4.2). This module names
those tasks, their Hub datasets and local folders, and their digit labels; reading files,
checking images and merging tasks is :mod:`ni_hf.data.images`'s. :func:`load_digits_tasks`
loads any subset of these tasks and returns a ``DatasetDict`` with ``train`` and
``test`` splits whose rows are::

    image    PIL image (``datasets.Image`` feature; mode and size differ per task:
             MNIST 28x28 "L", MNIST-M and SVHN 32x32 "RGB", sklearn digits 8x8 "L")
    label    int, ``ClassLabel`` with names "0".."9" (every task here has 10 classes)
    task_id  int, index of the sample's task in the returned task-name list
             (``ClassLabel`` whose names are those task names)

Three sources:

``"hub"`` (default)
    The Hugging Face Hub (needs network; cached by ``datasets`` under
    ``$HF_HOME/datasets``). Datasets used (see :data:`HUB_DATASETS`), as found on the
    Hub dataset pages and cards (huggingface.co/datasets/<id>) and in public code
    that loads them:

    - ``mnist``: ``ylecun/mnist``, config ``mnist``; columns ``image``, ``label``;
      splits train (60000) / test (10000); 28x28 gray.
    - ``mnistm``: ``Mike0307/MNIST-M``, default config; columns ``image``, ``label``;
      splits train (59001) / test (9001); 32x32 RGB.
    - ``svhn``: ``ufldl-stanford/svhn``, config ``cropped_digits``; columns ``image``,
      ``label``; splits train (73257) / test (26032) / extra (531131, unused); 32x32 RGB.
    - ``kmnist`` (adaptation): ``tanganke/kmnist``, config ``kmnist``; columns ``image``,
      ``label``; splits train (60000) / test (10000); 28x28 gray.
    - ``fashion_mnist`` (adaptation): ``zalando-datasets/fashion_mnist``, config
      ``fashion_mnist``; columns ``image``, ``label``; splits train (60000) / test (10000).

    All are Parquet datasets (no loading script). ``Mike0307/MNIST-M`` is the MNIST-M
    copy used by Flower's ``flwr-datasets`` (Ganin & Lempitsky's 59001/9001 release,
    32x32 RGB). SVHN is read through ``data_files`` of its ``cropped_digits`` config so
    that only the requested split is downloaded, not the 531k-image ``extra`` split
    (falling back to the whole config if those files are not found). SVHN's raw
    label 10 for digit 0 is mapped to 0 if it ever appears.

``"local"``
    A ``data_dir`` laid out like the Hub Parquet exports: ``<data_dir>/<folder>/train.parquet``
    and ``test.parquet`` with columns ``image`` (Image feature, PNG bytes) and ``label``
    (ClassLabel). Also accepted per split: ``<split>-*.parquet``, ``data/<split>-*.parquet``,
    ``<split>/*.parquet``, the same in ``.arrow``, or image folders ``<folder>/<split>/<label>/*.png``.
    Folder names: see :data:`LOCAL_FOLDER_NAMES`
    (``mnistm`` is looked up as ``mnist_m`` first); any other task name is used as the
    folder name itself. Parquet files are read with ``pyarrow`` straight into memory (no
    cache files; MNIST-M's 118 MB train file takes about a second). Image folders must be named
    by their digit, ``0``..``9``: that digit is the label, in every split (a folder named
    otherwise is refused, with its path).

``"sklearn"``
    scikit-learn's bundled 8x8 digits (1797 images, gray levels 0..16 rescaled to
    0..255), fully offline: one task, ``sklearn_digits``, with a fixed stratified 80/20
    train/test split (1437/360; seed :data:`SKLEARN_SPLIT_SEED`, independent of ``seed``).

Task names are canonicalised (``"mnist_m"``, ``"MNIST-M"`` -> ``"mnistm"``; see
:data:`TASK_ALIASES`) and the returned task-name list holds the canonical names.
``max_train_samples``/``max_eval_samples`` apply per task: each task contributes at
most that many rows, drawn at random (seeded by ``seed`` and the task name) and kept
in their original order. The train split is then shuffled with ``seed``; the test
split is not shuffled (tasks follow each other in the requested order). Every loaded
image, from any source, is decoded once (in threads, with a progress bar); files that
cannot be decoded are named and refused, or with ``skip_bad_images=True`` left out with
a warning that counts and names them. A split without rows, or ``max_*_samples=0``, is
refused naming the split.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import NamedTuple

import numpy as np
from datasets import ClassLabel, Dataset, DatasetDict, Features, Image, load_dataset

from .images import (
    ImageClassificationTransform,
    ImageSplit,
    TaskSplits,
    assemble_tasks,
    check_max_samples,
    find_split_files,
    has_image_folder,
    label_ids,
    read_data_files,
    read_image_folder,
    select_columns,
)

SPLITS: tuple[str, str] = ("train", "test")
SOURCES: tuple[str, ...] = ("hub", "local", "sklearn")
NUM_CLASSES = 10
DIGIT_CLASS_NAMES: list[str] = [str(i) for i in range(NUM_CLASSES)]
SKLEARN_TASK = "sklearn_digits"
SKLEARN_TEST_SIZE = 0.2
SKLEARN_SPLIT_SEED = 0
IMAGE_COLUMN_CANDIDATES: tuple[str, ...] = ("image", "img", "png")
LABEL_COLUMN_CANDIDATES: tuple[str, ...] = ("label", "labels", "digit", "cls")


class HubDatasetSpec(NamedTuple):
    """Where a task lives on the Hugging Face Hub and how its columns are named."""

    repo_id: str
    config: str | None
    image_column: str
    label_column: str
    splits: dict[str, str]
    data_files: dict[str, str] | None = None


HUB_DATASETS: dict[str, HubDatasetSpec] = {
    "mnist": HubDatasetSpec("ylecun/mnist", "mnist", "image", "label", {"train": "train", "test": "test"}),
    "mnistm": HubDatasetSpec("Mike0307/MNIST-M", None, "image", "label", {"train": "train", "test": "test"}),
    "svhn": HubDatasetSpec(
        "ufldl-stanford/svhn",
        "cropped_digits",
        "image",
        "label",
        {"train": "train", "test": "test"},
        data_files={"train": "cropped_digits/train-*.parquet", "test": "cropped_digits/test-*.parquet"},
    ),
    "kmnist": HubDatasetSpec(
        "tanganke/kmnist", "kmnist", "image", "label", {"train": "train", "test": "test"}
    ),
    "fashion_mnist": HubDatasetSpec(
        "zalando-datasets/fashion_mnist",
        "fashion_mnist",
        "image",
        "label",
        {"train": "train", "test": "test"},
    ),
}

PAPER_TASKS: list[str] = ["mnist", "mnistm", "svhn"]

TASK_ALIASES: dict[str, str] = {
    "mnist_m": "mnistm",
    "mnist-m": "mnistm",
    "svhn_cropped": "svhn",
    "svhn_cropped_digits": "svhn",
    "k-mnist": "kmnist",
    "k_mnist": "kmnist",
    "fashion-mnist": "fashion_mnist",
    "fashionmnist": "fashion_mnist",
    "fmnist": "fashion_mnist",
    "digits": SKLEARN_TASK,
    "sklearn": SKLEARN_TASK,
    "sklearn-digits": SKLEARN_TASK,
}

LOCAL_FOLDER_NAMES: dict[str, tuple[str, ...]] = {
    "mnist": ("mnist",),
    "mnistm": ("mnist_m", "mnistm", "mnist-m"),
    "svhn": ("svhn", "svhn_cropped"),
    "kmnist": ("kmnist",),
    "fashion_mnist": ("fashion_mnist", "fashion-mnist"),
}


def resolve_dataset_source(dataset_source: str | None, data_dir: str | Path | None) -> str:
    """--dataset_source, or "local" when only --data_dir is given, else "hub"; --data_dir only goes with "local"."""
    if data_dir is not None and dataset_source not in (None, "local"):
        raise ValueError(
            f"--data_dir only applies to --dataset_source local (which it selects when --dataset_source is not "
            f"given); got --dataset_source {dataset_source} with --data_dir {data_dir}."
        )
    source = "local" if dataset_source is None and data_dir is not None else dataset_source or "hub"
    if dataset_source == "":
        raise ValueError(f"--dataset_source must be one of {list(SOURCES)}, got an empty string.")
    if source == "local" and data_dir is None:
        raise ValueError(
            "--dataset_source local needs --data_dir (a folder holding <task>/train.parquet, ...)."
        )
    _check_source(source)
    return source


def canonical_task_name(name: str) -> str:
    """Map a task name or alias (case-insensitive) to its canonical name."""
    key = name.strip().lower()
    if key in TASK_ALIASES:
        return TASK_ALIASES[key]
    if key in HUB_DATASETS or key in LOCAL_FOLDER_NAMES or key == SKLEARN_TASK:
        return key
    return name.strip()


def known_task_names(source: str = "hub") -> list[str]:
    """Return the canonical task names a source knows."""
    _check_source(source)
    if source == "sklearn":
        return [SKLEARN_TASK]
    if source == "local":
        return list(LOCAL_FOLDER_NAMES)
    return list(HUB_DATASETS)


def _check_source(source: str) -> None:
    """Raise a ValueError for an unknown source."""
    if source not in SOURCES:
        raise ValueError(f"Unknown digits data source {source!r}; expected one of {list(SOURCES)}")


def _resolve_task_names(task_names: list[str] | tuple[str, ...] | str, source: str) -> list[str]:
    """Canonicalise task names, reject duplicates and (except local) unknown ones."""
    if isinstance(task_names, str):
        task_names = [task_names]
    names = [canonical_task_name(name) for name in task_names]
    if not names:
        raise ValueError("task_names is empty; give at least one task")
    if len(set(names)) != len(names):
        raise ValueError(f"Duplicate tasks in {list(task_names)} (canonical names {names})")
    if source != "local":
        known = known_task_names(source)
        unknown = [name for name in task_names if canonical_task_name(name) not in known]
        if unknown:
            raise ValueError(
                f"Unknown task(s) {unknown} for source {source!r}; known tasks: {known} "
                f"(aliases: {sorted(TASK_ALIASES)})"
            )
    return names


def _find_column(columns: list[str], candidates: tuple[str, ...], what: str, where: str) -> str:
    """Return the first candidate column present, else raise."""
    for name in candidates:
        if name in columns:
            return name
    raise ValueError(
        f"No {what} column in {where}: columns are {columns}, expected one of {list(candidates)}"
    )


def _normalise(split: ImageSplit, image_column: str, label_column: str, task: str, name: str) -> ImageSplit:
    """Keep only ``image`` (Image) and ``label`` (ClassLabel "0".."9") columns, without rewriting images."""
    split = select_columns(split, image_column, label_column, task, name)
    ds, where = split.dataset, split.where
    labels = label_ids(ds)
    label_feature = ds.features["label"]
    if isinstance(label_feature, ClassLabel) and label_feature.names != DIGIT_CLASS_NAMES:
        if len(labels) and all(name.isdigit() for name in label_feature.names):
            # e.g. image folders named only "3" and "7": class index -> the digit its name spells
            labels = np.asarray([int(name) for name in label_feature.names], dtype=np.int64)[labels]
    if len(labels) and labels.min() >= 1 and labels.max() == NUM_CLASSES:
        labels = np.where(labels == NUM_CLASSES, 0, labels)  # SVHN's raw convention: digit 0 has label 10
    if len(labels) and (labels.min() < 0 or labels.max() >= NUM_CLASSES):
        raise ValueError(
            f"Labels in {where} span {labels.min()}..{labels.max()}; expected 0..{NUM_CLASSES - 1}"
        )
    ds = ds.remove_columns("label").add_column("label", labels, feature=ClassLabel(names=DIGIT_CLASS_NAMES))
    return ImageSplit(ds, where, split.origin)


# --------------------------------------------------------------------------- sklearn


@functools.lru_cache(maxsize=1)
def _sklearn_digits() -> DatasetDict:
    """Build scikit-learn's 8x8 digits as a DatasetDict with a fixed stratified split."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    images = np.clip(np.round(bunch.images * (255.0 / 16.0)), 0, 255).astype(np.uint8)
    targets = bunch.target.astype(np.int64)
    train_idx, test_idx = train_test_split(
        np.arange(len(targets)),
        test_size=SKLEARN_TEST_SIZE,
        random_state=SKLEARN_SPLIT_SEED,
        stratify=targets,
    )
    features = Features({"image": Image(), "label": ClassLabel(names=DIGIT_CLASS_NAMES)})
    out = {}
    for split, idx in (("train", np.sort(train_idx)), ("test", np.sort(test_idx))):
        out[split] = Dataset.from_dict(
            {"image": list(images[idx]), "label": targets[idx]}, features=features, split=split
        )
    return DatasetDict(out)


# --------------------------------------------------------------------------- hub


def _load_hub_split(task: str, split: str) -> ImageSplit:
    """Download (or reuse the cache of) one split of a Hub task and normalise its columns."""
    spec = HUB_DATASETS[task]
    hub_split = spec.splits[split]
    ds = None
    if spec.data_files is not None and split in spec.data_files:
        try:
            ds = load_dataset(spec.repo_id, data_files={hub_split: spec.data_files[split]}, split=hub_split)
        except FileNotFoundError:
            ds = None  # layout changed on the Hub: fall back to the whole config
    if ds is None:
        ds = load_dataset(spec.repo_id, spec.config, split=hub_split)
    where = f"{spec.repo_id} ({split})"
    return _normalise(ImageSplit(ds, where), spec.image_column, spec.label_column, task, split)


# --------------------------------------------------------------------------- local


def _local_task_dir(data_dir: str | Path, task: str) -> Path:
    """Return the folder of a task under ``data_dir`` or raise a FileNotFoundError that explains the layout."""
    root = Path(data_dir).expanduser()
    candidates = [root / folder for folder in LOCAL_FOLDER_NAMES.get(task, (task,))]
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    known = (
        "" if task in LOCAL_FOLDER_NAMES else f" ({task!r} is not a known task: {list(LOCAL_FOLDER_NAMES)})"
    )
    raise FileNotFoundError(
        f"No local data for task {task!r}{known}: expected a folder "
        f"{' or '.join(str(c) for c in candidates)} holding train.parquet and test.parquet "
        f"(columns image: Image, label: ClassLabel) or image folders train/<label>/*.png and test/<label>/*.png"
    )


def _check_class_folders(split_dir: Path) -> None:
    """Refuse class folders not named by a digit 0..9: the label is the digit the folder's name spells.

    Each split's class folders are numbered in sorted order, so a folder named `seven` would shift the labels of
    the folders sorted after it, differently in each split that lacks it.
    """
    folders = sorted(p for p in split_dir.iterdir() if p.is_dir() and not p.name.startswith("."))
    bad = [str(p) for p in folders if not (re.fullmatch(r"[0-9]+", p.name) and int(p.name) < NUM_CLASSES)]
    if bad:
        raise ValueError(
            f"Image folders must be named by their digit label, 0..{NUM_CLASSES - 1} (the label is the digit the "
            f"folder's name spells), got {bad}. Rename each to its class index."
        )


def _load_local_split(task: str, split: str, data_dir: str | Path) -> ImageSplit:
    """Read one split of a task from a local folder (Parquet or Arrow files, or image folders) and normalise it."""
    task_dir = _local_task_dir(data_dir, task)
    files = find_split_files(task_dir, split)
    if files:
        raw = read_data_files(files)
        image_column = _find_column(raw.dataset.column_names, IMAGE_COLUMN_CANDIDATES, "image", raw.where)
        label_column = _find_column(raw.dataset.column_names, LABEL_COLUMN_CANDIDATES, "label", raw.where)
        return _normalise(raw, image_column, label_column, task, split)
    if has_image_folder(task_dir / split):
        _check_class_folders(task_dir / split)
        return _normalise(read_image_folder(task_dir / split, split, task), "image", "label", task, split)
    raise FileNotFoundError(
        f"No {split} split for task {task!r} in {task_dir}: expected {task_dir / f'{split}.parquet'} "
        f"(or {split}-*.parquet, data/{split}-*.parquet, {split}/*.parquet, the same in .arrow) or image folders "
        f"{task_dir / split}/<label>/*.png"
    )


# --------------------------------------------------------------------------- public API


def _read_task(
    task: str, source: str, data_dir: str | Path | None, splits: tuple[str, ...] = SPLITS
) -> TaskSplits:
    """Read splits of one task, normalised (their images are checked when the tasks are assembled)."""
    if source == "local":
        if data_dir is None:
            raise ValueError('source="local" needs data_dir (a folder holding <task>/train.parquet, ...)')
        read = {split: _load_local_split(task, split, data_dir) for split in splits}
        description = f"local folder {_local_task_dir(data_dir, task)}"
    elif source == "sklearn":
        read = {
            split: ImageSplit(_sklearn_digits()[split], f"scikit-learn's digits ({split})")
            for split in splits
        }
        description = "scikit-learn's 8x8 digits"
    else:
        read = {split: _load_hub_split(task, split) for split in splits}
        description = f"Hub dataset {HUB_DATASETS[task].repo_id}"
    return TaskSplits(task, DIGIT_CLASS_NAMES, read, description)


def load_task_split(
    task: str,
    split: str,
    source: str | None = None,
    data_dir: str | Path | None = None,
    max_samples: int | None = None,
    seed: int = 42,
    skip_bad_images: bool = False,
) -> Dataset:
    """Load one split of one task with columns ``image`` and ``label`` (no ``task_id``).

    ``source``: "hub", "local" or "sklearn"; default "local" when ``data_dir`` is given, else "hub". Images are
    decoded once here: a file that cannot be decoded is named, and refused unless ``skip_bad_images``, which leaves
    such files out with a warning that counts and names them.
    """
    source = resolve_dataset_source(None, data_dir) if source is None else source
    _check_source(source)
    if split not in SPLITS:
        raise ValueError(f"Unknown split {split!r}; expected one of {list(SPLITS)}")
    (task,) = _resolve_task_names([task], source)
    check_max_samples(max_samples, "max_train_samples" if split == "train" else "max_eval_samples", split)
    one = _read_task(task, source, data_dir, (split,))
    dataset, _ = assemble_tasks([one], {split: max_samples}, seed, skip_bad_images, shuffle=())
    return dataset[split].remove_columns("task_id")


def load_digits_tasks(
    task_names: list[str],
    source: str | None = None,
    data_dir: str | None = None,
    max_train_samples: int | None = None,
    max_eval_samples: int | None = None,
    seed: int = 42,
    skip_bad_images: bool = False,
) -> tuple[DatasetDict, list[str]]:
    """Load several digit tasks into one ``DatasetDict(train, test)`` with ``image``, ``label``, ``task_id``.

    ``source``: "hub", "local" or "sklearn"; default "local" when ``data_dir`` is given, else "hub". Images are
    decoded once here: files that cannot be decoded are named, and refused unless ``skip_bad_images``, which leaves
    them out with a warning that counts and names them. ``max_*_samples`` must be None or positive.
    """
    source = resolve_dataset_source(source, data_dir)
    names = _resolve_task_names(task_names, source)
    check_max_samples(max_train_samples, "max_train_samples", "train")
    check_max_samples(max_eval_samples, "max_eval_samples", "test")
    tasks = [_read_task(task, source, data_dir) for task in names]
    caps = {"train": max_train_samples, "test": max_eval_samples}
    dataset, _ = assemble_tasks(tasks, caps, seed, skip_bad_images)
    return dataset, names


DigitsTransform = ImageClassificationTransform  # the digits scripts' name for the general transform


__all__ = [
    "DIGIT_CLASS_NAMES",
    "DigitsTransform",
    "HUB_DATASETS",
    "LOCAL_FOLDER_NAMES",
    "PAPER_TASKS",
    "SKLEARN_TASK",
    "SOURCES",
    "TASK_ALIASES",
    "HubDatasetSpec",
    "canonical_task_name",
    "known_task_names",
    "resolve_dataset_source",
    "load_digits_tasks",
    "load_task_split",
]
