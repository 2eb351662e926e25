"""What every PGM source shares: the puzzle schema, the checks of one puzzle, the error that names its file,
the record of skipped files and the report of a pre-training check.

One puzzle, from any source, is a dict (the *schema*)::

    panels                      np.uint8 (16, H, W): the 8 context panels of the incomplete 3x3 matrix
                                (row-major), then the 8 candidate panels
    target                      int 0-7, the correct candidate
    meta_target                 np.uint8 (12,), bits in DeepMind's order (META_TARGET_NAMES): shape,
                                line, color, number, position, size, type, progression, XOR, OR, AND,
                                consistent_union
    relation_structure_encoded  np.uint8 (4, 12), one row per (object, attribute, relation) triple, same
                                columns (rows of zeros pad puzzles with fewer than 4 triples)

``meta_target`` is the OR of the structure's rows (DeepMind's README); a puzzle where they disagree is
refused.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# DeepMind's names, defined once in the generator: the columns of meta_target, the regimes, the splits.
from ni_hf.data.pgm_generator import META_TARGET_NAMES, REGIMES, SPLITS, TRIPLES

logger = logging.getLogger("ni_hf.data.pgm")

PGM_SOURCES = ("generated", "deepmind", "hub")
SCHEMA_KEYS = ("panels", "target", "meta_target", "relation_structure_encoded")
NUM_PANELS = 16
OBJECTS = tuple(dict.fromkeys(triple[0] for triple in TRIPLES))
ATTRIBUTES = tuple(name for name in META_TARGET_NAMES if name in {triple[1] for triple in TRIPLES})
RELATION_TYPES = tuple(name for name in META_TARGET_NAMES if name in {triple[2] for triple in TRIPLES})
_GROUPS = {"object": OBJECTS, "attribute": ATTRIBUTES, "relation": RELATION_TYPES}
_COLUMNS = {kind: [META_TARGET_NAMES.index(name) for name in names] for kind, names in _GROUPS.items()}

__all__ = [
    "ATTRIBUTES",
    "META_TARGET_NAMES",
    "NUM_PANELS",
    "OBJECTS",
    "PGMCheckReport",
    "PGMFileError",
    "PGM_SOURCES",
    "REGIMES",
    "RELATION_TYPES",
    "SCHEMA_KEYS",
    "SPLITS",
    "NoSkips",
    "SkipLog",
    "check_image_layout",
    "make_puzzle",
    "panels_from_image",
]


class PGMFileError(ValueError):
    """A PGM file or row that does not hold a puzzle in the expected layout; `file` names it."""

    def __init__(self, file: str, problem: str) -> None:
        super().__init__(f"{file}: {problem}")
        self.file = file
        self.problem = problem


# ----------------------------------------------------------------------------------------------------------
# The parts of one puzzle
# ----------------------------------------------------------------------------------------------------------


def as_uint8(array: np.ndarray, where: str, what: str) -> np.ndarray:
    """Cast an integer array with values in 0-255 to uint8; refuse floats, other types, other values."""
    if array.dtype == np.uint8:
        return array
    if array.dtype.kind not in "ui" or array.size == 0:
        raise PGMFileError(
            where, f"{what} has dtype {array.dtype}; expected integers 0-255 (DeepMind's files hold uint8)"
        )
    low, high = array.min(), array.max()
    if low < 0 or high > 255:
        raise PGMFileError(where, f"{what} has values {low}..{high}; expected integers 0-255")
    return array.astype(np.uint8)


def check_image_layout(shape: tuple[int, ...], dtype: np.dtype, where: str) -> int:
    """Check DeepMind's `image` from its shape and dtype alone (no pixels read); return the panel side."""
    size = math.prod(shape)
    side = math.isqrt(size // NUM_PANELS) if size else 0
    if size == 0 or NUM_PANELS * side * side != size:
        raise PGMFileError(
            where,
            f"'image' has shape {tuple(shape)}; expected 16 square panels (160x160x16 in DeepMind's files)",
        )
    if np.dtype(dtype).kind not in "ui":
        raise PGMFileError(
            where, f"'image' has dtype {dtype}; expected integers 0-255 (DeepMind's files hold uint8)"
        )
    return side


def panels_from_image(image: Any, where: str) -> np.ndarray:
    """DeepMind's `image` (160x160x16 as stored, or flat, or 16xHxW) as (16, side, side) uint8."""
    image = np.asarray(image)
    side = check_image_layout(image.shape, image.dtype, where)
    # DeepMind's README: the stored array is panel-major despite its 160x160x16 label: reshape, not transpose.
    return as_uint8(image.reshape(NUM_PANELS, side, side), where, "'image'")


def _bits(value: Any, shape: tuple[int, ...], where: str, what: str) -> np.ndarray:
    """`value` as a uint8 0/1 array of `shape` (any layout with that many elements)."""
    array = np.asarray(value)
    expected = f"{math.prod(shape)} bits, shape {shape}"
    if array.size != math.prod(shape) or array.dtype.kind not in "uifb":
        raise PGMFileError(where, f"{what} has shape {array.shape} ({array.dtype}); expected {expected}")
    array = array.reshape(shape)
    if not np.isin(array, (0, 1)).all():
        raise PGMFileError(where, f"{what} has values other than 0 and 1; expected {expected}")
    return array.astype(np.uint8)


def _target(value: Any, where: str) -> int:
    """The target as an int 0-7."""
    array = np.asarray(value)
    if array.size != 1 or array.dtype.kind not in "uif" or not np.isfinite(array).all():
        raise PGMFileError(where, f"'target' is {value!r}; expected one integer 0-7")
    number = array.reshape(())
    if float(number) != int(number):
        raise PGMFileError(where, f"'target' is {value!r}; expected one integer 0-7")
    if not 0 <= int(number) <= 7:
        raise PGMFileError(
            where, f"'target' is {int(number)}; expected an integer 0-7 (the correct candidate)"
        )
    return int(number)


def _names(bits: np.ndarray) -> list[str]:
    return [name for name, bit in zip(META_TARGET_NAMES, bits, strict=True) if bit]


def _check_structure(meta_target: np.ndarray, structure: np.ndarray, where: str) -> None:
    """Each structure row is one (object, attribute, relation) triple or zeros; meta_target is their OR."""
    for row_index, row in enumerate(structure):
        counts = {kind: int(row[columns].sum()) for kind, columns in _COLUMNS.items()}
        if row.any() and set(counts.values()) != {1}:
            raise PGMFileError(
                where,
                f"'relation_structure_encoded' row {row_index} marks {_names(row)}; expected one object "
                f"{OBJECTS}, one attribute {ATTRIBUTES} and one relation {RELATION_TYPES}, or a row of zeros",
            )
    if not structure.any():
        raise PGMFileError(where, "'relation_structure_encoded' holds no triple; expected 1 to 4 rows set")
    union = structure.max(axis=0)
    if not np.array_equal(meta_target, union):
        raise PGMFileError(
            where,
            f"'meta_target' marks {_names(meta_target)} but the rows of 'relation_structure_encoded' mark "
            f"{_names(union)}; expected meta_target to be the OR of the structure's rows (DeepMind's README)",
        )


def check_labels(
    target: Any, meta_target: Any, structure: Any, where: str
) -> tuple[int, np.ndarray, np.ndarray]:
    """Check a puzzle's target, meta_target and structure; return them as int, (12,) and (4, 12) uint8."""
    checked = (
        _target(target, where),
        _bits(meta_target, (12,), where, "'meta_target'"),
        _bits(structure, (4, 12), where, "'relation_structure_encoded'"),
    )
    _check_structure(checked[1], checked[2], where)
    return checked


def make_puzzle(panels: Any, target: Any, meta_target: Any, structure: Any, where: str) -> dict[str, Any]:
    """Check one puzzle's parts and return it in the schema (`panels` must already be (16, H, W))."""
    panels = np.asarray(panels)
    if panels.ndim != 3 or panels.shape[0] != NUM_PANELS:
        raise PGMFileError(where, f"panels have shape {panels.shape}; expected (16, H, W)")
    target, meta_target, structure = check_labels(target, meta_target, structure, where)
    return {
        "panels": as_uint8(panels, where, "panels"),
        "target": target,
        "meta_target": meta_target,
        "relation_structure_encoded": structure,
    }


# ----------------------------------------------------------------------------------------------------------
# Skipped files and the pre-training check
# ----------------------------------------------------------------------------------------------------------


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


class SkipLog:
    """The bad files or rows a dataset skipped, one line each in a file, so that the skips of DataLoader
    workers (and of anything else sharing the path) count too; a temporary file unless `path` is given."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        if path is None:
            handle, path = tempfile.mkstemp(prefix="ni_hf_pgm_skipped_", suffix=".tsv")
            os.close(handle)
            atexit.register(_remove, path)  # in this process only: workers end without running atexit
        self.path = os.fspath(path)
        Path(self.path).touch()

    def record(self, where: str, problem: str) -> None:
        """Append one skipped file or row and warn, naming it and counting the skips so far."""
        line = f"{where}\t{problem}".replace("\n", " ")
        with open(self.path, "a", encoding="utf-8") as file:
            file.write(line + "\n")
        logger.warning("skipping bad PGM file (%d skipped so far): %s: %s", len(self), where, problem)

    def entries(self) -> list[tuple[str, str]]:
        """Every (file or row, problem) skipped so far."""
        try:
            lines = Path(self.path).read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return []
        return [(*line.split("\t", 1), "")[:2] for line in lines]  # type: ignore[misc]

    def __len__(self) -> int:
        return len(self.entries())


class NoSkips:
    """The skip record of a source that never skips (generated puzzles)."""

    path = None

    def record(self, where: str, problem: str) -> None:
        raise PGMFileError(where, problem)

    def entries(self) -> list[tuple[str, str]]:
        return []

    def __len__(self) -> int:
        return 0


@dataclass
class PGMCheckReport:
    """What a pre-training check of one split looked at and found (`check_pgm_source`)."""

    source: str
    num_rows: int | None  # puzzles the dataset serves after the check (None: not known)
    checked: int  # files, members or rows whose headers (or schema) were checked
    read_fully: int  # puzzles read and checked in full
    bad: list[tuple[str, str]] = field(default_factory=list)  # (file or row, problem)
    skipped: bool = False  # whether the bad ones were left out (skip_bad_files) rather than refused

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary, for a results file (the first 20 bad files named)."""
        return {
            "source": self.source,
            "num_rows": self.num_rows,
            "checked": self.checked,
            "read_fully": self.read_fully,
            "num_bad": len(self.bad),
            "bad": [f"{where}: {problem}" for where, problem in self.bad[:20]],
            "skipped": self.skipped,
        }

    def raise_if_bad(self) -> None:
        """Refuse the split, naming its first bad files, unless they were skipped."""
        if self.bad and not self.skipped:
            (where, problem), rest = self.bad[0], self.bad[1:]
            others = (
                f"; {len(rest)} more bad: "
                + "; ".join(f"{w}: {p}" for w, p in rest[:5])
                + (" ..." if len(rest) > 5 else "")
                if rest
                else ""
            )
            raise PGMFileError(
                where,
                f"{problem}{others} (found checking {self.source}; to leave bad files out pass "
                "skip_bad_files=True, or run_pgm.py --skip_bad_files)",
            )
