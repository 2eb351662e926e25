"""Digit datasets for multi-task training (MNIST, MNIST-M, SVHN, ...), each sample tagged with its task.

The Neural Interpreters paper trains one model jointly on MNIST, MNIST-M and SVHN
(cropped digits) and adapts it to new tasks such as K-MNIST. :func:`load_digits_tasks`
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
    ``<split>/*.parquet``, or image folders ``<folder>/<split>/<label>/*.png``
    (``imagefolder`` builder). Folder names: see :data:`LOCAL_FOLDER_NAMES`
    (``mnistm`` is looked up as ``mnist_m`` first); any other task name is used as the
    folder name itself. Parquet files are read with ``pyarrow`` straight into memory (no
    cache files; MNIST-M's 118 MB train file takes about a second). Image folders must be named
    by their digit, ``0``..``9``: that digit is the label, in every split (a folder named
    otherwise is refused, with its path). Every local image is decoded once when loaded (in
    threads, with a progress bar); files that cannot be decoded are named and refused, or with
    ``skip_bad_images=True`` left out with a warning that counts and names them. A split without
    rows, or ``max_*_samples=0``, is refused naming the split.

``"sklearn"``
    scikit-learn's bundled 8x8 digits (1797 images, gray levels 0..16 rescaled to
    0..255), fully offline: one task, ``sklearn_digits``, with a fixed stratified 80/20
    train/test split (1437/360; seed :data:`SKLEARN_SPLIT_SEED`, independent of ``seed``).

Task names are canonicalised (``"mnist_m"``, ``"MNIST-M"`` -> ``"mnistm"``; see
:data:`TASK_ALIASES`) and the returned task-name list holds the canonical names.
``max_train_samples``/``max_eval_samples`` apply per task: each task contributes at
most that many rows, drawn at random (seeded by ``seed`` and the task name) and kept
in their original order. The train split is then shuffled with ``seed``; the test
split is not shuffled (tasks follow each other in the requested order).
"""

from __future__ import annotations

import functools
import hashlib
import io
import logging
import os
import re
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

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
    concatenate_datasets,
    load_dataset,
)
from datasets.data_files import EmptyDatasetError
from tqdm.auto import tqdm

logger = logging.getLogger(__name__)

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


def _split_seed(seed: int, task: str, split: str) -> np.random.Generator:
    """Return a generator seeded by the global seed, the task and the split."""
    return np.random.default_rng([seed, zlib.crc32(task.encode()), zlib.crc32(split.encode())])


def _check_max_samples(max_samples: Any, split: str) -> None:
    """Refuse a per-task row cap that is not None or a positive integer (0 would leave the split empty)."""
    if max_samples is None:
        return
    if isinstance(max_samples, bool) or not isinstance(max_samples, (int, np.integer)) or max_samples < 1:
        option = "max_train_samples" if split == "train" else "max_eval_samples"
        raise ValueError(
            f"{option} (rows per task of the {split} split) must be a positive integer or None (every row), "
            f"got {max_samples!r}: the {split} split would be empty."
        )


def _subsample_indices(num_rows: int, max_samples: int | None, rng: np.random.Generator) -> np.ndarray | None:
    """Pick at most ``max_samples`` sorted random row indices, or None to keep all rows."""
    if max_samples is None or max_samples >= num_rows:
        return None
    return np.sort(rng.choice(num_rows, size=max_samples, replace=False))


def _find_column(columns: list[str], candidates: tuple[str, ...], what: str, where: str) -> str:
    """Return the first candidate column present, else raise."""
    for name in candidates:
        if name in columns:
            return name
    raise ValueError(
        f"No {what} column in {where}: columns are {columns}, expected one of {list(candidates)}"
    )


def _normalise(ds: Dataset, image_column: str, label_column: str, where: str) -> Dataset:
    """Keep only ``image`` (Image) and ``label`` (ClassLabel "0".."9") columns, without rewriting images."""
    for column in (image_column, label_column):
        if column not in ds.column_names:
            raise ValueError(f"Column {column!r} missing in {where}; columns are {ds.column_names}")
    ds = ds.select_columns([image_column, label_column])
    if image_column != "image":
        ds = ds.rename_column(image_column, "image")
    if label_column != "label":
        ds = ds.rename_column(label_column, "label")
    if not isinstance(ds.features["image"], Image):
        ds = ds.cast_column("image", Image())
    labels = np.asarray(ds.select_columns(["label"]).with_format("numpy")[:]["label"]).astype(np.int64)
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
    ds = ds.remove_columns("label")
    return ds.add_column("label", labels, feature=ClassLabel(names=DIGIT_CLASS_NAMES))


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


def _load_sklearn_split(task: str, split: str) -> Dataset:
    """Return one split of the sklearn digits task."""
    return _sklearn_digits()[split]


# --------------------------------------------------------------------------- hub


def _load_hub_split(task: str, split: str) -> Dataset:
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
    return _normalise(ds, spec.image_column, spec.label_column, f"{spec.repo_id} ({split})")


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


def _local_parquet_files(task_dir: Path, split: str) -> list[Path]:
    """Return the Parquet files of one split in a task folder (first matching layout)."""
    patterns = (f"{split}.parquet", f"{split}-*.parquet", f"data/{split}-*.parquet", f"{split}/*.parquet")
    for pattern in patterns:
        files = sorted(task_dir.glob(pattern))
        if files:
            return files
    return []


def _has_image_folder(task_dir: Path, split: str) -> bool:
    """Tell whether ``<task_dir>/<split>`` holds label sub-folders."""
    split_dir = task_dir / split
    return split_dir.is_dir() and any(p.is_dir() for p in split_dir.iterdir())


def _read_parquet(
    files: list[Path], max_samples: int | None, rng: np.random.Generator
) -> tuple[Dataset, list[str]]:
    """Read Parquet files into an in-memory Dataset of the sampled rows; name each row by its file and row."""
    tables = [pq.read_table(f) for f in files]
    table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
    origins = [f"{f} (row {row})" for f, t in zip(files, tables, strict=True) for row in range(t.num_rows)]
    idx = _subsample_indices(table.num_rows, max_samples, rng)
    if idx is not None:
        table = table.take(pa.array(idx))
        origins = [origins[i] for i in idx]
    # A fingerprint from file identities spares datasets from hashing the whole table (~1 s for MNIST-M).
    digest = hashlib.sha256()
    for f in files:
        stat = f.stat()
        digest.update(f"{f.resolve()}|{stat.st_size}|{stat.st_mtime_ns};".encode())
    digest.update(b"all" if idx is None else idx.tobytes())
    return Dataset(table, fingerprint=digest.hexdigest()[:16]), origins


def _check_class_folders(split_dir: Path) -> None:
    """Refuse class folders not named by a digit 0..9: the label is the digit the folder's name spells.

    The imagefolder builder numbers each split's folders in sorted order, so a folder named `seven` would shift the
    labels of the folders sorted after it, differently in each split that lacks it.
    """
    folders = sorted(p for p in split_dir.iterdir() if p.is_dir() and not p.name.startswith("."))
    bad = [str(p) for p in folders if not (re.fullmatch(r"[0-9]+", p.name) and int(p.name) < NUM_CLASSES)]
    if bad:
        raise ValueError(
            f"Image folders must be named by their digit label, 0..{NUM_CLASSES - 1} (the label is the digit the "
            f"folder's name spells), got {bad}. Rename each to its class index."
        )


def _decoding_error(image: dict[str, Any]) -> str | None:
    """Why an undecoded ``datasets.Image`` value (bytes or path) cannot be read as an image; None if it can."""
    try:
        source = io.BytesIO(image["bytes"]) if image.get("bytes") else image["path"]
        with PIL.Image.open(source) as decoded:
            decoded.load()  # decodes every pixel: a truncated file fails here, not at open
            if decoded.width == 0 or decoded.height == 0:
                return f"an empty image ({decoded.width}x{decoded.height})"
    except PIL.UnidentifiedImageError:
        return "not an image PIL can identify (unknown format, or a truncated header)"
    except Exception as error:  # noqa: BLE001 - any decoder failure makes the file unusable
        return f"{type(error).__name__}: {error}"
    return None


def _decoding_errors(ds: Dataset, description: str) -> list[str | None]:
    """Decode every image of ``ds`` in threads, with a progress bar: per row, why it fails, or None."""
    images = ds.cast_column("image", Image(decode=False))["image"][:]
    chunks = [images[i : i + 256] for i in range(0, len(images), 256)]
    errors: list[str | None] = []
    with (
        ThreadPoolExecutor(min(8, os.cpu_count() or 1)) as pool,
        tqdm(total=len(images), desc=f"Checking the images of {description}", unit="img") as bar,
    ):
        for chunk_errors in pool.map(lambda chunk: [_decoding_error(image) for image in chunk], chunks):
            errors.extend(chunk_errors)
            bar.update(len(chunk_errors))
    return errors


def _drop_or_refuse_bad_images(ds: Dataset, origins: list[str], description: str, skip: bool) -> Dataset:
    """Check that every image decodes; name every bad file, then refuse (default) or drop them with a warning."""
    errors = _decoding_errors(ds, description)
    bad = [row for row, error in enumerate(errors) if error is not None]
    if not bad:
        return ds
    listing = "\n".join(f"  {origins[row]}: {errors[row]}" for row in bad)
    if not skip:
        raise ValueError(
            f"{len(bad)} of the {len(ds)} images of {description} cannot be decoded:\n{listing}\nFix or remove "
            "them, or pass skip_bad_images=True (run_digits.py: --skip_bad_images) to leave them out."
        )
    logger.warning(
        "Skipped %d of the %d images of %s (cannot be decoded):\n%s", len(bad), len(ds), description, listing
    )
    keep = np.setdiff1d(np.arange(len(ds)), np.asarray(bad))
    return ds.select(keep)


def _load_local_split(
    task: str, split: str, data_dir: str | Path, max_samples: int | None, seed: int, skip_bad_images: bool
) -> Dataset:
    """Load one split of a task from a local folder, check that its images decode, and normalise its columns."""
    task_dir = _local_task_dir(data_dir, task)
    rng = _split_seed(seed, task, split)
    files = _local_parquet_files(task_dir, split)
    if files:
        ds, origins = _read_parquet(files, max_samples, rng)
        where = ", ".join(str(f) for f in files)
    elif _has_image_folder(task_dir, split):
        _check_class_folders(task_dir / split)
        where = str(task_dir / split)
        try:
            ds = load_dataset("imagefolder", data_dir=where, split="train", drop_labels=False)
        except EmptyDatasetError:
            raise ValueError(
                f"The {split} split of task {task!r} has no usable rows ({where}: no image files)."
            ) from None
        idx = _subsample_indices(len(ds), max_samples, rng)
        if idx is not None:
            ds = ds.select(idx)
        origins = [image["path"] for image in ds.cast_column("image", Image(decode=False))["image"][:]]
    else:
        raise FileNotFoundError(
            f"No {split} split for task {task!r} in {task_dir}: expected {task_dir / f'{split}.parquet'} "
            f"(or {split}-*.parquet, data/{split}-*.parquet, {split}/*.parquet) or image folders "
            f"{task_dir / split}/<label>/*.png"
        )
    _check_not_empty(ds, task, split, where)
    image_column = _find_column(ds.column_names, IMAGE_COLUMN_CANDIDATES, "image", where)
    label_column = _find_column(ds.column_names, LABEL_COLUMN_CANDIDATES, "label", where)
    ds = _normalise(ds, image_column, label_column, where)
    ds = _drop_or_refuse_bad_images(
        ds, origins, f"the {split} split of task {task!r} ({where})", skip_bad_images
    )
    _check_not_empty(ds, task, split, where)
    return ds


def _check_not_empty(ds: Dataset, task: str, split: str, where: str) -> None:
    """Refuse a split without rows, naming it (an empty split fails much later, with an unrelated cast error)."""
    if len(ds) == 0:
        raise ValueError(f"The {split} split of task {task!r} has no usable rows ({where}).")


# --------------------------------------------------------------------------- public API


def _load_split(
    task: str,
    split: str,
    source: str,
    data_dir: str | Path | None,
    max_samples: int | None,
    seed: int,
    skip_bad_images: bool,
) -> tuple[Dataset, np.ndarray | None]:
    """Load one normalised split; return it with the row indices still to select (None: keep all)."""
    _check_max_samples(max_samples, split)
    if source == "local":
        if data_dir is None:
            raise ValueError('source="local" needs data_dir (a folder holding <task>/train.parquet, ...)')
        # Subsampled while reading, and its images checked.
        return _load_local_split(task, split, data_dir, max_samples, seed, skip_bad_images), None
    ds = _load_sklearn_split(task, split) if source == "sklearn" else _load_hub_split(task, split)
    _check_not_empty(ds, task, split, f"source {source!r}")
    return ds, _subsample_indices(len(ds), max_samples, _split_seed(seed, task, split))


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

    ``source``: "hub", "local" or "sklearn"; default "local" when ``data_dir`` is given, else "hub". Local images
    are decoded once here: a file that cannot be decoded is named, and refused unless ``skip_bad_images``, which
    leaves such files out with a warning that counts and names them.
    """
    source = resolve_dataset_source(None, data_dir) if source is None else source
    _check_source(source)
    if split not in SPLITS:
        raise ValueError(f"Unknown split {split!r}; expected one of {list(SPLITS)}")
    (task,) = _resolve_task_names([task], source)
    ds, idx = _load_split(task, split, source, data_dir, max_samples, seed, skip_bad_images)
    return ds if idx is None else ds.select(idx)


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

    ``source``: "hub", "local" or "sklearn"; default "local" when ``data_dir`` is given, else "hub". Local images
    are decoded once here: files that cannot be decoded are named, and refused unless ``skip_bad_images``, which
    leaves them out with a warning that counts and names them. ``max_*_samples`` must be None or positive.
    """
    source = resolve_dataset_source(source, data_dir)
    names = _resolve_task_names(task_names, source)
    _check_max_samples(max_train_samples, "train")
    _check_max_samples(max_eval_samples, "test")
    task_feature = ClassLabel(names=names)
    out = {}
    for split, max_samples in (("train", max_train_samples), ("test", max_eval_samples)):
        parts = []
        for task_id, task in enumerate(names):
            ds, idx = _load_split(task, split, source, data_dir, max_samples, seed, skip_bad_images)
            # Add task_id before selecting rows: add_column on a selection would copy the selected images.
            ds = ds.add_column("task_id", np.full(len(ds), task_id, dtype=np.int64), feature=task_feature)
            parts.append(ds if idx is None else ds.select(idx))
        merged = parts[0] if len(parts) == 1 else concatenate_datasets(parts)
        if split == "train":
            merged = merged.shuffle(seed=seed)
        out[split] = merged
    return DatasetDict(out), names


@dataclass
class DigitsTransform:
    """Dataset transform: images -> the processor's normalized (C, H, W) float arrays, labels and the model's task ids.

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
