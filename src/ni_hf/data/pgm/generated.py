"""Puzzles from :mod:`ni_hf.data.pgm_generator`, the package's offline PGM-style generator, as a dataset.

Deterministic per index: item ``i`` of a (regime, split, seed) is always the same puzzle, so the dataset is
map-style with a known length (the generator's ``num_puzzles``); ``streaming=True`` reads it as interleaved
index shards of a `PGMStream`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from .common import SCHEMA_KEYS, NoSkips, PGMCheckReport, PGMFileError, make_puzzle
from .streams import interleaved_rows, interleaved_shards, unknown_length_message


def generator_module() -> Any:
    """:mod:`ni_hf.data.pgm_generator` (a function so that tests can stand in for it)."""
    from ni_hf.data import pgm_generator

    return pgm_generator


class GeneratedPGM(torch.utils.data.Dataset):
    """Map-style view of a `PGMGenerator` that keeps the schema's keys (and checks them)."""

    def __init__(self, generator: Any, keep_extra_keys: bool = False, num_shards: int = 64) -> None:
        self.generator = generator
        self.keep_extra_keys = keep_extra_keys
        self.num_shards = num_shards
        self.skip_log = NoSkips()

    def __len__(self) -> int:
        return len(self.generator)

    @property
    def num_rows(self) -> int:
        return len(self)

    def describe(self) -> str:
        return f"generated puzzles ({self.generator!r})"

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

    @property
    def skipped_files(self) -> list[str]:
        return []

    def first(self, count: int) -> list[dict[str, Any]]:
        return [self[i] for i in range(min(count, len(self)))]

    def check(self, sample_size: int = 16, num_workers: int = 0, every_file: bool = True) -> PGMCheckReport:
        """Generate and check `sample_size` puzzles spread over the split (a generator bug fails here)."""
        sample = sorted({int(i) for i in np.linspace(0, len(self) - 1, min(sample_size, len(self))).round()})
        for index in sample:
            self[index]
        return PGMCheckReport(self.describe(), len(self), 0, len(sample))

    # --- as a stream source -------------------------------------------------------------------------------
    def shards(self) -> list[tuple[int, int]]:
        return interleaved_shards(len(self), self.num_shards)

    def shard_rows(self, shard: tuple[int, int]) -> int:
        return interleaved_rows(len(self), shard)

    def read_shard(self, shard: tuple[int, int]) -> Iterator[dict[str, Any]]:
        start, step = shard
        for index in range(start, len(self), step):
            yield self[index]

    def unknown_length(self) -> str:  # never
        return unknown_length_message(self.describe(), "no generator")
