"""The Hugging Face Hub copy ``HuggingFaceM4/PGM`` (neutral regime only, Parquet, about 44 GB), or a local
folder of Parquet files in its layout.

HuggingFaceM4's conversion script reads the neutral ``.npz`` files and pushes splits ``train``,
``validation``, ``test`` with features ``panels`` (8 context images, PNG), ``choices`` (8 candidates),
``relation_structure_encoded`` (Array2D (4, 12) uint8), ``relation_structure`` (Array2D (1, 3) string),
``meta_target`` (Array2D (1, 12) uint8), ``target`` (uint8) and ``id`` (int32), in files
``data/<split>-000NN-of-000MM.parquet``. That the files on the Hub were made by exactly that script is not
confirmed, so other layouts are read too: ``panels`` with all 16 images, ``context`` + ``answers`` (TensorFlow
Datasets' names), an ``image`` array of 16 panels (as in the .npz), or 16 columns ``panel_0`` ...
``panel_15``; anything else is refused, listing the columns found and those expected.

Local files are read with pyarrow, one file per shard; their row counts come from the Parquet footers, so the
length is known without reading a row, and a bad row is named by file and row. Images are decoded here (not by
``datasets``), so that a corrupt PNG is named too. A Hub repo id is read through ``datasets.load_dataset``;
its length is the dataset info's split size where the Hub gives one.
"""

from __future__ import annotations

import io
import logging
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow.parquet as pq
import torch

from .common import (
    NUM_PANELS,
    PGMCheckReport,
    PGMFileError,
    SkipLog,
    as_uint8,
    make_puzzle,
    panels_from_image,
)
from .streams import unknown_length_message

logger = logging.getLogger("ni_hf.data.pgm")

HUB_REPO_ID = "HuggingFaceM4/PGM"
HUB_REGIMES = ("neutral",)
HUB_SPLIT_NAMES = {"train": "train", "val": "validation", "test": "test"}
HUB_EXPECTED = (
    "'panels' (8 context images) and 'choices' (8 candidates) as in HuggingFaceM4/PGM; or 'panels' with all "
    "16 images; or 'context' and 'answers'; or an 'image' array of 16 panels; or 16 columns "
    "panel_0..panel_15; "
    "plus 'target', 'meta_target' and 'relation_structure_encoded'"
)
_LABELS = ("target", "meta_target", "relation_structure_encoded")
_PANEL_COLUMN = re.compile(r"^(?:panel|image)_?(\d+)$")

Layout = tuple[str, tuple[str, ...]]  # (kind, the columns holding panels, in order)


def hub_layout(columns: Sequence[str], where: str) -> Layout:
    """How the rows of a table with these columns hold the 16 panels (else refuse, listing the columns)."""
    present = set(columns)
    per_panel = sorted((int(m[1]), name) for name in columns if (m := _PANEL_COLUMN.match(name)) is not None)
    if all(key in present for key in _LABELS):
        if {"panels", "choices"} <= present:
            return "lists", ("panels", "choices")
        if {"context", "answers"} <= present:
            return "lists", ("context", "answers")
        if "panels" in present:
            return "lists", ("panels",)
        if "image" in present:
            return "image", ("image",)
        if [index for index, _ in per_panel] == list(range(NUM_PANELS)):
            return "columns", tuple(name for _, name in per_panel)
    raise ValueError(f"{where} has columns {sorted(present)}; expected {HUB_EXPECTED}")


def _panel(value: Any, where: str, number: int) -> np.ndarray:
    """One panel (an undecoded {'bytes', 'path'} image, a PIL image or an array) as a 2-D uint8 array."""
    from PIL import Image

    what = f"panel {number}"
    try:
        if isinstance(value, Mapping) and value.get("bytes") is not None:
            value = Image.open(io.BytesIO(value["bytes"]))
        elif isinstance(value, Mapping) and value.get("path"):
            value = Image.open(value["path"])
        if isinstance(value, Image.Image):
            value = value if value.mode == "L" else value.convert("L")
        array = np.asarray(value)
    except Exception as err:  # PIL's errors for a truncated or corrupt image file
        raise PGMFileError(
            where, f"{what} cannot be decoded as an image ({type(err).__name__}: {err})"
        ) from err
    if array.ndim == 3 and array.shape[-1] == 1:
        array = array[..., 0]
    if array.ndim != 2:
        raise PGMFileError(where, f"{what} has shape {array.shape}; expected a 2-D gray image")
    return as_uint8(array, where, what)


def _panels(row: Mapping[str, Any], layout: Layout, where: str) -> np.ndarray:
    kind, columns = layout
    if kind == "image":
        return panels_from_image(row["image"], where)
    values = (
        [value for column in columns for value in row[column]]
        if kind == "lists"
        else [row[c] for c in columns]
    )
    if len(values) != NUM_PANELS:
        raise PGMFileError(where, f"has {len(values)} panels; expected 16 (8 context, then 8 candidates)")
    panels = [_panel(value, where, number) for number, value in enumerate(values)]
    if len({panel.shape for panel in panels}) != 1:
        raise PGMFileError(
            where, f"panel shapes differ: {sorted({p.shape for p in panels})}; expected one shape"
        )
    return np.stack(panels)


def hub_row_to_puzzle(row: Mapping[str, Any], layout: Layout, where: str) -> dict[str, Any]:
    """One row in the Hub's layout, in the schema."""
    if "id" in row:
        where = f"{where} (id={row['id']})"
    return make_puzzle(
        _panels(row, layout, where),
        row["target"],
        row["meta_target"],
        row["relation_structure_encoded"],
        where,
    )


def local_parquet_files(root: Path, split: str) -> list[str]:
    """The Parquet files of `split` below `root` (Hub naming), or refuse listing what is there."""
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


def _footer(file: str) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(file)
    except Exception as err:  # pyarrow's errors for a file that is not Parquet or is truncated
        raise PGMFileError(file, f"cannot be read as Parquet ({type(err).__name__}: {err})") from err


class HubParquetFiles:
    """Local Parquet files in the Hub's layout, as a `PGMStream` source: one shard per file, rows counted from
    the footers, rows named by file and row."""

    def __init__(
        self,
        files: list[str],
        label: str,
        max_samples: int | None,
        skip_bad_files: bool,
        skip_log: SkipLog | None,
    ) -> None:
        self.label, self.skip_bad_files = label, skip_bad_files
        self.skip_log = skip_log if skip_log is not None else SkipLog()
        self.layout: Layout | None = None
        self.rows: list[tuple[str, int]] = []  # (file, rows read from it), files in order
        remaining = max_samples
        for file in files:
            footer = _footer(file)
            layout = hub_layout(footer.schema_arrow.names, file)
            if self.layout is not None and layout != self.layout:
                raise ValueError(
                    f"{file} holds its panels as {layout}; the split's other files as {self.layout}"
                )
            self.layout = layout
            rows = footer.metadata.num_rows if remaining is None else min(remaining, footer.metadata.num_rows)
            if rows:
                self.rows.append((file, rows))
            remaining = None if remaining is None else remaining - rows
        self.excluded: frozenset[tuple[str, int]] = frozenset()

    def describe(self) -> str:
        return f"{self.label}, {len(self.rows)} Parquet file(s)"

    @property
    def num_rows(self) -> int:
        return sum(rows for _, rows in self.rows) - len(self.excluded)

    def shards(self) -> list[tuple[str, int]]:
        return list(self.rows)

    def shard_rows(self, shard: tuple[str, int]) -> int:
        return shard[1] - sum(1 for file, _ in self.excluded if file == shard[0])

    def unknown_length(self) -> str:  # never: counted from the footers
        return unknown_length_message(self.describe(), "no footer")

    def _rows(self, file: str, count: int) -> Iterator[tuple[int, dict[str, Any]]]:
        number = 0
        for batch in _footer(file).iter_batches(batch_size=16):
            for row in batch.to_pylist():
                if number >= count:
                    return
                yield number, row
                number += 1

    def read_shard(self, shard: tuple[str, int]) -> Iterator[dict[str, Any]]:
        file, count = shard
        for number, row in self._rows(file, count):
            if (file, number) in self.excluded:
                continue
            try:
                puzzle = hub_row_to_puzzle(row, self.layout, f"{file} row {number}")  # type: ignore[arg-type]
            except PGMFileError as error:
                if not self.skip_bad_files:
                    raise
                self.skip_log.record(error.file, error.problem)
                continue
            yield puzzle

    def check(self, sample_size: int = 16, num_workers: int = 0, every_file: bool = True) -> PGMCheckReport:
        """Every file's footer and columns (read when the split was loaded) and `sample_size` rows in full,
        spread over the files (first rows of each)."""
        per_file = max(1, -(-sample_size // max(1, len(self.rows))))
        bad, read = [], 0
        for file, count in self.rows:
            for number, row in self._rows(file, min(count, per_file, sample_size - read)):
                read += 1
                try:
                    hub_row_to_puzzle(row, self.layout, f"{file} row {number}")  # type: ignore[arg-type]
                except PGMFileError as error:
                    bad.append(((file, number), error))
        report = PGMCheckReport(
            self.describe(),
            None,
            len(self.rows),
            read,
            [(e.file, e.problem) for _, e in bad],
            self.skip_bad_files,
        )
        if bad and self.skip_bad_files:
            for _, error in bad:
                self.skip_log.record(error.file, error.problem)
            self.excluded = self.excluded | {key for key, _ in bad}
        report.num_rows = self.num_rows
        report.raise_if_bad()
        return report


class HubRepoStream:
    """A Hub repo's split through ``datasets`` streaming (images left undecoded), as a `PGMStream` source."""

    def __init__(
        self,
        stream: datasets.IterableDataset,
        label: str,
        num_rows: int | None,
        skip_bad_files: bool,
        skip_log: SkipLog | None,
        limited: bool = False,
    ) -> None:
        self.stream, self.label, self.skip_bad_files = stream.decode(False), label, skip_bad_files
        self.skip_log = skip_log if skip_log is not None else SkipLog()
        columns = stream.column_names or list(next(iter(self.stream)).keys())
        self.layout = hub_layout(columns, label)
        self.num_rows, self.limited = num_rows, limited

    def describe(self) -> str:
        return self.label

    def shards(self) -> list[tuple[int, int]]:
        if self.limited:  # the first max_samples rows: one shard, so that no share of them is cut again
            return [(0, 1)]
        return [(index, self.stream.num_shards) for index in range(self.stream.num_shards)]

    def shard_rows(self, shard: tuple[int, int]) -> int | None:
        return None

    def unknown_length(self) -> str:
        return unknown_length_message(self.label, "the Hub's dataset info gives no size for this split")

    def read_shard(self, shard: tuple[int, int]) -> Iterator[dict[str, Any]]:
        index, count = shard
        rows = self.stream if count == 1 else self.stream.shard(num_shards=count, index=index)
        for number, row in enumerate(rows):
            try:
                puzzle = hub_row_to_puzzle(row, self.layout, f"{self.label} shard {index} row {number}")
            except PGMFileError as error:
                if not self.skip_bad_files:
                    raise
                self.skip_log.record(error.file, error.problem)
                continue
            yield puzzle

    def check(self, sample_size: int = 16, num_workers: int = 0, every_file: bool = True) -> PGMCheckReport:
        """The columns, and the first `sample_size` rows read in full."""
        bad, read = [], 0
        for number, row in enumerate(self.stream.take(sample_size)):
            read += 1
            try:
                hub_row_to_puzzle(row, self.layout, f"{self.label} row {number}")
            except PGMFileError as error:
                bad.append((error.file, error.problem))
        report = PGMCheckReport(self.label, self.num_rows, 1, read, bad, self.skip_bad_files)
        if self.skip_bad_files:
            for where, problem in bad:
                self.skip_log.record(where, problem)
        report.raise_if_bad()
        return report


class HubPGMRows(torch.utils.data.Dataset):
    """Map-style rows of a downloaded split (``streaming=False``), mapped to the schema on access; a bad row
    is named by file and row where the files are local."""

    def __init__(
        self,
        dataset: datasets.Dataset,
        label: str,
        files: list[str] | None,
        skip_bad_files: bool,
        skip_log: SkipLog | None,
    ) -> None:
        self.dataset, self.label, self.skip_bad_files = dataset.with_format("arrow"), label, skip_bad_files
        self.skip_log = skip_log if skip_log is not None else SkipLog()
        self.layout = hub_layout(dataset.column_names, label)
        self.rows = np.arange(len(dataset))
        self.files = files
        self.starts = np.cumsum([0] + [_footer(f).metadata.num_rows for f in files]) if files else None

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def num_rows(self) -> int:
        return len(self)

    def describe(self) -> str:
        return f"{self.label} ({len(self)} rows)"

    def _where(self, row: int) -> str:
        if self.starts is None:
            return f"{self.label} row {row}"
        file = int(np.searchsorted(self.starts, row, side="right")) - 1
        return f"{self.files[file]} row {row - int(self.starts[file])}"  # type: ignore[index]

    def read_row(self, index: int) -> dict[str, Any]:
        row = int(self.rows[index])
        return hub_row_to_puzzle(self.dataset[row].to_pylist()[0], self.layout, self._where(row))

    def __getitem__(self, index: int) -> dict[str, Any]:
        if not -len(self) <= index < len(self):
            raise IndexError(f"PGM index {index} out of range for {len(self)} rows")
        for offset in range(len(self)):
            try:
                return self.read_row((index + offset) % len(self))
            except PGMFileError as error:
                if not self.skip_bad_files:
                    raise
                self.skip_log.record(error.file, error.problem)
        raise PGMFileError(self.label, "every row is bad")

    @property
    def skipped_files(self) -> list[str]:
        return [where for where, _ in self.skip_log.entries()]

    def first(self, count: int) -> list[dict[str, Any]]:
        return [self[i] for i in range(min(count, len(self)))]

    def check(self, sample_size: int = 16, num_workers: int = 0, every_file: bool = True) -> PGMCheckReport:
        """The columns, and `sample_size` rows spread over the split read in full."""
        sample = sorted({int(i) for i in np.linspace(0, len(self) - 1, min(sample_size, len(self))).round()})
        bad = {}
        for index in sample:
            try:
                self.read_row(index)
            except PGMFileError as error:
                bad[index] = (error.file, error.problem)
        report = PGMCheckReport(
            self.describe(), None, 1, len(sample), list(bad.values()), self.skip_bad_files
        )
        if bad and self.skip_bad_files:
            for where, problem in bad.values():
                self.skip_log.record(where, problem)
            self.rows = np.delete(self.rows, sorted(bad))
        report.num_rows = len(self)
        report.raise_if_bad()
        return report
