"""PGM abstract-reasoning puzzles (Barrett et al. 2018; the Neural Interpreters paper's section 4.3) from
three sources, every puzzle in one schema (`common`): `load_pgm` is the entry point.

- ``"deepmind"`` (`deepmind`): DeepMind's release under ``data_dir``, a folder of
  ``PGM_<regime>_<split>_<id>.npz`` (a map-style dataset) or a regime's ``.tar.gz`` (a `PGMStream`, counted in
  one pass that is kept).
- ``"hub"`` (`hub`): ``HuggingFaceM4/PGM`` (the neutral regime) or a local folder of Parquet in its layout
  (a `PGMStream` by default, rows counted from the Parquet footers; ``streaming=False``: map-style rows).
- ``"generated"`` (`generated`): the package's offline generator (map-style, any regime).

Every split knows its length where it can be known (``len()``, ``num_rows``; `pgm_num_rows`), so that Trainer
derives its steps; where it cannot, ``len()`` raises a TypeError naming ``--max_steps``. Before training,
`check_pgm_source` checks what can be checked cheaply (every file's headers, a sample read in full) and, with
``skip_bad_files=True``, leaves the bad files out and counts them (``skipped_files``); a bad file met later is
skipped and counted the same way, across DataLoader workers. `first_puzzles` takes the first puzzles of any
split.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import datasets
import torch

from . import generated
from .common import (
    ATTRIBUTES,
    META_TARGET_NAMES,
    NUM_PANELS,
    OBJECTS,
    PGM_SOURCES,
    REGIMES,
    RELATION_TYPES,
    SCHEMA_KEYS,
    SPLITS,
    PGMCheckReport,
    PGMFileError,
    SkipLog,
    make_puzzle,
)
from .deepmind import (
    DEEPMIND_HELP,
    DEFAULT_FOLDER_SHARDS,
    DeepMindPGMArchive,
    DeepMindPGMFolder,
    is_archive,
    parse_deepmind_name,
    scan_archive,
)
from .generated import GeneratedPGM
from .hub import (
    HUB_REGIMES,
    HUB_REPO_ID,
    HUB_SPLIT_NAMES,
    HubParquetFiles,
    HubPGMRows,
    HubRepoStream,
    local_parquet_files,
)
from .npz import inspect_deepmind_npz, read_deepmind_npz
from .streams import PGMStream

__all__ = [
    "ATTRIBUTES",
    "DEFAULT_FOLDER_SHARDS",
    "DeepMindPGMArchive",
    "DeepMindPGMFolder",
    "GeneratedPGM",
    "HUB_REGIMES",
    "HUB_REPO_ID",
    "HUB_SPLIT_NAMES",
    "HubPGMRows",
    "META_TARGET_NAMES",
    "NUM_PANELS",
    "OBJECTS",
    "PGMCheckReport",
    "PGMFileError",
    "PGMStream",
    "PGM_SOURCES",
    "REGIMES",
    "RELATION_TYPES",
    "SCHEMA_KEYS",
    "SPLITS",
    "SkipLog",
    "check_pgm_source",
    "first_puzzles",
    "inspect_deepmind_npz",
    "load_pgm",
    "make_puzzle",
    "parse_deepmind_name",
    "pgm_num_rows",
    "read_deepmind_npz",
    "scan_archive",
    "skipped_files",
]


# ----------------------------------------------------------------------------------------------------------
# What a run script asks of a split
# ----------------------------------------------------------------------------------------------------------


def check_pgm_source(
    dataset: Any, sample_size: int = 16, num_workers: int = 0, every_file: bool = True
) -> PGMCheckReport:
    """Check a split from `load_pgm` before training, and return what was checked and found.

    DeepMind folder: every file's headers (keys, ``image``'s shape, dtype and stored size, the labels in full,
    without reading pixels; ``num_workers`` threads) and ``sample_size`` files read in full. Archive: the
    same, for every member, in the one pass that counts them. Hub Parquet: every file's footer and columns and
    ``sample_size`` rows decoded in full. Generated: ``sample_size`` puzzles. With ``skip_bad_files=True``
    (given to `load_pgm`) the bad files found are left out (the length shrinks to match) and recorded in the
    split's ``skipped_files``; without it the first bad file is refused, naming it, its problem and how many
    more. ``every_file=False`` checks only the sample of a folder (one open of each of its files is the cost of
    a full check); an archive's members and the Parquet footers are checked whole at no extra cost.
    """
    check = getattr(dataset, "check", None)
    if not callable(check):
        raise TypeError(f"check_pgm_source takes a split from load_pgm, got {type(dataset).__name__}")
    return check(sample_size=sample_size, num_workers=num_workers, every_file=every_file)


def pgm_num_rows(dataset: Any) -> int | None:
    """The number of puzzles of a split (from `load_pgm`, a datasets.Dataset, a list); None if not known."""
    rows = getattr(dataset, "num_rows", None)
    if rows is not None or isinstance(dataset, PGMStream):
        return rows
    try:
        return len(dataset)
    except TypeError:
        return None


def first_puzzles(dataset: Any, count: int) -> list[dict[str, Any]]:
    """The first `count` puzzles of any split (fewer if it has fewer): for a model card's picture."""
    first = getattr(dataset, "first", None)
    if callable(first):
        return first(count)
    if isinstance(dataset, torch.utils.data.IterableDataset | datasets.IterableDataset):
        return [puzzle for puzzle, _ in zip(dataset, range(count), strict=False)]
    return [dataset[i] for i in range(min(count, len(dataset)))]


def skipped_files(dataset: Any) -> list[str]:
    """Every bad file or row a split left out so far (its check and reads, DataLoader workers included)."""
    return list(getattr(dataset, "skipped_files", []))


# ----------------------------------------------------------------------------------------------------------
# load_pgm
# ----------------------------------------------------------------------------------------------------------


def _pop_options(source: str, kwargs: dict[str, Any], allowed: dict[str, Any]) -> dict[str, Any]:
    """This source's options from `kwargs`, refusing any other by name."""
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise TypeError(
            f"load_pgm(source={source!r}) got unknown option(s) {unknown}; expected {sorted(allowed)}"
        )
    return {**allowed, **kwargs}


def _check_choice(what: str, value: str, choices: tuple[str, ...], extra: str = "") -> None:
    """Refuse a value outside `choices`, naming them."""
    if value not in choices:
        raise ValueError(f"unknown PGM {what} {value!r}; expected one of {', '.join(choices)}{extra}")


def _check_count(name: str, value: Any) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ValueError(f"{name} must be a positive integer or None, got {value!r}")


def _skip_log(options: dict[str, Any]) -> SkipLog:
    return SkipLog(options["skip_log"])


def _stream(source: Any, seed: int, options: dict[str, Any]) -> PGMStream:
    return PGMStream(source, seed, options["shuffle_buffer_size"], options.get("num_rows"))


def _load_generated(split: str, regime: str, max_samples, seed, panel_size, streaming, kwargs) -> Any:
    num_shards = kwargs.pop("num_shards", None)
    keep_extra_keys = kwargs.pop("keep_extra_keys", False)
    module = generated.generator_module()
    _check_choice("regime", regime, tuple(module.REGIMES), " (generated)")
    if max_samples is not None:
        kwargs["num_puzzles"] = max_samples
    generator = module.PGMGenerator(regime=regime, split=split, seed=seed, panel_size=panel_size, **kwargs)
    dataset = GeneratedPGM(generator, keep_extra_keys, num_shards or DEFAULT_FOLDER_SHARDS)
    return PGMStream(dataset, seed) if streaming else dataset


def _load_deepmind(split, regime, data_dir, max_samples, seed, streaming, kwargs) -> Any:
    options = _pop_options(
        "deepmind",
        kwargs,
        {
            "skip_bad_files": False,
            "skip_log": None,
            "num_shards": None,
            "shuffle_buffer_size": None,
            "index_dir": None,
            "num_rows": None,
        },  # fmt: skip
    )
    _check_choice("regime", regime, REGIMES, " (DeepMind's release)")
    _check_count("num_rows", options["num_rows"])
    if data_dir is None:
        raise ValueError(f"source='deepmind' needs data_dir. {DEEPMIND_HELP}")
    path = Path(data_dir).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"DeepMind PGM data_dir {str(path)!r} does not exist. {DEEPMIND_HELP}")
    skip = options["skip_bad_files"]
    if is_archive(path):
        if streaming is False:
            raise ValueError(
                f"{str(path)!r} is an archive, which can only be streamed (streaming=True or None); "
                "extract it and pass the folder for random access"
            )
        archive = DeepMindPGMArchive(
            path, split, regime, max_samples, skip, options["num_shards"] or 1, options["index_dir"],
            _skip_log(options),
        )  # fmt: skip
        return _stream(archive, seed, options)
    if not path.is_dir():
        raise ValueError(f"DeepMind PGM data_dir {str(path)!r} is neither a folder nor a .tar.gz archive")
    folder = DeepMindPGMFolder(
        path,
        split,
        regime,
        max_samples,
        skip,
        _skip_log(options),
        options["num_shards"] or DEFAULT_FOLDER_SHARDS,
    )
    if streaming:
        return _stream(folder, seed, options)
    for option in ("shuffle_buffer_size", "num_rows"):
        if options[option] is not None:
            raise ValueError(f"{option} applies to streamed splits only (streaming=True or an archive)")
    return folder


def _load_hub(split, data_dir, max_samples, seed, streaming, kwargs) -> Any:
    options = _pop_options(
        "hub",
        kwargs,
        {
            "cache_dir": None,
            "revision": None,
            "shuffle_buffer_size": None,
            "skip_bad_files": False,
            "skip_log": None,
            "num_rows": None,
        },  # fmt: skip
    )
    _check_count("num_rows", options["num_rows"])
    streaming = True if streaming is None else streaming
    if not streaming and (options["shuffle_buffer_size"] is not None or options["num_rows"] is not None):
        raise ValueError("shuffle_buffer_size and num_rows apply to streamed splits only (streaming=True)")
    source = HUB_REPO_ID if data_dir is None else os.fspath(data_dir)
    local, label = Path(source).expanduser(), f"{source} ({split})"
    skip, skip_log = options["skip_bad_files"], _skip_log(options)
    if local.exists():
        files = local_parquet_files(local, split)
        if streaming:
            return _stream(HubParquetFiles(files, label, max_samples, skip, skip_log), seed, options)
        rows = datasets.load_dataset(
            "parquet", data_files={"rows": files}, split="rows", cache_dir=options["cache_dir"]
        )
        rows = rows if max_samples is None else rows.select(range(min(max_samples, len(rows))))
        return HubPGMRows(rows, label, files, skip, skip_log)
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", source):
        raise FileNotFoundError(f"PGM Parquet path {source!r} does not exist (and is not a Hub repo id)")
    split_name = HUB_SPLIT_NAMES[split]
    hub = datasets.load_dataset(
        source,
        split=split_name,
        streaming=streaming,
        cache_dir=options["cache_dir"],
        revision=options["revision"],
    )
    if not streaming:
        hub = hub if max_samples is None else hub.select(range(min(max_samples, len(hub))))
        return HubPGMRows(hub, label, None, skip, skip_log)
    splits = hub.info.splits or {}
    rows = splits[split_name].num_examples if split_name in splits else None
    if max_samples is not None:
        hub, rows = hub.take(max_samples), None if rows is None else min(rows, max_samples)
    source = HubRepoStream(hub, label, rows or None, skip, skip_log, limited=max_samples is not None)
    return _stream(source, seed, options)


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
) -> DeepMindPGMFolder | GeneratedPGM | HubPGMRows | PGMStream:
    """Load a PGM split from one of PGM_SOURCES; every puzzle comes out in the schema (`common`).

    Returns a map-style ``torch`` Dataset (generated; a DeepMind folder; the Hub with ``streaming=False``) or
    a `PGMStream` (``streaming=True``; a DeepMind archive; the Hub by default), each with ``num_rows``,
    ``check``, ``first`` and ``skipped_files`` (see `check_pgm_source`, `first_puzzles`).

    - ``split``: ``train``, ``val`` (``validation`` accepted) or ``test``.
    - ``regime``: one of REGIMES (DeepMind's names) for ``deepmind`` and ``generated``; only ``neutral`` for
      ``hub``.
    - ``data_dir``: deepmind: a folder of .npz or a .tar.gz (required); hub: a repo id (default HUB_REPO_ID)
      or an existing local Parquet folder or file; generated: unused.
    - ``max_samples``: at most that many puzzles, the first ones (sorted files, archive order, Parquet order);
      generated: the number of puzzles (default: the generator's).
    - ``seed``: the generator's seed; for streamed splits the shuffle seed (with ``shuffle_buffer_size``).
    - ``panel_size``: the generated panels' side. DeepMind and Hub panels keep their stored size (160); the
      image processor resizes.
    - ``streaming``: None picks the source's natural form (above).

    Options (``**kwargs``): deepmind: ``skip_bad_files`` (False), ``skip_log`` (a file the skips are
    appended to, by every process given it; default a temporary one), ``num_shards`` (folder: min(64, files); archive: 1), ``shuffle_buffer_size``,
    ``index_dir`` (where an archive's count is kept; default ~/.cache/ni_hf/pgm_archives), ``num_rows``
    (streamed: the length, if known, instead of counting); hub: ``skip_bad_files``, ``skip_log``,
    ``cache_dir``, ``revision``, ``shuffle_buffer_size``, ``num_rows``; generated: ``num_shards`` (streaming
    only), ``keep_extra_keys`` (False: only the schema's keys; True with ``with_relations=True`` keeps the
    generator's ``relations``), anything else goes to ``PGMGenerator`` (e.g. ``max_triples``).
    """
    _check_choice("source", source, PGM_SOURCES)
    split = "val" if split == "validation" else split
    _check_choice("split", split, SPLITS, " ('validation' is accepted for 'val')")
    _check_count("max_samples", max_samples)
    if source == "generated":
        return _load_generated(split, regime, max_samples, seed, panel_size, streaming, dict(kwargs))
    if source == "deepmind":
        return _load_deepmind(split, regime, data_dir, max_samples, seed, streaming, dict(kwargs))
    _check_choice(
        "regime", regime, HUB_REGIMES, f" ({HUB_REPO_ID} holds only that one; use source='deepmind')"
    )
    return _load_hub(split, data_dir, max_samples, seed, streaming, dict(kwargs))
