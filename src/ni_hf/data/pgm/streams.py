"""Streamed PGM splits that know their length: `PGMStream` reads a source's shards, spread over DataLoader
workers and over ranks (`split_by_node`), shuffled with a buffer if asked.

A source (an archive, Parquet files, a folder or the generator) gives picklable shard descriptions, reads one
shard, and counts the puzzles of one where it can; `PGMStream` is a ``torch`` IterableDataset whose
``__len__`` is that count, so that Trainer derives the steps of an epoch from it. Where no count can be known,
``__len__`` raises a TypeError that says so and names ``--max_steps`` (Trainer reads that TypeError as "no
length").
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np
import torch

from .common import PGMCheckReport, SkipLog


class StreamSource(Protocol):
    """What `PGMStream` needs from a source."""

    skip_log: SkipLog
    num_rows: int | None  # puzzles in all shards; None when not known

    def describe(self) -> str: ...

    def shards(self) -> list[Any]: ...

    def shard_rows(self, shard: Any) -> int | None: ...

    def read_shard(self, shard: Any) -> Iterator[dict[str, Any]]: ...

    def check(self, sample_size: int, num_workers: int, every_file: bool) -> PGMCheckReport: ...

    def unknown_length(self) -> str: ...


def unknown_length_message(description: str, why: str) -> str:
    """The error for a split whose length cannot be known, naming what to pass instead."""
    return (
        f"the number of puzzles in {description} is not known ({why}); pass --max_steps to run_pgm.py "
        "(max_steps= to Trainer), or num_rows= to load_pgm if you know it"
    )


def _worker() -> tuple[int, int]:
    info = torch.utils.data.get_worker_info()
    return (0, 1) if info is None else (info.id, info.num_workers)


def _buffer_shuffle(items: Iterator[Any], size: int, rng: np.random.Generator) -> Iterator[Any]:
    """Shuffle a stream through a buffer of `size` items (as datasets.IterableDataset.shuffle does)."""
    buffer: list[Any] = []
    for item in items:
        if len(buffer) < size:
            buffer.append(item)
            continue
        slot = int(rng.integers(size))
        yield buffer[slot]
        buffer[slot] = item
    rng.shuffle(buffer)
    yield from buffer


class PGMStream(torch.utils.data.IterableDataset):
    """A streamed PGM split of known length where it can be known (``num_rows``; ``len()`` raises otherwise).

    Shards go to DataLoader workers and to ranks (``split_by_node``) whole when there are enough of them, else
    every n-th puzzle; ``shuffle_buffer_size`` shuffles the shard order and a buffer of puzzles with ``seed``
    and the epoch (``set_epoch``, which Trainer calls). ``num_rows`` counts the puzzles the source holds; a
    file skipped while streaming (``skip_bad_files``) makes an epoch that many puzzles shorter.
    """

    def __init__(
        self,
        source: StreamSource,
        seed: int = 0,
        shuffle_buffer_size: int | None = None,
        num_rows: int | None = None,
    ) -> None:
        self.source = source
        self.seed = seed
        self.shuffle_buffer_size = shuffle_buffer_size
        self.declared_rows = num_rows
        self.epoch = 0
        self.node = (0, 1)  # (rank, world size)

    # --- length -------------------------------------------------------------------------------------------
    @property
    def num_rows(self) -> int | None:
        """Puzzles this stream yields (this rank's share after `split_by_node`), None when not known."""
        rank, world = self.node
        total = self.declared_rows if self.declared_rows is not None else self.source.num_rows
        if world == 1 or total is None:
            return total
        shards = self.source.shards()
        if len(shards) < world:  # every world-th puzzle
            return len(range(rank, total, world))
        rows = [self.source.shard_rows(shard) for shard in shards[rank::world]]
        return None if any(count is None for count in rows) else sum(rows)

    def __len__(self) -> int:
        rows = self.num_rows
        if rows is None:
            raise TypeError(self.source.unknown_length())  # type: ignore[attr-defined]
        return rows

    # --- iteration ----------------------------------------------------------------------------------------
    @property
    def n_shards(self) -> int:
        return len(self.source.shards())

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def split_by_node(self, rank: int, world_size: int) -> PGMStream:
        """This stream's share for `rank` of `world_size` processes (disjoint shares that cover it)."""
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} out of range for world_size {world_size}")
        if self.node != (0, 1):
            raise ValueError("this stream is already one node's share; split the full stream")
        share = copy.copy(self)
        share.node = (rank, world_size)
        return share

    @staticmethod
    def _share(
        shards: list[Any], index: int, count: int, offset: int, stride: int
    ) -> tuple[list[Any], int, int]:
        """Shard `index` of `count` takers: whole shards when there are enough, else every count-th puzzle."""
        if count == 1:
            return shards, offset, stride
        if len(shards) >= count:
            return shards[index::count], offset, stride
        return shards, offset + index * stride, stride * count

    def __iter__(self) -> Iterator[dict[str, Any]]:
        (rank, world), (worker, workers) = self.node, _worker()
        shards, offset, stride = self._share(list(self.source.shards()), rank, world, 0, 1)
        if self.shuffle_buffer_size:  # the same order in every worker: seed and epoch only
            order = np.random.default_rng([self.seed, self.epoch]).permutation(len(shards))
            shards = [shards[i] for i in order]
        shards, offset, stride = self._share(shards, worker, workers, offset, stride)
        puzzles = itertools.chain.from_iterable(self.source.read_shard(shard) for shard in shards)
        puzzles = itertools.islice(puzzles, offset, None, stride)
        if self.shuffle_buffer_size:
            rng = np.random.default_rng([self.seed, self.epoch, rank, worker])
            puzzles = _buffer_shuffle(puzzles, self.shuffle_buffer_size, rng)
        yield from puzzles

    # --- what run scripts ask -----------------------------------------------------------------------------
    def first(self, count: int) -> list[dict[str, Any]]:
        """The first `count` puzzles of the first shards (unshuffled; reads only as far as needed)."""
        puzzles = itertools.chain.from_iterable(self.source.read_shard(s) for s in self.source.shards())
        return list(itertools.islice(puzzles, count))

    def check(self, sample_size: int = 16, num_workers: int = 0, every_file: bool = True) -> PGMCheckReport:
        """Check the source before training (see `check_pgm_source`)."""
        report = self.source.check(sample_size, num_workers, every_file)
        report.num_rows = self.num_rows  # after the check: skipped files are left out
        return report

    @property
    def skipped_files(self) -> list[str]:
        """Every file or row skipped so far, by this process and its DataLoader workers."""
        return [where for where, _ in self.source.skip_log.entries()]

    def __repr__(self) -> str:
        node = f", node={self.node}" if self.node != (0, 1) else ""
        return f"PGMStream({self.source.describe()}, shards={self.n_shards}{node})"


def interleaved_shards(length: int, num_shards: int) -> list[tuple[int, int]]:
    """(start, step) shards of `length` indices, at most `num_shards` of them."""
    num_shards = max(1, min(num_shards, length))
    return [(start, num_shards) for start in range(num_shards)]


def interleaved_rows(length: int, shard: tuple[int, int]) -> int:
    """How many of `length` indices a (start, step) shard holds."""
    start, step = shard
    return len(range(start, length, step))
