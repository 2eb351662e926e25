"""DeepMind's PGM release, read from files the user downloaded: a folder of `.npz` files or a regime's
`.tar.gz`.

github.com/google-deepmind/abstract-reasoning-matrices (README): the bucket ``ravens-matrices`` holds one
archive per generalisation regime (``neutral.tar.gz``, ``interpolation.tar.gz``, ... , REGIMES), each with
1.42M files ``PGM_<regime>_<train|val|test>_<id>.npz`` (TensorFlow Datasets' split table: train 1.2M, val 20k,
test 200k). Licence: "made available for the purposes of non-commercial research only"; nothing here fetches
it.

- A folder (searched recursively) is listed once, names only, kept in numpy arrays so that DataLoader workers
  do not copy them: :class:`DeepMindPGMFolder`, a map-style dataset of that many puzzles, each file opened
  when read.
- A ``.tar.gz`` is read as a stream, member by member, never extracted: :class:`DeepMindPGMArchive` behind a
  `PGMStream`. A gzip stream has no index, so counting its members takes one pass over the archive; that pass
  also checks every member's headers and reads a sample in full, and is kept (memory, and a small JSON file
  under ``index_dir``) for the next split and the next run. Each of ``num_shards`` shards reads the whole
  stream and keeps every ``num_shards``-th member: extracting the archive is faster when it is read more than
  once.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import tarfile
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .common import PGMCheckReport, PGMFileError, SkipLog
from .npz import inspect_deepmind_npz, read_deepmind_npz
from .streams import interleaved_rows, interleaved_shards, unknown_length_message

logger = logging.getLogger("ni_hf.data.pgm")

DEFAULT_FOLDER_SHARDS = 64
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".tar.bz2", ".tar.xz")
DEEPMIND_HELP = (
    "DeepMind's PGM data must be downloaded by you (non-commercial research licence): see "
    "https://github.com/google-deepmind/abstract-reasoning-matrices (bucket ravens-matrices, one "
    "<regime>.tar.gz per regime); pass data_dir= the extracted folder or the .tar.gz"
)
_DEEPMIND_NAME = re.compile(r"^PGM_(?P<regime>[A-Za-z.]+)_(?P<split>train|val|test)_(?P<id>\d+)\.npz$")
_ARCHIVE_ERRORS = (tarfile.TarError, EOFError, OSError, zlib.error)
_INDEX_VERSION = 1
ARCHIVE_SAMPLE = 64  # members of each split read in full by the counting pass


def parse_deepmind_name(name: str) -> tuple[str, str, int] | None:
    """(regime, split, id) of a DeepMind file name `PGM_<regime>_<split>_<id>.npz` (any folder), else None."""
    match = _DEEPMIND_NAME.match(os.path.basename(name))
    if match is None:
        return None
    return match["regime"], match["split"], int(match["id"])


def describe_found(found: Counter) -> str:
    """What a folder or archive held, for error messages."""
    if not found:
        return "nothing"
    return ", ".join(f"{key}: {count}" for key, count in sorted(found.items()))


def is_archive(path: Path) -> bool:
    """Whether `path` names a tar archive rather than a folder."""
    return path.is_file() and path.name.endswith(ARCHIVE_SUFFIXES)


def _evenly_spaced(count: int, among: int) -> list[int]:
    """`count` positions spread over range(among), first and last included."""
    if among == 0 or count <= 0:
        return []
    return sorted({int(i) for i in np.linspace(0, among - 1, min(count, among)).round()})


# ----------------------------------------------------------------------------------------------------------
# A folder of .npz files
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


def _inspect(path: str) -> str | None:
    try:
        inspect_deepmind_npz(path)
    except PGMFileError as error:
        return error.problem
    return None


def _inspect_all(paths: list[str], num_workers: int, what: str) -> list[tuple[int, str]]:
    """(index, problem) of every file whose headers are bad; `num_workers` threads (reads wait on I/O)."""
    from tqdm.auto import tqdm

    progress = {"desc": f"Checking the headers of {what}", "unit": "file", "total": len(paths)}
    progress["disable"] = len(paths) < 10_000
    if num_workers > 1:
        with ThreadPoolExecutor(num_workers) as pool:
            problems = list(tqdm(pool.map(_inspect, paths, chunksize=256), **progress))
    else:
        problems = [_inspect(path) for path in tqdm(paths, **progress)]
    return [(index, problem) for index, problem in enumerate(problems) if problem is not None]


class DeepMindPGMFolder(torch.utils.data.Dataset):
    """Map-style dataset over a folder of DeepMind `PGM_<regime>_<split>_<id>.npz` files, opened on access.

    With ``skip_bad_files`` a bad file is skipped (recorded in ``skip_log``, warned) and the next good file
    stands in so that indices stay valid; `check` finds the bad files before training and leaves them out.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        split: str = "train",
        regime: str = "neutral",
        max_samples: int | None = None,
        skip_bad_files: bool = False,
        skip_log: SkipLog | None = None,
        num_shards: int = DEFAULT_FOLDER_SHARDS,
    ) -> None:
        self.root = Path(data_dir)
        if not self.root.is_dir():
            raise FileNotFoundError(f"DeepMind PGM folder {str(self.root)!r} does not exist. {DEEPMIND_HELP}")
        self.split, self.regime, self.skip_bad_files = split, regime, skip_bad_files
        self.skip_log = skip_log if skip_log is not None else SkipLog()
        self.num_shards = num_shards
        self._dirs, self._dir_index, self._names, found = _scan_folder(self.root, regime, split)
        if len(self._names) == 0:
            raise FileNotFoundError(
                f"no PGM_{regime}_{split}_<id>.npz files in {str(self.root)!r} (searched recursively); "
                f"found {describe_found(found)}"
            )
        if max_samples is not None:
            self._dir_index, self._names = self._dir_index[:max_samples], self._names[:max_samples]

    def __len__(self) -> int:
        return len(self._names)

    @property
    def num_rows(self) -> int:
        return len(self)

    def describe(self) -> str:
        return f"{str(self.root)!r} ({self.regime} {self.split}, {len(self)} files)"

    def file_path(self, index: int) -> Path:
        """The path of the file behind puzzle `index`."""
        return self.root / self._dirs[self._dir_index[index]] / self._names[index].decode()

    def read_file(self, index: int) -> dict[str, Any]:
        """Read puzzle `index` from its file (raises :class:`PGMFileError` for a bad file)."""
        return read_deepmind_npz(self.file_path(index))

    def read_or_skip(self, index: int) -> dict[str, Any] | None:
        """Read puzzle `index`, or with `skip_bad_files` record it and return None for a bad file."""
        try:
            return self.read_file(index)
        except PGMFileError as error:
            if not self.skip_bad_files:
                raise
            self.skip_log.record(error.file, error.problem)
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

    @property
    def skipped_files(self) -> list[str]:
        """Every file skipped so far, by this process and its DataLoader workers."""
        return [where for where, _ in self.skip_log.entries()]

    def first(self, count: int) -> list[dict[str, Any]]:
        return [self[i] for i in range(min(count, len(self)))]

    def check(self, sample_size: int = 16, num_workers: int = 0, every_file: bool = True) -> PGMCheckReport:
        """Check every file's headers (``every_file``) and read `sample_size` files in full; leave the bad ones
        out (``skip_bad_files``) or refuse them, naming them."""
        paths = [str(self.file_path(i)) for i in range(len(self))]
        bad = dict(_inspect_all(paths, num_workers, self.describe())) if every_file else {}
        good = [i for i in range(len(self)) if i not in bad]
        sample = [good[k] for k in _evenly_spaced(sample_size, len(good))]
        for index in sample:
            try:
                self.read_file(index)
            except PGMFileError as error:
                bad[index] = error.problem
        report = PGMCheckReport(
            self.describe(),
            None,
            len(paths) if every_file else len(sample),
            len(sample),
            [(paths[i], bad[i]) for i in sorted(bad)],
            self.skip_bad_files,
        )
        if bad and self.skip_bad_files:
            for where, problem in report.bad:
                self.skip_log.record(where, problem)
            keep = np.asarray([i for i in range(len(self)) if i not in bad], dtype=np.int64)
            self._dir_index, self._names = self._dir_index[keep], self._names[keep]
        report.num_rows = len(self)
        report.raise_if_bad()
        return report

    # --- as a stream source (load_pgm(..., streaming=True)) ------------------------------------------------
    def shards(self) -> list[tuple[int, int]]:
        return interleaved_shards(len(self), self.num_shards)

    def shard_rows(self, shard: tuple[int, int]) -> int:
        return interleaved_rows(len(self), shard)

    def read_shard(self, shard: tuple[int, int]) -> Iterator[dict[str, Any]]:
        start, step = shard
        for index in range(start, len(self), step):
            puzzle = self.read_or_skip(index)
            if puzzle is not None:
                yield puzzle

    def unknown_length(self) -> str:  # never: a folder is counted when listed
        return unknown_length_message(self.describe(), "not listed")

    def __repr__(self) -> str:
        root, split, regime = str(self.root), self.split, self.regime
        return f"DeepMindPGMFolder({root!r}, split={split!r}, regime={regime!r}, files={len(self)})"


# ----------------------------------------------------------------------------------------------------------
# A .tar.gz archive
# ----------------------------------------------------------------------------------------------------------


def _open_tar_stream(path: Path) -> tarfile.TarFile:
    """Open an archive for sequential reading (gzip, bz2, xz or none)."""
    return tarfile.open(path, mode="r|*")


def archive_members(path: Path) -> Iterator[tuple[str, Callable[[], bytes]]]:
    """(name, read) of each file member in archive order; `read()` returns its bytes (call it before the
    next). A truncated or corrupt archive raises :class:`PGMFileError` naming the archive and the member."""
    current, count = None, 0
    with _open_tar_stream(path) as tar:
        while True:
            try:
                member = tar.next()
            except _ARCHIVE_ERRORS as err:
                where = f"after member {current!r}" if current else "before its first member"
                raise PGMFileError(
                    str(path),
                    f"is truncated or corrupt {where} ({count} members read; {type(err).__name__}: {err}); "
                    "expected a complete <regime>.tar.gz",
                ) from err
            if member is None:
                return
            current, count = member.name, count + 1
            if not member.isfile():
                continue

            def read(member: tarfile.TarInfo = member) -> bytes:
                try:
                    extracted = tar.extractfile(member)
                    if extracted is None:
                        raise tarfile.ReadError("not a regular file")
                    return extracted.read()
                except _ARCHIVE_ERRORS as err:
                    raise PGMFileError(
                        f"{path}:{member.name}",
                        f"is truncated or corrupt in the archive ({type(err).__name__}: {err}); "
                        "expected a complete <regime>.tar.gz",
                    ) from err

            yield member.name, read


@dataclass
class ArchiveIndex:
    """One pass over an archive: members per `PGM_<regime>_<split>`, members found bad, how many read."""

    counts: dict[str, int] = field(default_factory=dict)
    bad: list[tuple[str, str]] = field(default_factory=list)  # (member, problem)
    read_fully: dict[str, int] = field(default_factory=dict)
    checked: int = 0
    sample_size: int = 0


_INDEXES: dict[str, ArchiveIndex] = {}


def default_index_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ni_hf" / "pgm_archives"


def _index_key(path: Path) -> str:
    stat = path.stat()
    return hashlib.sha1(
        f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{_INDEX_VERSION}".encode()
    ).hexdigest()


def _scan(path: Path, sample_size: int) -> ArchiveIndex:
    """Count, header-check and sample-read every member of an archive in one pass."""
    index, counts, fully = ArchiveIndex(sample_size=sample_size), Counter(), Counter()
    started = last_log = time.monotonic()
    for name, read in archive_members(path):
        parsed = parse_deepmind_name(name)
        kind = "other members" if parsed is None else f"PGM_{parsed[0]}_{parsed[1]}"
        counts[kind] += 1
        if parsed is None:
            continue
        data, where = io.BytesIO(read()), f"{path}:{name}"
        try:
            inspect_deepmind_npz(data, where)
            if fully[kind] < sample_size:
                fully[kind] += 1
                read_deepmind_npz(data, where)
        except PGMFileError as error:
            index.bad.append((name, error.problem))
        index.checked += 1
        if time.monotonic() - last_log > 60:
            last_log = time.monotonic()
            logger.info(f"{path}: {index.checked} members checked in {last_log - started:.0f} s")
    index.counts, index.read_fully = dict(counts), dict(fully)
    return index


def scan_archive(
    path: Path, sample_size: int = 16, index_dir: str | os.PathLike[str] | None = None
) -> ArchiveIndex:
    """The archive's index: from memory, from ``index_dir`` (default ~/.cache/ni_hf/pgm_archives), or counted
    in one pass."""
    key = _index_key(path)
    cached = _INDEXES.get(key)
    stored = Path(index_dir) if index_dir is not None else default_index_dir()
    stored = stored / f"{key}.json"
    if cached is None and stored.is_file():
        try:
            cached = ArchiveIndex(**json.loads(stored.read_text()))
            cached.bad = [tuple(entry) for entry in cached.bad]  # type: ignore[misc]
        except (ValueError, TypeError) as err:
            logger.warning(f"ignoring the unreadable PGM archive index {stored} ({err})")
    if cached is not None and cached.sample_size >= sample_size:
        _INDEXES[key] = cached
        return cached
    logger.info(f"Counting and checking the members of {path} (one pass over the archive, kept in {stored})")
    index = _scan(path, max(sample_size, ARCHIVE_SAMPLE))
    _INDEXES[key] = index
    try:
        stored.parent.mkdir(parents=True, exist_ok=True)
        partial = stored.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps(asdict(index)))
        os.replace(partial, stored)
    except OSError as err:
        logger.warning(f"could not keep the PGM archive index in {stored} ({err}); the next run counts again")
    return index


class DeepMindPGMArchive:
    """The members `PGM_<regime>_<split>_<id>.npz` of a DeepMind archive, as a `PGMStream` source."""

    def __init__(
        self,
        path: Path,
        split: str,
        regime: str,
        max_samples: int | None = None,
        skip_bad_files: bool = False,
        num_shards: int = 1,
        index_dir: str | os.PathLike[str] | None = None,
        skip_log: SkipLog | None = None,
    ) -> None:
        try:  # fail early on a file that is not an archive; reads only the first header
            with _open_tar_stream(path) as tar:
                tar.next()
        except _ARCHIVE_ERRORS as err:
            raise PGMFileError(
                str(path), f"is not a readable tar archive ({err}); expected DeepMind's <regime>.tar.gz"
            ) from err
        self.path, self.split, self.regime = path, split, regime
        self.max_samples, self.skip_bad_files, self.num_shards = max_samples, skip_bad_files, num_shards
        self.index_dir = None if index_dir is None else os.fspath(index_dir)
        self.skip_log = skip_log if skip_log is not None else SkipLog()
        self.kind = f"PGM_{regime}_{split}"
        self.excluded: frozenset[str] = frozenset()
        self._index: ArchiveIndex | None = None

    def describe(self) -> str:
        return f"{str(self.path)!r} ({self.regime} {self.split})"

    def _mine(self, name: str) -> bool:
        parsed = parse_deepmind_name(name)
        return parsed is not None and parsed[:2] == (self.regime, self.split)

    def index(self, sample_size: int = 16) -> ArchiveIndex:
        """The archive's index (one pass the first time); with ``skip_bad_files`` its bad members left out."""
        if self._index is None or self._index.sample_size < sample_size:
            self._index = scan_archive(self.path, sample_size, self.index_dir)
            if self.kind not in self._index.counts:
                raise FileNotFoundError(
                    f"no {self.kind}_<id>.npz members in {str(self.path)!r}; found "
                    f"{describe_found(Counter(self._index.counts))}"
                )
            mine = {name for name, _ in self._index.bad if self._mine(name)}
            if self.skip_bad_files and mine - self.excluded:
                for name, problem in self._index.bad:
                    if name in mine - self.excluded:
                        self.skip_log.record(f"{self.path}:{name}", problem)
                self.excluded = frozenset(mine)
        return self._index

    @property
    def num_rows(self) -> int:
        rows = self.index().counts[self.kind] - len(self.excluded)
        return rows if self.max_samples is None else min(rows, self.max_samples)

    def check(self, sample_size: int = 16, num_workers: int = 0, every_file: bool = True) -> PGMCheckReport:
        """Every member's headers and `sample_size` members read in full, in the index's one pass."""
        index = self.index(sample_size)
        bad = [(f"{self.path}:{name}", problem) for name, problem in index.bad if self._mine(name)]
        report = PGMCheckReport(
            self.describe(),
            self.num_rows,
            index.counts[self.kind],
            index.read_fully.get(self.kind, 0),
            bad,
            self.skip_bad_files,
        )
        report.raise_if_bad()
        return report

    def shards(self) -> list[tuple[int, int]]:
        return [(start, self.num_shards) for start in range(self.num_shards)]

    def shard_rows(self, shard: tuple[int, int]) -> int:
        return interleaved_rows(self.num_rows, shard)

    def unknown_length(self) -> str:  # never: counted by one pass over the archive
        return unknown_length_message(self.describe(), "not counted")

    def read_shard(self, shard: tuple[int, int]) -> Iterator[dict[str, Any]]:
        """Every `step`-th good member from `start` (archive order), up to `max_samples` members in all."""
        start, step = shard
        matched, found = 0, Counter()
        for name, read in archive_members(self.path):
            parsed = parse_deepmind_name(name)
            found["other members" if parsed is None else f"PGM_{parsed[0]}_{parsed[1]}"] += 1
            if not self._mine(name) or name in self.excluded:
                continue
            if self.max_samples is not None and matched >= self.max_samples:
                return
            matched += 1
            if (matched - 1) % step != start:
                continue
            where, data = f"{self.path}:{name}", io.BytesIO(read())  # a broken archive stops here, named
            try:
                puzzle = read_deepmind_npz(data, name=where)
            except PGMFileError as error:
                if not self.skip_bad_files:
                    raise
                self.skip_log.record(where, error.problem)
                continue
            yield puzzle
        if matched == 0:
            raise FileNotFoundError(
                f"no {self.kind}_<id>.npz members in {str(self.path)!r}; found {describe_found(found)}"
            )
