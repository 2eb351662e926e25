"""PGM abstract-reasoning puzzles (Barrett et al. 2018; the Neural Interpreters paper's section 4.3), three sources.

Every source yields one puzzle as a dict (the *schema*)::

    panels                      np.uint8 (16, H, W): the 8 context panels of the incomplete 3x3 matrix
                                (row-major), then the 8 candidate panels
    target                      int 0-7, the correct candidate
    meta_target                 np.uint8 (12,), bits in DeepMind's order (see META_TARGET_NAMES):
                                shape, line, color, number, position, size, type, progression, XOR, OR,
                                AND, consistent_union
    relation_structure_encoded  np.uint8 (4, 12), one row per [relation, object, attribute] triple, same
                                columns (rows of zeros pad puzzles with fewer than 4 triples)

so one collate/transform (the PGM image processor resizes and normalises ``panels``) serves all sources.
:func:`load_pgm` is the entry point.

``"deepmind"``: DeepMind's release, read from files the user downloaded
    From github.com/google-deepmind/abstract-reasoning-matrices (README, as stored in the search index):
    the data lives in the Google Cloud bucket ``ravens-matrices``, one archive per generalisation regime
    (``neutral``, ``interpolation``, ``extrapolation``, ``attr.rel.pairs``, ``attr.rels``, ``attrs.pairs``,
    ``attrs.shape.color``, ``attrs.line.type``, each ``<regime>.tar.gz``), each holding 1.42M files named
    ``PGM_<regime>_<train|val|test>_<id>.npz``. The README describes ``image`` as "a 160x160x16 integer array
    with values from 0 to 255", first 8 panels the context, last 8 the choices, and its update says the
    stored array is mis-shaped: ``data["image"].reshape(16, 160, 160)`` (a reshape, not a transpose) gives
    the panels. ``meta_target`` is the OR of the rows of the 4x12 structure matrix, columns indexed
    shape 0 ... consistent_union 11 (the order above). The README calls that matrix ``meta_matrix``;
    the files' key is ``relation_structure_encoded`` (TensorFlow Datasets' ``abstract_reasoning`` builder
    and HuggingFaceM4's conversion script read that key, shape (4, 12), and ``meta_target`` of shape (12,),
    ``target`` a scalar; both reshape ``image`` to (16, 160, 160)); ``meta_matrix`` is accepted too. The
    split sizes (train 1.2M / val 20k / test 200k) are TensorFlow Datasets' split table. ``image``'s dtype
    is not stated anywhere we found ("integer array"), so any integer (or float) array of 16 square panels
    with values 0-255 is accepted and cast to uint8.

    ``data_dir`` is a folder (searched recursively, so ``<dir>/neutral/PGM_neutral_*.npz`` works) or the
    ``.tar.gz`` itself. Nothing of a regime goes into memory: a folder is listed (file names only, kept in
    numpy arrays so DataLoader workers do not copy them) and each file is opened when its puzzle is read;
    a ``.tar.gz`` is streamed member by member (``tarfile`` stream mode), never extracted.

    - folder, ``streaming=False`` (default): :class:`DeepMindPGMFolder`, a map-style ``torch`` Dataset over
      the files sorted by (sub-folder, numeric id); the sampler (Trainer's, or ``DistributedSampler``)
      splits it across ranks and DataLoader workers.
    - folder, ``streaming=True``, or a ``.tar.gz`` (always streamed): a ``datasets.IterableDataset`` built
      with ``IterableDataset.from_generator(..., gen_kwargs={"shards": [...]})``; ``datasets`` spreads the
      shards over DataLoader workers and ``datasets.distributed.split_dataset_by_node`` over ranks. A folder
      is cut into ``num_shards`` (default ``min(64, files)``) interleaved file lists. A ``.tar.gz`` cannot be
      split without reading it: each of its ``num_shards`` shards (default 1) reads the whole compressed
      stream and keeps every ``num_shards``-th matching member, so set ``num_shards`` to workers x ranks to
      parallelise (at that many decompression passes in total); extracting the archive is faster.

    A bad file (not a readable .npz, a key missing, a wrong shape, values out of range, target outside
    0-7) raises :class:`PGMFileError` naming the file and what was expected. With ``skip_bad_files=True``
    it is skipped with a warning naming it and counting the skips (per process; the map-style dataset
    serves the next good file in its place so that indices stay valid).

    Licence: "This data is made available for the purposes of non-commercial research only and is not to
    be used for any other purpose" (the repository's README). Users download it themselves; nothing here
    fetches or redistributes it.

``"hub"``: the Hugging Face Hub copy ``HuggingFaceM4/PGM`` (neutral regime only, Parquet, ~44 GB)
    Confirmed (search index): the Hub's file listing (``data/train-000NN-of-00054.parquet``, Parquet,
    arXiv 1807.04225) and HuggingFaceM4's conversion script, which reads the neutral ``.npz`` files and
    pushes splits ``train``, ``validation``, ``test`` with features ``panels`` (list of 8 images, the
    context, PNG via ``datasets.Image``), ``choices`` (list of 8 images), ``relation_structure_encoded``
    (Array2D (4, 12) uint8), ``relation_structure`` (Array2D (1, 3) string), ``meta_target`` (Array2D
    (1, 12) uint8), ``target`` (uint8) and ``id`` (int32). Not confirmed: that the data finally on the Hub
    was made by exactly that script (its dataset card and viewer were not readable here). So other
    plausible layouts are accepted as well: ``panels`` with all 16 images, ``context`` + ``answers`` (as
    TensorFlow Datasets names them), an ``image`` array of 16 panels (as in the .npz), or 16 columns
    ``panel_0`` ... ``panel_15``; anything else is refused listing the columns found and those expected.

    Read through ``datasets.load_dataset`` with ``streaming=True`` by default (a ``datasets.IterableDataset``
    whose Parquet files are its shards, split across workers and ranks as above); ``streaming=False``
    downloads and converts it (a ``datasets.Dataset`` whose rows are mapped to the schema on access).
    ``data_dir`` is a repo id (default ``HuggingFaceM4/PGM``) or a local folder (or file) of Parquet in the
    same layout, read with ``load_dataset("parquet", data_files=...)``: files ``<split>-*.parquet``,
    ``<split>.parquet`` or ``<split>/*.parquet`` anywhere below it (split ``val`` is looked up as
    ``validation`` first, the Hub's name).

``"generated"``: :mod:`ni_hf.data.pgm_generator`, an offline generator of PGM-style puzzles
    Deterministic per index; :class:`GeneratedPGM` wraps it as a map-style dataset (``streaming=True``:
    a ``datasets.IterableDataset`` over interleaved index shards). ``max_samples`` is the number of
    puzzles, ``panel_size`` the rendered panel side; extra keyword arguments go to ``PGMGenerator``.
"""

from __future__ import annotations

import io
import logging
import math
import os
import re
import tarfile
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import datasets
import numpy as np
import torch

# DeepMind's names, which the generator uses too; META_TARGET_NAMES: the columns of meta_target and
# relation_structure_encoded.
from ni_hf.data.pgm_generator import META_TARGET_NAMES, REGIMES, SPLITS  # noqa: F401

logger = logging.getLogger(__name__)

PGM_SOURCES = ("generated", "deepmind", "hub")
SCHEMA_KEYS = ("panels", "target", "meta_target", "relation_structure_encoded")
NUM_PANELS = 16
HUB_REPO_ID = "HuggingFaceM4/PGM"
HUB_REGIMES = ("neutral",)
HUB_SPLIT_NAMES = {"train": "train", "val": "validation", "test": "test"}
DEFAULT_FOLDER_SHARDS = 64

_DEEPMIND_NAME = re.compile(r"^PGM_(?P<regime>[A-Za-z.]+)_(?P<split>train|val|test)_(?P<id>\d+)\.npz$")
_PANEL_COLUMN = re.compile(r"^(?:panel|image)_?(\d+)$")
_NPZ_EXPECTED = (
    "keys 'image' (16 square panels, e.g. 160x160x16 integers 0-255), 'target' (0-7), 'meta_target' (12 bits), "
    "'relation_structure_encoded' (4x12 bits)"
)
_DEEPMIND_HELP = (
    "DeepMind's PGM data must be downloaded by you (non-commercial research licence): see "
    "https://github.com/google-deepmind/abstract-reasoning-matrices (bucket ravens-matrices, one "
    "<regime>.tar.gz per regime); pass data_dir= the extracted folder or the .tar.gz"
)


class PGMFileError(ValueError):
    """A PGM file or row that does not hold a puzzle in the expected layout; `file` names it."""

    def __init__(self, file: str, problem: str) -> None:
        super().__init__(f"{file}: {problem}")
        self.file = file
        self.problem = problem


def parse_deepmind_name(name: str) -> tuple[str, str, int] | None:
    """Return (regime, split, id) of a DeepMind file name `PGM_<regime>_<split>_<id>.npz` (any folder), else None."""
    match = _DEEPMIND_NAME.match(os.path.basename(name))
    if match is None:
        return None
    return match["regime"], match["split"], int(match["id"])


# ----------------------------------------------------------------------------------------------------------
# One puzzle: validation and conversion to the schema
# ----------------------------------------------------------------------------------------------------------


def _as_uint8(array: np.ndarray, where: str, what: str, expected: str) -> np.ndarray:
    """Cast an integer-valued array in 0-255 to uint8, refusing anything else by name."""
    if array.dtype == np.uint8:
        return array
    if array.dtype.kind not in "uif" or array.size == 0:
        raise PGMFileError(where, f"{what} has dtype {array.dtype}; expected {expected}")
    low, high = array.min(), array.max()
    if low < 0 or high > 255 or (array.dtype.kind == "f" and not np.array_equal(array, np.round(array))):
        raise PGMFileError(where, f"{what} has values {low}..{high}; expected {expected}")
    return array.astype(np.uint8)


def _panels_from_image(image: Any, where: str) -> np.ndarray:
    """Reshape DeepMind's `image` (160x160x16 as stored, or flat, or 16xHxW) to (16, side, side) uint8."""
    image = np.asarray(image)
    side = math.isqrt(image.size // NUM_PANELS) if image.size else 0
    if image.size == 0 or NUM_PANELS * side * side != image.size:
        raise PGMFileError(
            where,
            f"'image' has shape {image.shape}; expected 16 square panels (160x160x16 in DeepMind's files)",
        )
    # DeepMind's README: the array is panel-major despite its 160x160x16 label, so reshape, never transpose.
    panels = image.reshape(NUM_PANELS, side, side)
    return _as_uint8(panels, where, "'image'", "integers 0-255")


def _bits(value: Any, shape: tuple[int, ...], where: str, what: str) -> np.ndarray:
    """Return `value` as a uint8 0/1 array of `shape` (any layout with that many elements)."""
    array = np.asarray(value)
    size = math.prod(shape)
    expected = f"{size} bits, shape {shape}"
    if array.size != size or array.dtype.kind not in "uifb":
        raise PGMFileError(where, f"{what} has shape {array.shape} ({array.dtype}); expected {expected}")
    array = array.reshape(shape)
    if not np.isin(array, (0, 1)).all():
        raise PGMFileError(where, f"{what} has values other than 0 and 1; expected {expected}")
    return array.astype(np.uint8)


def _target(value: Any, where: str) -> int:
    """Return the target as an int 0-7."""
    array = np.asarray(value)
    if array.size != 1 or array.dtype.kind not in "uif" or float(array.reshape(())) != int(array.reshape(())):
        raise PGMFileError(where, f"'target' is {value!r}; expected one integer 0-7")
    target = int(array.reshape(()))
    if not 0 <= target <= 7:
        raise PGMFileError(where, f"'target' is {target}; expected an integer 0-7 (the correct candidate)")
    return target


def make_puzzle(
    panels: np.ndarray, target: Any, meta_target: Any, structure: Any, where: str
) -> dict[str, Any]:
    """Validate one puzzle's parts and return it in the schema (`panels` must already be (16, H, W))."""
    panels = np.asarray(panels)
    if panels.ndim != 3 or panels.shape[0] != NUM_PANELS:
        raise PGMFileError(where, f"panels have shape {panels.shape}; expected (16, H, W)")
    return {
        "panels": _as_uint8(panels, where, "panels", "integers 0-255"),
        "target": _target(target, where),
        "meta_target": _bits(meta_target, (12,), where, "'meta_target'"),
        "relation_structure_encoded": _bits(structure, (4, 12), where, "'relation_structure_encoded'"),
    }


def read_deepmind_npz(file: str | os.PathLike[str] | IO[bytes], name: str | None = None) -> dict[str, Any]:
    """Read one DeepMind `.npz` (a path or a binary file object) into the schema; `name` labels errors."""
    where = name if name is not None else os.fspath(file)  # type: ignore[arg-type]
    try:
        data = np.load(file, allow_pickle=False)
    except Exception as err:  # anything numpy raises on a file that is not a readable .npz
        raise PGMFileError(
            where,
            f"cannot be read as .npz ({type(err).__name__}: {err}); expected an .npz with {_NPZ_EXPECTED}",
        ) from err
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise PGMFileError(
            where, f"holds a single {type(data).__name__}, not an .npz archive; expected {_NPZ_EXPECTED}"
        )
    with data:
        keys = set(data.files)
        structure_key = (
            "relation_structure_encoded" if "relation_structure_encoded" in keys else "meta_matrix"
        )
        missing = [key for key in ("image", "target", "meta_target") if key not in keys]
        if structure_key not in keys:
            missing.append("relation_structure_encoded")
        if missing:
            raise PGMFileError(where, f"has keys {sorted(keys)}, missing {missing}; expected {_NPZ_EXPECTED}")
        try:
            image, target, meta_target, structure = (
                data[key] for key in ("image", "target", "meta_target", structure_key)
            )
        except Exception as err:  # a corrupt member (CRC, zlib) surfaces only when it is read
            raise PGMFileError(
                where,
                f"cannot be read as .npz ({type(err).__name__}: {err}); expected an .npz with {_NPZ_EXPECTED}",
            ) from err
    return make_puzzle(_panels_from_image(image, where), target, meta_target, structure, where)


def _skip(where: str, error: PGMFileError, skipped: list[str]) -> None:
    """Record and report a skipped bad file."""
    skipped.append(where)
    logger.warning("skipping bad PGM file (%d skipped so far in this process): %s", len(skipped), error)


# ----------------------------------------------------------------------------------------------------------
# DeepMind: a folder of .npz files
# ----------------------------------------------------------------------------------------------------------


def _scan_folder(root: Path, regime: str, split: str) -> tuple[list[str], np.ndarray, np.ndarray, Counter]:
    """List (names only) the `PGM_<regime>_<split>_*.npz` files below `root`, sorted by (folder, id)."""
    dirs: list[str] = []
    dir_index: list[int] = []
    names: list[str] = []
    ids: list[int] = []
    found: Counter = Counter()
    stack = [root]
    while stack:
        folder = stack.pop()
        number = None
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.is_dir():
                    stack.append(Path(entry.path))
                    continue
                parsed = parse_deepmind_name(entry.name)
                if parsed is None:
                    found["other files"] += 1
                    continue
                found[f"PGM_{parsed[0]}_{parsed[1]}"] += 1
                if parsed[:2] != (regime, split):
                    continue
                if number is None:
                    number = len(dirs)
                    dirs.append(os.path.relpath(folder, root))
                dir_index.append(number)
                names.append(entry.name)
                ids.append(parsed[2])
    order = np.lexsort((np.asarray(ids, dtype=np.int64), np.asarray(dir_index, dtype=np.int64)))
    # Fixed-width bytes in numpy arrays: no per-name Python objects for forked workers to copy on access.
    name_array = np.asarray(names, dtype=np.bytes_)[order] if names else np.zeros(0, dtype="S1")
    return dirs, np.asarray(dir_index, dtype=np.int32)[order], name_array, found


def _describe_found(found: Counter) -> str:
    """Summarise what a folder or archive held, for error messages."""
    if not found:
        return "nothing"
    return ", ".join(f"{key}: {count}" for key, count in sorted(found.items()))


class DeepMindPGMFolder(torch.utils.data.Dataset):
    """Map-style dataset over a folder of DeepMind `PGM_<regime>_<split>_<id>.npz` files, opened on access."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        split: str = "train",
        regime: str = "neutral",
        max_samples: int | None = None,
        skip_bad_files: bool = False,
    ) -> None:
        self.root = Path(data_dir)
        if not self.root.is_dir():
            raise FileNotFoundError(
                f"DeepMind PGM folder {str(self.root)!r} does not exist. {_DEEPMIND_HELP}"
            )
        self.split, self.regime, self.skip_bad_files = split, regime, skip_bad_files
        self._dirs, self._dir_index, self._names, found = _scan_folder(self.root, regime, split)
        if len(self._names) == 0:
            raise FileNotFoundError(
                f"no PGM_{regime}_{split}_<id>.npz files in {str(self.root)!r} (searched recursively); "
                f"found {_describe_found(found)}"
            )
        if max_samples is not None:
            self._dir_index, self._names = self._dir_index[:max_samples], self._names[:max_samples]
        self.skipped_files: list[str] = []

    def __len__(self) -> int:
        return len(self._names)

    def file_path(self, index: int) -> Path:
        """Return the path of the file behind puzzle `index`."""
        return self.root / self._dirs[self._dir_index[index]] / self._names[index].decode()

    def read_file(self, index: int) -> dict[str, Any]:
        """Read puzzle `index` from its file (raises :class:`PGMFileError` for a bad file)."""
        return read_deepmind_npz(self.file_path(index))

    def read_or_skip(self, index: int) -> dict[str, Any] | None:
        """Read puzzle `index`, or with `skip_bad_files` warn and return None for a bad file."""
        try:
            return self.read_file(index)
        except PGMFileError as error:
            if not self.skip_bad_files:
                raise
            _skip(error.file, error, self.skipped_files)
            return None

    def __getitem__(self, index: int) -> dict[str, Any]:
        if not -len(self) <= index < len(self):
            raise IndexError(f"PGM index {index} out of range for {len(self)} files")
        index %= len(self)
        for offset in range(len(self)):
            puzzle = self.read_or_skip((index + offset) % len(self))
            if puzzle is not None:
                return puzzle
        raise PGMFileError(str(self.root), f"every PGM_{self.regime}_{self.split} file is bad")

    def __repr__(self) -> str:
        return f"DeepMindPGMFolder({str(self.root)!r}, split={self.split!r}, regime={self.regime!r}, files={len(self)})"


# ----------------------------------------------------------------------------------------------------------
# Generated puzzles
# ----------------------------------------------------------------------------------------------------------


def _generator_module() -> Any:
    """Import :mod:`ni_hf.data.pgm_generator` (a function so that tests can stand in for it)."""
    from ni_hf.data import pgm_generator

    return pgm_generator


class GeneratedPGM(torch.utils.data.Dataset):
    """Map-style view of a `PGMGenerator` that keeps the schema's keys (and checks them)."""

    def __init__(self, generator: Any, keep_extra_keys: bool = False) -> None:
        self.generator = generator
        self.keep_extra_keys = keep_extra_keys

    def __len__(self) -> int:
        return len(self.generator)

    def __getitem__(self, index: int) -> dict[str, Any]:
        sample = self.generator[index]
        where = f"generated PGM puzzle {index}"
        missing = [key for key in SCHEMA_KEYS if key not in sample]
        if missing:
            raise PGMFileError(
                where, f"has keys {sorted(sample)}, missing {missing}; expected {list(SCHEMA_KEYS)}"
            )
        puzzle = make_puzzle(
            sample["panels"],
            sample["target"],
            sample["meta_target"],
            sample["relation_structure_encoded"],
            where,
        )
        if self.keep_extra_keys:
            puzzle.update({key: value for key, value in sample.items() if key not in puzzle})
        return puzzle

    def read_or_skip(self, index: int) -> dict[str, Any]:
        """Read puzzle `index` (generated puzzles are never skipped)."""
        return self[index]


# ----------------------------------------------------------------------------------------------------------
# Streaming (datasets.IterableDataset) versions
# ----------------------------------------------------------------------------------------------------------


def _iter_index_shards(shards: Sequence[tuple[Any, int, int]]) -> Iterator[dict[str, Any]]:
    """Yield the puzzles of each (map-style dataset, start, step) shard; bad files are skipped or raise."""
    for dataset, start, step in shards:
        for index in range(start, len(dataset), step):
            puzzle = dataset.read_or_skip(index)
            if puzzle is not None:
                yield puzzle


def _map_style_to_iterable(dataset: torch.utils.data.Dataset, num_shards: int) -> datasets.IterableDataset:
    """Wrap a map-style PGM dataset as a `datasets.IterableDataset` of `num_shards` interleaved shards."""
    num_shards = max(1, min(num_shards, len(dataset)))
    shards = [(dataset, start, num_shards) for start in range(num_shards)]
    return datasets.IterableDataset.from_generator(_iter_index_shards, gen_kwargs={"shards": shards})


def _open_tar_stream(path: Path) -> tarfile.TarFile:
    """Open an archive for sequential reading (gzip, bz2, xz or none)."""
    return tarfile.open(path, mode="r|*")


def _iter_tar_shards(
    shards: Sequence[tuple[str, int, int]], regime: str, split: str, skip_bad_files: bool
) -> Iterator[dict[str, Any]]:
    """Yield the puzzles of each (archive, start, step) shard: every step-th matching member from start."""
    skipped: list[str] = []
    for archive, start, step in shards:
        matched = 0
        found: Counter = Counter()
        with _open_tar_stream(Path(archive)) as tar:
            for member in tar:
                parsed = parse_deepmind_name(member.name) if member.isfile() else None
                if parsed is None:
                    if member.isfile():
                        found["other members"] += 1
                    continue
                found[f"PGM_{parsed[0]}_{parsed[1]}"] += 1
                if parsed[:2] != (regime, split):
                    continue
                matched += 1
                if (matched - 1) % step != start:
                    continue
                where = f"{archive}:{member.name}"
                try:
                    extracted = tar.extractfile(member)
                    if extracted is None:
                        raise PGMFileError(where, "cannot be extracted")
                    yield read_deepmind_npz(io.BytesIO(extracted.read()), name=where)
                except PGMFileError as error:
                    if not skip_bad_files:
                        raise
                    _skip(where, error, skipped)
        if matched == 0:
            raise FileNotFoundError(
                f"no PGM_{regime}_{split}_<id>.npz members in {archive!r}; found {_describe_found(found)}"
            )


def _deepmind_tar(
    path: Path, split: str, regime: str, skip_bad_files: bool, num_shards: int
) -> datasets.IterableDataset:
    """Stream a DeepMind archive as a `datasets.IterableDataset` of `num_shards` member-interleaved shards."""
    try:  # fail early on a file that is not an archive; reads only the first header
        with _open_tar_stream(path) as tar:
            tar.next()
    except (tarfile.TarError, OSError, EOFError) as err:
        raise PGMFileError(
            str(path), f"is not a readable tar archive ({err}); expected DeepMind's <regime>.tar.gz"
        ) from err
    shards = [(str(path), start, num_shards) for start in range(num_shards)]
    return datasets.IterableDataset.from_generator(
        _iter_tar_shards,
        gen_kwargs={"shards": shards, "regime": regime, "split": split, "skip_bad_files": skip_bad_files},
    )


def _is_archive(path: Path) -> bool:
    """Whether `path` names a tar archive rather than a folder."""
    return path.is_file() and path.name.endswith((".tar.gz", ".tgz", ".tar", ".tar.bz2", ".tar.xz"))


# ----------------------------------------------------------------------------------------------------------
# Hub Parquet
# ----------------------------------------------------------------------------------------------------------

_HUB_EXPECTED = (
    "'panels' (8 context images) and 'choices' (8 candidates) as in HuggingFaceM4/PGM; or 'panels' with all "
    "16 images; or 'context' and 'answers'; or an 'image' array of 16 panels; or 16 columns panel_0..panel_15; "
    "plus 'target', 'meta_target' and 'relation_structure_encoded'"
)


def _hub_panel_reader(columns: Sequence[str], where: str) -> Callable[[Mapping[str, Any], str], np.ndarray]:
    """Return a function that reads the 16 panels of a row, for rows with these columns (else refuse them)."""
    present = set(columns)
    missing = [key for key in ("target", "meta_target", "relation_structure_encoded") if key not in present]
    per_panel = sorted((int(m[1]), name) for name in columns if (m := _PANEL_COLUMN.match(name)) is not None)
    if missing:
        reader = None
    elif {"panels", "choices"} <= present:

        def reader(row: Mapping[str, Any], at: str) -> np.ndarray:
            return _stack_panels([*row["panels"], *row["choices"]], at)
    elif {"context", "answers"} <= present:

        def reader(row: Mapping[str, Any], at: str) -> np.ndarray:
            return _stack_panels([*row["context"], *row["answers"]], at)
    elif "panels" in present:

        def reader(row: Mapping[str, Any], at: str) -> np.ndarray:
            return _stack_panels(list(row["panels"]), at)
    elif "image" in present:

        def reader(row: Mapping[str, Any], at: str) -> np.ndarray:
            return _panels_from_image(row["image"], at)
    elif [index for index, _ in per_panel] == list(range(NUM_PANELS)):
        names = [name for _, name in per_panel]

        def reader(row: Mapping[str, Any], at: str) -> np.ndarray:
            return _stack_panels([row[name] for name in names], at)
    else:
        reader = None
    if reader is None:
        raise ValueError(f"{where} has columns {sorted(present)}; expected {_HUB_EXPECTED}")
    return reader


def _panel_array(value: Any, where: str) -> np.ndarray:
    """Return one panel (a PIL image, an undecoded {'bytes': ...} image, or an array) as a 2-D uint8 array."""
    from PIL import Image

    if isinstance(value, Mapping) and value.get("bytes") is not None:
        value = Image.open(io.BytesIO(value["bytes"]))
    if isinstance(value, Image.Image):
        value = value if value.mode == "L" else value.convert("L")
    array = np.asarray(value)
    if array.ndim == 3 and array.shape[-1] == 1:
        array = array[..., 0]
    if array.ndim != 2:
        raise PGMFileError(where, f"a panel has shape {array.shape}; expected a 2-D gray image")
    return _as_uint8(array, where, "a panel", "integers 0-255")


def _stack_panels(values: Sequence[Any], where: str) -> np.ndarray:
    """Stack 16 panels into (16, H, W)."""
    if len(values) != NUM_PANELS:
        raise PGMFileError(where, f"has {len(values)} panels; expected 16 (8 context, then 8 candidates)")
    panels = [_panel_array(value, where) for value in values]
    if len({panel.shape for panel in panels}) != 1:
        raise PGMFileError(
            where, f"panel shapes differ: {sorted({p.shape for p in panels})}; expected one shape"
        )
    return np.stack(panels)


def _hub_row_to_puzzle(
    row: Mapping[str, Any], reader: Callable[..., np.ndarray], source: str
) -> dict[str, Any]:
    """Map one Hub row to the schema."""
    where = f"{source} row" + (f" id={row['id']}" if "id" in row else "")
    return make_puzzle(
        reader(row, where), row["target"], row["meta_target"], row["relation_structure_encoded"], where
    )


def _local_parquet_files(root: Path, split: str) -> list[str]:
    """Find the Parquet files of `split` below `root` (Hub naming), or refuse listing what is there."""
    if root.is_file():
        return [str(root)]
    found = sorted(root.rglob("*.parquet"))
    names = [HUB_SPLIT_NAMES[split]] + ([split] if HUB_SPLIT_NAMES[split] != split else [])
    for name in names:
        pattern = re.compile(rf"^{re.escape(name)}(?:[-_.].*)?\.parquet$")
        files = [str(f) for f in found if pattern.match(f.name) or f.parent.name == name]
        if files:
            return files
    shown = ", ".join(str(f.relative_to(root)) for f in found[:10]) + (" ..." if len(found) > 10 else "")
    raise FileNotFoundError(
        f"no Parquet files for split {split!r} in {str(root)!r} (expected "
        f"{' or '.join(f'{n}-*.parquet, {n}.parquet or {n}/*.parquet' for n in names)}); "
        f"found {len(found)} Parquet file(s){': ' + shown if found else ''}"
    )


def _load_hub(
    data_dir: str | None,
    split: str,
    max_samples: int | None,
    streaming: bool,
    cache_dir: str | None,
    revision: str | None,
) -> datasets.IterableDataset | datasets.Dataset:
    """Load the Hub copy (or a local Parquet folder in its layout), rows mapped to the schema."""
    source = data_dir or HUB_REPO_ID
    local = Path(source).expanduser()
    if local.exists():
        files = _local_parquet_files(local, split)
        ds = datasets.load_dataset(
            "parquet", data_files={"rows": files}, split="rows", streaming=streaming, cache_dir=cache_dir
        )
    elif re.fullmatch(r"[\w.-]+/[\w.-]+", source):
        ds = datasets.load_dataset(
            source, split=HUB_SPLIT_NAMES[split], streaming=streaming, cache_dir=cache_dir, revision=revision
        )
    else:
        raise FileNotFoundError(f"PGM Parquet path {source!r} does not exist (and is not a Hub repo id)")
    label = f"{source} ({split})"
    columns = ds.column_names
    if columns is None:  # streaming rows of unknown features: look at the first one
        columns = list(next(iter(ds)).keys())
    reader = _hub_panel_reader(columns, label)
    if streaming:
        if max_samples is not None:
            ds = ds.take(max_samples)
        return ds.map(
            _hub_row_to_puzzle, fn_kwargs={"reader": reader, "source": label}, remove_columns=columns
        )
    if max_samples is not None:
        ds = ds.select(range(min(max_samples, len(ds))))

    def to_schema(batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        rows = [dict(zip(batch, values, strict=True)) for values in zip(*batch.values(), strict=True)]
        puzzles = [_hub_row_to_puzzle(row, reader, label) for row in rows]
        return {key: [puzzle[key] for puzzle in puzzles] for key in SCHEMA_KEYS}

    return ds.with_transform(to_schema)


# ----------------------------------------------------------------------------------------------------------
# Entry point
# ----------------------------------------------------------------------------------------------------------


def _pop_options(source: str, kwargs: dict[str, Any], allowed: dict[str, Any]) -> dict[str, Any]:
    """Take this source's options out of `kwargs`, refusing any other by name."""
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise TypeError(
            f"load_pgm(source={source!r}) got unknown option(s) {unknown}; expected {sorted(allowed)}"
        )
    return {**allowed, **kwargs}


def _check_choice(what: str, value: str, choices: Sequence[str], extra: str = "") -> None:
    """Refuse a value outside `choices`, naming them."""
    if value not in choices:
        raise ValueError(f"unknown PGM {what} {value!r}; expected one of {', '.join(choices)}{extra}")


def load_pgm(
    source: str = "generated",
    split: str = "train",
    regime: str = "neutral",
    data_dir: str | os.PathLike[str] | None = None,
    max_samples: int | None = None,
    seed: int = 0,
    panel_size: int = 80,
    streaming: bool | None = None,
    **kwargs: Any,
) -> torch.utils.data.Dataset | datasets.IterableDataset | datasets.Dataset:
    """Load a PGM split from one of PGM_SOURCES; every puzzle comes out in the schema (module docstring).

    Returns a map-style ``torch`` Dataset (generated; a DeepMind folder), a ``datasets.IterableDataset``
    (``streaming=True``; a DeepMind archive; the Hub, by default) or a ``datasets.Dataset`` (the Hub with
    ``streaming=False``).

    - ``split``: ``train``, ``val`` (``validation`` accepted) or ``test``.
    - ``regime``: one of REGIMES (DeepMind's names) for ``deepmind`` and ``generated``; only ``neutral`` for ``hub``.
    - ``data_dir``: deepmind: a folder of .npz or a .tar.gz (required); hub: a repo id (default
      HUB_REPO_ID) or an existing local Parquet folder/file (a missing path of the form owner/name is
      taken for a repo id); generated: unused.
    - ``max_samples``: at most that many puzzles (the first ones: sorted files, archive order, Hub order);
      generated: the number of puzzles (default: the generator's).
    - ``seed``: the generator's seed; for streamed sources the shuffle seed (with ``shuffle_buffer_size``).
    - ``panel_size``: the generated panels' side. DeepMind and Hub panels keep their stored size (160);
      the image processor resizes.
    - ``streaming``: None picks the source's natural form (see above).

    Options (``**kwargs``): deepmind: ``skip_bad_files`` (False), ``num_shards`` (folder: min(64, files);
    archive: 1), ``shuffle_buffer_size``; hub: ``cache_dir``, ``revision``, ``shuffle_buffer_size``;
    generated: ``num_shards`` (streaming only), ``keep_extra_keys`` (False: keep only the schema's keys;
    True with ``with_relations=True`` keeps the generator's ``relations``), anything else goes to
    ``PGMGenerator`` (e.g. ``max_triples``). ``shuffle_buffer_size`` (streamed
    datasets only) shuffles shard order and a buffer of that many puzzles with ``seed``.
    """
    _check_choice("source", source, PGM_SOURCES)
    split = "val" if split == "validation" else split
    _check_choice("split", split, SPLITS, " ('validation' is accepted for 'val')")
    if max_samples is not None and (not isinstance(max_samples, int) or max_samples < 1):
        raise ValueError(f"max_samples must be a positive integer or None, got {max_samples!r}")

    if source == "generated":
        num_shards = kwargs.pop("num_shards", None)
        keep_extra_keys = kwargs.pop("keep_extra_keys", False)
        module = _generator_module()
        _check_choice("regime", regime, tuple(module.REGIMES), " (generated)")
        _check_choice("split", split, tuple(module.SPLITS), " (generated)")
        generator_kwargs = dict(kwargs)
        if max_samples is not None:
            generator_kwargs["num_puzzles"] = max_samples
        generator = module.PGMGenerator(
            regime=regime, split=split, seed=seed, panel_size=panel_size, **generator_kwargs
        )
        dataset = GeneratedPGM(generator, keep_extra_keys=keep_extra_keys)
        if not streaming:
            return dataset
        return _map_style_to_iterable(dataset, num_shards or DEFAULT_FOLDER_SHARDS)

    if source == "deepmind":
        options = _pop_options(
            source, kwargs, {"skip_bad_files": False, "num_shards": None, "shuffle_buffer_size": None}
        )
        _check_choice("regime", regime, REGIMES, " (DeepMind's release)")
        if data_dir is None:
            raise ValueError(f"source='deepmind' needs data_dir. {_DEEPMIND_HELP}")
        path = Path(data_dir).expanduser()
        if not path.exists():
            raise FileNotFoundError(f"DeepMind PGM data_dir {str(path)!r} does not exist. {_DEEPMIND_HELP}")
        if _is_archive(path):
            if streaming is False:
                raise ValueError(
                    f"{str(path)!r} is an archive, which can only be streamed (streaming=True or None); "
                    "extract it and pass the folder for random access"
                )
            ds = _deepmind_tar(path, split, regime, options["skip_bad_files"], options["num_shards"] or 1)
            if max_samples is not None:
                ds = ds.take(max_samples)
        elif path.is_dir():
            ds = DeepMindPGMFolder(path, split, regime, max_samples, options["skip_bad_files"])
            if not streaming:
                if options["shuffle_buffer_size"] is not None:
                    raise ValueError("shuffle_buffer_size applies to streamed datasets only (streaming=True)")
                return ds
            ds = _map_style_to_iterable(ds, options["num_shards"] or DEFAULT_FOLDER_SHARDS)
        else:
            raise ValueError(f"DeepMind PGM data_dir {str(path)!r} is neither a folder nor a .tar.gz archive")
        if options["shuffle_buffer_size"]:
            ds = ds.shuffle(seed=seed, buffer_size=options["shuffle_buffer_size"])
        return ds

    options = _pop_options(source, kwargs, {"cache_dir": None, "revision": None, "shuffle_buffer_size": None})
    _check_choice(
        "regime", regime, HUB_REGIMES, f" ({HUB_REPO_ID} holds only that one; use source='deepmind')"
    )
    streaming = True if streaming is None else streaming
    if options["shuffle_buffer_size"] is not None and not streaming:
        raise ValueError("shuffle_buffer_size applies to streamed datasets only (streaming=True)")
    ds = _load_hub(
        None if data_dir is None else os.fspath(data_dir),
        split,
        max_samples,
        streaming,
        options["cache_dir"],
        options["revision"],
    )
    if options["shuffle_buffer_size"]:
        ds = ds.shuffle(seed=seed, buffer_size=options["shuffle_buffer_size"])
    return ds
