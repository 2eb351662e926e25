"""The PGM loaders' puzzles: DeepMind .npz folders and archives, Hub-layout Parquet, the generator wrapper,
each in the schema, across DataLoader workers and ranks, with bad files named. Lengths, pre-training checks
and skips: tests/test_pgm_sources.py."""

from __future__ import annotations

import logging
import os
import tarfile
import types
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pytest
import torch
from _pgm_files import (
    BAD_NPZ,
    HUB_FEATURES,
    content_key,
    content_keys,
    hub_rows,
    puzzle,
    write_bad_npz,
    write_deepmind_archive,
    write_deepmind_folder,
    write_hub_parquet,
    write_npz,
)

from ni_hf.data import pgm
from ni_hf.data.pgm import PGMFileError, PGMStream, load_pgm

TRAIN_IDS = (3, 10, 25, 7, 100, 42)
VAL_IDS = (5, 1)
TEST_IDS = (9,)


@pytest.fixture(scope="module")
def deepmind(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A DeepMind folder `<root>/neutral/PGM_neutral_<split>_<id>.npz` and the same as neutral.tar.gz."""
    root = tmp_path_factory.mktemp("pgm_deepmind")
    folder = write_deepmind_folder(root / "data", {"train": TRAIN_IDS, "val": VAL_IDS, "test": TEST_IDS})
    write_npz(folder / "PGM_interpolation_train_1.npz", 1)
    (folder / "README.txt").write_text("not a puzzle")
    archive = write_deepmind_archive(root / "neutral.tar.gz", folder)
    return {"root": root / "data", "folder": folder, "archive": archive, "index": root / "index"}


@pytest.fixture(scope="module")
def hub_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local copy in the Hub's layout: data/train-0000k-of-00002.parquet, data/validation-....parquet."""
    root = tmp_path_factory.mktemp("pgm_hub")
    return write_hub_parquet(root, {"train": [TRAIN_IDS[:3], TRAIN_IDS[3:]], "validation": [VAL_IDS]})


def _assert_schema(one: dict[str, Any], expected: dict[str, Any]) -> None:
    assert set(one) == set(pgm.SCHEMA_KEYS)
    assert one["panels"].dtype == np.uint8 and one["panels"].shape == expected["panels"].shape
    np.testing.assert_array_equal(one["panels"], expected["panels"])
    assert isinstance(one["target"], int) and one["target"] == expected["target"]
    assert one["meta_target"].dtype == np.uint8 and one["meta_target"].shape == (12,)
    np.testing.assert_array_equal(one["meta_target"], expected["meta_target"])
    assert one["relation_structure_encoded"].dtype == np.uint8
    np.testing.assert_array_equal(one["relation_structure_encoded"], expected["relation_structure_encoded"])


def _identity(sample: Any) -> Any:
    return sample


def _loader_keys(dataset: Any) -> list[str]:
    """Content keys of everything 2 DataLoader workers yield."""
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2, collate_fn=_identity)
    return sorted(content_key(one) for one in loader)


# ----------------------------------------------------------------------------------------------------------
# DeepMind
# ----------------------------------------------------------------------------------------------------------


def test_deepmind_names_and_meta_target_order() -> None:
    assert pgm.META_TARGET_NAMES[:7] == ("shape", "line", "color", "number", "position", "size", "type")
    assert (
        pgm.META_TARGET_NAMES[7:]
        == pgm.RELATION_TYPES
        == ("progression", "XOR", "OR", "AND", "consistent_union")
    )
    assert pgm.parse_deepmind_name("neutral/PGM_attrs.shape.color_val_0042.npz") == (
        "attrs.shape.color",
        "val",
        42,
    )
    assert pgm.parse_deepmind_name("PGM_neutral_train_1.npy") is None


@pytest.mark.parametrize("where", ["root", "folder"])
def test_deepmind_folder_yields_schema_sorted_by_id(deepmind: dict[str, Path], where: str) -> None:
    ds = load_pgm("deepmind", split="train", data_dir=deepmind[where])
    assert isinstance(ds, pgm.DeepMindPGMFolder) and len(ds) == len(TRAIN_IDS)
    for index, puzzle_id in enumerate(sorted(TRAIN_IDS)):
        assert ds.file_path(index).name == f"PGM_neutral_train_{puzzle_id}.npz"
        _assert_schema(ds[index], puzzle(puzzle_id))
    assert len(load_pgm("deepmind", split="val", data_dir=deepmind[where])) == len(VAL_IDS)
    assert len(load_pgm("deepmind", split="validation", data_dir=deepmind[where])) == len(VAL_IDS)
    assert len(load_pgm("deepmind", split="test", data_dir=deepmind[where])) == len(TEST_IDS)
    assert len(load_pgm("deepmind", regime="interpolation", data_dir=deepmind[where])) == 1


def test_deepmind_max_samples_takes_the_first_files(deepmind: dict[str, Path]) -> None:
    ds = load_pgm("deepmind", data_dir=deepmind["root"], max_samples=2)
    assert [ds.file_path(i).name for i in range(len(ds))] == [
        "PGM_neutral_train_3.npz",
        "PGM_neutral_train_7.npz",
    ]
    streamed = load_pgm("deepmind", data_dir=deepmind["archive"], max_samples=2, index_dir=deepmind["index"])
    # Archive order is the members' order: names sorted as text, so 10 and 100 come before 25.
    assert [one["target"] for one in streamed] == [10 % 8, 100 % 8]


def test_archive_and_streamed_folder_give_the_folder_puzzles(deepmind: dict[str, Path]) -> None:
    archive = load_pgm("deepmind", split="train", data_dir=deepmind["archive"], index_dir=deepmind["index"])
    assert isinstance(archive, PGMStream)
    streamed = load_pgm("deepmind", split="train", data_dir=deepmind["root"], streaming=True)
    folder = load_pgm("deepmind", split="train", data_dir=deepmind["root"])
    by_key = {content_key(one): one for one in archive}
    assert (
        sorted(by_key)
        == sorted(content_key(folder[i]) for i in range(len(folder)))
        == content_keys(TRAIN_IDS)
    )
    for puzzle_id in TRAIN_IDS:
        _assert_schema(by_key[content_key(puzzle(puzzle_id))], puzzle(puzzle_id))
    assert sorted(content_key(one) for one in streamed) == content_keys(TRAIN_IDS)
    val = load_pgm("deepmind", split="val", data_dir=deepmind["archive"])
    assert sorted(content_key(one) for one in val) == content_keys(VAL_IDS)
    shuffled = load_pgm("deepmind", data_dir=deepmind["archive"], shuffle_buffer_size=4, seed=1)
    assert sorted(content_key(one) for one in shuffled) == content_keys(TRAIN_IDS)


def test_two_dataloader_workers_see_each_puzzle_once(deepmind: dict[str, Path], hub_folder: Path) -> None:
    expected = content_keys(TRAIN_IDS)
    assert _loader_keys(load_pgm("deepmind", data_dir=deepmind["root"])) == expected
    assert _loader_keys(load_pgm("deepmind", data_dir=deepmind["root"], streaming=True)) == expected
    assert _loader_keys(load_pgm("deepmind", data_dir=deepmind["archive"], num_shards=2)) == expected
    assert _loader_keys(load_pgm("deepmind", data_dir=deepmind["archive"])) == expected  # 1 shard, 2 workers
    assert _loader_keys(load_pgm("hub", data_dir=hub_folder)) == expected


def test_two_ranks_get_disjoint_complete_shares_of_known_length(
    deepmind: dict[str, Path], hub_folder: Path
) -> None:
    expected = content_keys(TRAIN_IDS)
    streams = {
        "folder": load_pgm("deepmind", data_dir=deepmind["root"], streaming=True),
        "archive, 2 shards": load_pgm("deepmind", data_dir=deepmind["archive"], num_shards=2),
        "archive, 1 shard": load_pgm("deepmind", data_dir=deepmind["archive"], index_dir=deepmind["index"]),
        "hub": load_pgm("hub", data_dir=hub_folder),
        "hub, shuffled": load_pgm("hub", data_dir=hub_folder, shuffle_buffer_size=3, seed=5),
    }
    for name, stream in streams.items():
        shares = [stream.split_by_node(rank, 2) for rank in range(2)]
        keys = [[content_key(one) for one in share] for share in shares]
        assert set(keys[0]).isdisjoint(keys[1]), name
        assert sorted(keys[0] + keys[1]) == expected, name
        assert [len(share) for share in shares] == [len(k) for k in keys], name
    folder = load_pgm("deepmind", data_dir=deepmind["root"])
    shares = []
    for rank in range(2):
        sampler = torch.utils.data.DistributedSampler(folder, num_replicas=2, rank=rank, shuffle=False)
        shares.append([content_key(folder[i]) for i in sampler])
    assert set(shares[0]).isdisjoint(shares[1]) and sorted(shares[0] + shares[1]) == expected


def test_folder_lists_names_only_and_opens_a_file_when_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = write_deepmind_folder(tmp_path, {"train": range(1000)}, side=4)
    opened: list[str] = []
    real_load = np.load

    def counting_load(file: Any, *args: Any, **kwargs: Any) -> Any:
        opened.append(os.fspath(file) if isinstance(file, str | os.PathLike) else "<file object>")
        return real_load(file, *args, **kwargs)

    monkeypatch.setattr(np, "load", counting_load)
    ds = load_pgm("deepmind", data_dir=tmp_path)
    assert len(ds) == 1000 and opened == []
    assert ds._names.nbytes < 64_000  # the listing: fixed-width names, no per-file objects
    _assert_schema(ds[123], puzzle(123, side=4))
    assert opened == [str(folder / "PGM_neutral_train_123.npz")]
    streamed = load_pgm("deepmind", data_dir=tmp_path, streaming=True)
    assert len(streamed) == 1000 and len(opened) == 1
    next(iter(streamed))
    assert len(opened) == 2


def test_archive_is_streamed_member_by_member(
    deepmind: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[Any] = []
    real_load = np.load
    monkeypatch.setattr(np, "load", lambda file, *a, **k: opened.append(file) or real_load(file, *a, **k))
    modes: list[str] = []
    real_open = tarfile.open
    monkeypatch.setattr(
        tarfile, "open", lambda *a, mode="r", **k: modes.append(mode) or real_open(*a, mode=mode, **k)
    )
    stream = load_pgm("deepmind", data_dir=deepmind["archive"])
    assert opened == []
    next(iter(stream))
    assert len(opened) == 1 and set(modes) == {"r|*"}  # stream mode: no seeking, no extraction


@pytest.mark.parametrize("kind", sorted(BAD_NPZ))
def test_a_bad_file_is_named_when_read(tmp_path: Path, kind: str) -> None:
    write_npz(tmp_path / "neutral" / "PGM_neutral_train_1.npz", 1)
    bad = write_bad_npz(tmp_path / "neutral" / "PGM_neutral_train_2.npz", kind)
    ds = load_pgm("deepmind", data_dir=tmp_path)
    _assert_schema(ds[0], puzzle(1))
    with pytest.raises(PGMFileError) as error:
        ds[1]
    assert str(bad) in str(error.value) and BAD_NPZ[kind] in str(error.value)
    assert error.value.file == str(bad)
    archive = write_deepmind_archive(tmp_path / "neutral.tar.gz", tmp_path / "neutral")
    with pytest.raises(PGMFileError, match=r"neutral\.tar\.gz:neutral/PGM_neutral_train_2\.npz") as error:
        list(load_pgm("deepmind", data_dir=archive))
    assert BAD_NPZ[kind] in str(error.value)


def test_a_meta_target_that_disagrees_with_the_structure_is_refused(tmp_path: Path) -> None:
    bad = write_bad_npz(tmp_path / "PGM_neutral_train_2.npz", "meta_target disagrees")
    with pytest.raises(PGMFileError) as error:
        load_pgm("deepmind", data_dir=tmp_path)[0]
    structure = puzzle(2)["relation_structure_encoded"]
    names = [name for name, bit in zip(pgm.META_TARGET_NAMES, structure.max(axis=0), strict=True) if bit]
    assert str(bad) in str(error.value) and f"rows of 'relation_structure_encoded' mark {names}" in str(
        error.value
    )
    row = np.zeros(12, dtype=np.int64)
    row[[0, 1, 9]] = 1  # two objects in one triple
    write_npz(
        bad, 2, relation_structure_encoded=np.stack([row, *np.zeros((3, 12), np.int64)]), meta_target=row
    )
    with pytest.raises(PGMFileError, match=r"row 0 marks \['shape', 'line', 'OR'\]; expected one object"):
        load_pgm("deepmind", data_dir=tmp_path)[0]


def test_skip_bad_files_warns_names_and_counts(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    for puzzle_id in (1, 3):
        write_npz(tmp_path / f"PGM_neutral_train_{puzzle_id}.npz", puzzle_id)
    bad = tmp_path / "PGM_neutral_train_2.npz"
    bad.write_bytes(b"garbage")
    with caplog.at_level(logging.WARNING, logger="ni_hf.data.pgm"):
        ds = load_pgm("deepmind", data_dir=tmp_path, skip_bad_files=True)
        _assert_schema(ds[1], puzzle(3))  # the next good file stands in
        assert ds.skipped_files == [str(bad)]
        stream = load_pgm("deepmind", data_dir=tmp_path, streaming=True, skip_bad_files=True)
        streamed = [content_key(one) for one in stream]
    assert sorted(streamed) == content_keys((1, 3)) and stream.skipped_files == [str(bad)]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and all(str(bad) in w and "1 skipped so far" in w for w in warnings)


def test_deepmind_arguments_are_refused_by_name(deepmind: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(
        ValueError, match="unknown PGM source 'kaggle'; expected one of generated, deepmind, hub"
    ):
        load_pgm("kaggle")
    with pytest.raises(ValueError, match="unknown PGM split 'dev'; expected one of train, val, test"):
        load_pgm("deepmind", split="dev", data_dir=deepmind["root"])
    with pytest.raises(
        ValueError, match="unknown PGM regime 'neutrall'; expected one of neutral, interpolation"
    ):
        load_pgm("deepmind", regime="neutrall", data_dir=deepmind["root"])
    with pytest.raises(ValueError, match="needs data_dir.*abstract-reasoning-matrices"):
        load_pgm("deepmind")
    with pytest.raises(FileNotFoundError, match="'/nonexistent/pgm' does not exist"):
        load_pgm("deepmind", data_dir="/nonexistent/pgm")
    with pytest.raises(
        FileNotFoundError, match=r"no PGM_extrapolation_train_<id>\.npz files .*found .*PGM_neutral_val: 2"
    ):
        load_pgm("deepmind", regime="extrapolation", data_dir=deepmind["root"])
    with pytest.raises(
        FileNotFoundError, match="no PGM_extrapolation_train_<id>.npz members .*PGM_neutral_train: 6"
    ):
        list(load_pgm("deepmind", regime="extrapolation", data_dir=deepmind["archive"]))
    with pytest.raises(
        FileNotFoundError, match="no PGM_extrapolation_train_<id>.npz members .*PGM_neutral_train: 6"
    ):
        len(
            load_pgm(
                "deepmind", regime="extrapolation", data_dir=deepmind["archive"], index_dir=deepmind["index"]
            )
        )
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['shuffle'\]; expected \['index_dir'"):
        load_pgm("deepmind", data_dir=deepmind["root"], shuffle=True)
    with pytest.raises(ValueError, match="archive, which can only be streamed"):
        load_pgm("deepmind", data_dir=deepmind["archive"], streaming=False)
    with pytest.raises(ValueError, match="shuffle_buffer_size applies to streamed splits only"):
        load_pgm("deepmind", data_dir=deepmind["root"], shuffle_buffer_size=4)
    with pytest.raises(ValueError, match="max_samples must be a positive integer"):
        load_pgm("deepmind", data_dir=deepmind["root"], max_samples=0)
    not_tar = tmp_path / "neutral.tar.gz"
    not_tar.write_bytes(b"not gzip")
    with pytest.raises(PGMFileError, match="neutral.tar.gz: is not a readable tar archive"):
        load_pgm("deepmind", data_dir=not_tar)


# ----------------------------------------------------------------------------------------------------------
# Hub Parquet
# ----------------------------------------------------------------------------------------------------------


def test_hub_parquet_streams_the_schema(hub_folder: Path) -> None:
    ds = load_pgm("hub", data_dir=hub_folder)
    assert isinstance(ds, PGMStream) and ds.n_shards == 2
    puzzles = list(ds)
    assert len(puzzles) == len(ds) == len(TRAIN_IDS)
    for one, puzzle_id in zip(puzzles, TRAIN_IDS, strict=True):
        _assert_schema(one, puzzle(puzzle_id))
    val = list(load_pgm("hub", split="val", data_dir=hub_folder))
    assert [content_key(one) for one in val] == [content_key(puzzle(i)) for i in VAL_IDS]
    first_four = load_pgm("hub", data_dir=hub_folder, max_samples=4)
    assert len(first_four) == 4 and [content_key(p) for p in first_four] == [
        content_key(puzzle(i)) for i in TRAIN_IDS[:4]
    ]


def test_hub_parquet_without_streaming(hub_folder: Path, tmp_path: Path) -> None:
    ds = load_pgm("hub", data_dir=hub_folder, streaming=False, cache_dir=str(tmp_path), max_samples=5)
    assert isinstance(ds, pgm.HubPGMRows) and len(ds) == 5
    _assert_schema(ds[1], puzzle(TRAIN_IDS[1]))


def test_hub_other_layouts_and_refusals(tmp_path: Path, hub_folder: Path) -> None:
    rows = hub_rows((4, 6))
    rows["panels"] = [a + b for a, b in zip(rows.pop("panels"), rows.pop("choices"), strict=True)]
    features = datasets.Features({k: v for k, v in HUB_FEATURES.items() if k != "choices"})
    for name in ("sixteen", "odd"):
        (tmp_path / name).mkdir()
    datasets.Dataset.from_dict(rows, features=features).to_parquet(
        str(tmp_path / "sixteen" / "train.parquet")
    )
    for one, puzzle_id in zip(load_pgm("hub", data_dir=tmp_path / "sixteen"), (4, 6), strict=True):
        _assert_schema(one, puzzle(puzzle_id))

    datasets.Dataset.from_dict({"pixels": [[1, 2]], "target": [1]}).to_parquet(
        str(tmp_path / "odd" / "train.parquet")
    )
    with pytest.raises(
        ValueError, match=r"has columns \['pixels', 'target'\]; expected 'panels' \(8 context"
    ):
        load_pgm("hub", data_dir=tmp_path / "odd")
    with pytest.raises(
        FileNotFoundError, match=r"no Parquet files for split 'test' .*found 3 Parquet file\(s\)"
    ):
        load_pgm("hub", split="test", data_dir=hub_folder)
    with pytest.raises(ValueError, match="unknown PGM regime 'attr.rels'; expected one of neutral"):
        load_pgm("hub", regime="attr.rels", data_dir=hub_folder)
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['num_shards'\]"):
        load_pgm("hub", data_dir=hub_folder, num_shards=2)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_pgm("hub", data_dir="/nonexistent/pgm/parquet")


def test_hub_bad_row_is_named_by_file_and_row(tmp_path: Path) -> None:
    rows = hub_rows((2, 5))
    rows["target"] = [3, 11]
    datasets.Dataset.from_dict(rows, features=HUB_FEATURES).to_parquet(str(tmp_path / "train.parquet"))
    message = rf"{tmp_path}/train\.parquet row 1 \(id=5\): 'target' is 11; expected an integer 0-7"
    with pytest.raises(PGMFileError, match=message):
        list(load_pgm("hub", data_dir=tmp_path))
    with pytest.raises(PGMFileError, match=message):
        load_pgm("hub", data_dir=tmp_path, streaming=False, cache_dir=str(tmp_path / "cache"))[1]


# ----------------------------------------------------------------------------------------------------------
# Generated (a stand-in with the generator's API; the real one below)
# ----------------------------------------------------------------------------------------------------------


class _StandInGenerator:
    """PGMGenerator's API: deterministic per index."""

    calls: list[dict[str, Any]] = []

    def __init__(
        self, regime="neutral", split="train", num_puzzles=10_000, seed=0, panel_size=80, max_triples=4
    ):
        self.num_puzzles, self.seed, self.panel_size = num_puzzles, seed, panel_size
        _StandInGenerator.calls.append(dict(regime=regime, split=split, num_puzzles=num_puzzles, seed=seed,
                                            panel_size=panel_size, max_triples=max_triples))  # fmt: skip

    def __len__(self) -> int:
        return self.num_puzzles

    def __getitem__(self, index: int) -> dict[str, Any]:
        one = puzzle(1000 * self.seed + index, side=self.panel_size)
        return {**one, "relations": [("shape", "color", "progression")]}


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    module = types.SimpleNamespace(
        PGMGenerator=_StandInGenerator, REGIMES=("neutral", "interpolation"), SPLITS=("train", "val", "test")
    )
    monkeypatch.setattr(pgm.generated, "generator_module", lambda: module)
    _StandInGenerator.calls.clear()
    return module


def test_generated_wraps_the_generator(stand_in: types.SimpleNamespace) -> None:
    ds = load_pgm("generated", split="val", max_samples=5, seed=2, panel_size=16, max_triples=2)
    assert isinstance(ds, pgm.GeneratedPGM) and len(ds) == 5
    assert _StandInGenerator.calls == [
        dict(regime="neutral", split="val", num_puzzles=5, seed=2, panel_size=16, max_triples=2)
    ]
    _assert_schema(ds[3], puzzle(2003, side=16))
    assert "relations" in load_pgm("generated", max_samples=2, keep_extra_keys=True)[0]
    assert len(load_pgm("generated")) == 10_000
    streamed = load_pgm("generated", max_samples=6, streaming=True, num_shards=2)
    assert isinstance(streamed, PGMStream) and len(streamed) == 6
    assert _loader_keys(streamed) == content_keys(range(6), 80)
    with pytest.raises(
        ValueError, match="unknown PGM regime 'attr.rels'; expected one of neutral, interpolation"
    ):
        load_pgm("generated", regime="attr.rels")


def test_generated_bad_sample_is_named(
    stand_in: types.SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_StandInGenerator, "__getitem__", lambda self, i: {"panels": np.zeros((16, 4, 4))})
    with pytest.raises(PGMFileError, match=r"generated PGM puzzle 0: .*missing \['target'"):
        load_pgm("generated", max_samples=1)[0]


def test_real_generator_in_the_schema() -> None:
    first = load_pgm("generated", split="train", max_samples=3, seed=0)
    again = load_pgm("generated", split="train", max_samples=3, seed=0)
    assert len(first) == 3 and first.check().read_fully == 3
    for index in range(3):
        one = first[index]
        assert set(one) == set(pgm.SCHEMA_KEYS) and one["panels"].shape == (16, 80, 80)
        np.testing.assert_array_equal(one["panels"], again[index]["panels"])
