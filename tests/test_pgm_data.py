"""Tests for the PGM loaders: DeepMind .npz folders and archives, Hub-layout Parquet, the generator wrapper."""

from __future__ import annotations

import hashlib
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
from datasets.distributed import split_dataset_by_node
from PIL import Image

from ni_hf.data import pgm
from ni_hf.data.pgm import PGMFileError, load_pgm

SIDE = 160  # DeepMind's panel side
TRAIN_IDS = (3, 10, 25, 7, 100, 42)
VAL_IDS = (5, 1)
TEST_IDS = (9,)


# ----------------------------------------------------------------------------------------------------------
# Fixtures in the real layouts
# ----------------------------------------------------------------------------------------------------------


def _expected(puzzle_id: int, side: int = SIDE) -> dict[str, Any]:
    """The puzzle a fixture file with this id holds, in the schema."""
    rng = np.random.default_rng(puzzle_id)
    structure = np.zeros((4, 12), dtype=np.uint8)
    structure[0, [puzzle_id % 2, 2 + puzzle_id % 5, 7 + puzzle_id % 5]] = 1
    return {
        "panels": rng.integers(0, 256, (16, side, side), dtype=np.uint8),
        "target": puzzle_id % 8,
        "meta_target": structure.max(axis=0),
        "relation_structure_encoded": structure,
    }


def _write_npz(
    path: Path, puzzle_id: int, side: int = SIDE, image_dtype: Any = np.uint8, **overrides: Any
) -> None:
    """Write a file in DeepMind's key layout; `image` mis-shaped as DeepMind stores it (160x160x16)."""
    puzzle = _expected(puzzle_id, side)
    arrays = {
        # Panel-major bytes labelled (H, W, 16): DeepMind's README says to reshape(16, 160, 160) on load.
        "image": puzzle["panels"].astype(image_dtype).reshape(side, side, 16),
        "target": np.array(puzzle["target"], dtype=np.int64),
        "meta_target": puzzle["meta_target"].astype(np.int64),
        "relation_structure_encoded": puzzle["relation_structure_encoded"].astype(np.int64),
        "relation_structure": np.array([[b"progression", b"shape", b"color"]]),
    }
    arrays.update(overrides)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **{key: value for key, value in arrays.items() if value is not None})


@pytest.fixture(scope="module")
def deepmind(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A DeepMind-layout folder `<root>/neutral/PGM_neutral_<split>_<id>.npz` and the same as neutral.tar.gz."""
    root = tmp_path_factory.mktemp("pgm_deepmind")
    folder = root / "data" / "neutral"
    for split, ids in (("train", TRAIN_IDS), ("val", VAL_IDS), ("test", TEST_IDS)):
        for puzzle_id in ids:
            # One file with int64 pixels: the release only says "integer array".
            dtype = np.int64 if puzzle_id == 25 else np.uint8
            _write_npz(folder / f"PGM_neutral_{split}_{puzzle_id}.npz", puzzle_id, image_dtype=dtype)
    _write_npz(folder / "PGM_interpolation_train_1.npz", 1)
    (folder / "README.txt").write_text("not a puzzle")
    archive = root / "neutral.tar.gz"
    with tarfile.open(archive, "w:gz", compresslevel=1) as tar:
        tar.add(folder, arcname="neutral")
    return {"root": root / "data", "folder": folder, "archive": archive}


HUB_FEATURES = datasets.Features(
    {  # HuggingFaceM4's conversion script (see ni_hf.data.pgm's docstring)
        "panels": [datasets.Image(decode=True)],
        "choices": [datasets.Image(decode=True)],
        "relation_structure_encoded": datasets.Array2D(shape=(4, 12), dtype="uint8"),
        "relation_structure": datasets.Array2D(shape=(1, 3), dtype="string"),
        "meta_target": datasets.Array2D(shape=(1, 12), dtype="uint8"),
        "target": datasets.Value("uint8"),
        "id": datasets.Value("int32"),
    }
)


def _hub_rows(ids: tuple[int, ...]) -> dict[str, list[Any]]:
    """Rows in the Hub's layout for these puzzle ids."""
    rows: dict[str, list[Any]] = {key: [] for key in HUB_FEATURES}
    for puzzle_id in ids:
        puzzle = _expected(puzzle_id)
        rows["panels"].append([Image.fromarray(p) for p in puzzle["panels"][:8]])
        rows["choices"].append([Image.fromarray(p) for p in puzzle["panels"][8:]])
        rows["relation_structure_encoded"].append(puzzle["relation_structure_encoded"])
        rows["relation_structure"].append(np.array([["progression", "shape", "color"]]))
        rows["meta_target"].append(puzzle["meta_target"][np.newaxis])
        rows["target"].append(puzzle["target"])
        rows["id"].append(puzzle_id)
    return rows


@pytest.fixture(scope="module")
def hub_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local copy in the Hub's layout: data/train-0000k-of-00002.parquet, data/validation-....parquet."""
    root = tmp_path_factory.mktemp("pgm_hub")
    parts = {"train-00000-of-00002": TRAIN_IDS[:3], "train-00001-of-00002": TRAIN_IDS[3:]}
    parts["validation-00000-of-00001"] = VAL_IDS
    for name, ids in parts.items():
        (root / "data").mkdir(exist_ok=True)
        datasets.Dataset.from_dict(_hub_rows(ids), features=HUB_FEATURES).to_parquet(
            str(root / "data" / f"{name}.parquet")
        )
    return root


def _key(puzzle: dict[str, Any]) -> str:
    """A content key identifying a puzzle."""
    panels = np.asarray(puzzle["panels"])
    return hashlib.sha1(panels.tobytes() + bytes([int(puzzle["target"])])).hexdigest()


def _keys(ids: tuple[int, ...]) -> list[str]:
    return sorted(_key(_expected(i)) for i in ids)


def _assert_schema(puzzle: dict[str, Any], expected: dict[str, Any]) -> None:
    assert set(puzzle) == set(pgm.SCHEMA_KEYS)
    assert puzzle["panels"].dtype == np.uint8 and puzzle["panels"].shape == expected["panels"].shape
    np.testing.assert_array_equal(puzzle["panels"], expected["panels"])
    assert isinstance(puzzle["target"], int) and puzzle["target"] == expected["target"]
    assert puzzle["meta_target"].dtype == np.uint8 and puzzle["meta_target"].shape == (12,)
    np.testing.assert_array_equal(puzzle["meta_target"], expected["meta_target"])
    assert puzzle["relation_structure_encoded"].dtype == np.uint8
    np.testing.assert_array_equal(
        puzzle["relation_structure_encoded"], expected["relation_structure_encoded"]
    )


def _identity(sample: Any) -> Any:
    return sample


def _loader_keys(dataset: Any) -> list[str]:
    """Content keys of everything 2 DataLoader workers yield."""
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2, collate_fn=_identity)
    return sorted(_key(puzzle) for puzzle in loader)


# ----------------------------------------------------------------------------------------------------------
# DeepMind
# ----------------------------------------------------------------------------------------------------------


def test_deepmind_meta_target_order() -> None:
    assert pgm.META_TARGET_NAMES[:7] == ("shape", "line", "color", "number", "position", "size", "type")
    assert pgm.META_TARGET_NAMES[7:] == ("progression", "XOR", "OR", "AND", "consistent_union")
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
        _assert_schema(ds[index], _expected(puzzle_id))
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
    streamed = load_pgm("deepmind", data_dir=deepmind["archive"], max_samples=2)
    assert len(list(streamed)) == 2


def test_archive_and_streamed_folder_give_the_folder_puzzles(deepmind: dict[str, Path]) -> None:
    archive = load_pgm("deepmind", split="train", data_dir=deepmind["archive"])
    assert isinstance(archive, datasets.IterableDataset)
    streamed = load_pgm("deepmind", split="train", data_dir=deepmind["root"], streaming=True)
    folder = load_pgm("deepmind", split="train", data_dir=deepmind["root"])
    by_key = {_key(puzzle): puzzle for puzzle in archive}
    assert sorted(by_key) == sorted(_key(folder[i]) for i in range(len(folder))) == _keys(TRAIN_IDS)
    for puzzle_id in TRAIN_IDS:
        _assert_schema(by_key[_key(_expected(puzzle_id))], _expected(puzzle_id))
    assert sorted(_key(puzzle) for puzzle in streamed) == _keys(TRAIN_IDS)
    val = load_pgm("deepmind", split="val", data_dir=deepmind["archive"])
    assert sorted(_key(puzzle) for puzzle in val) == _keys(VAL_IDS)
    shuffled = load_pgm("deepmind", data_dir=deepmind["archive"], shuffle_buffer_size=4, seed=1)
    assert sorted(_key(puzzle) for puzzle in shuffled) == _keys(TRAIN_IDS)


def test_two_dataloader_workers_see_each_puzzle_once(deepmind: dict[str, Path], hub_folder: Path) -> None:
    expected = _keys(TRAIN_IDS)
    assert _loader_keys(load_pgm("deepmind", data_dir=deepmind["root"])) == expected
    assert _loader_keys(load_pgm("deepmind", data_dir=deepmind["root"], streaming=True)) == expected
    assert _loader_keys(load_pgm("deepmind", data_dir=deepmind["archive"], num_shards=2)) == expected
    assert _loader_keys(load_pgm("hub", data_dir=hub_folder)) == expected


def test_two_ranks_get_disjoint_complete_shares(deepmind: dict[str, Path], hub_folder: Path) -> None:
    expected = _keys(TRAIN_IDS)
    streams = {
        "folder": load_pgm("deepmind", data_dir=deepmind["root"], streaming=True),
        "archive, 2 shards": load_pgm("deepmind", data_dir=deepmind["archive"], num_shards=2),
        "archive, 1 shard": load_pgm("deepmind", data_dir=deepmind["archive"]),
        "hub": load_pgm("hub", data_dir=hub_folder),
    }
    for name, stream in streams.items():
        shares = [[_key(p) for p in split_dataset_by_node(stream, rank=r, world_size=2)] for r in range(2)]
        assert set(shares[0]).isdisjoint(shares[1]), name
        assert sorted(shares[0] + shares[1]) == expected, name
    folder = load_pgm("deepmind", data_dir=deepmind["root"])
    shares = []
    for rank in range(2):
        sampler = torch.utils.data.DistributedSampler(folder, num_replicas=2, rank=rank, shuffle=False)
        shares.append([_key(folder[i]) for i in sampler])
    assert set(shares[0]).isdisjoint(shares[1]) and sorted(shares[0] + shares[1]) == expected


def test_folder_lists_names_only_and_opens_a_file_when_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "neutral"
    for puzzle_id in range(1000):
        _write_npz(folder / f"PGM_neutral_train_{puzzle_id}.npz", puzzle_id, side=4)
    opened: list[str] = []
    real_load = np.load

    def counting_load(file: Any, *args: Any, **kwargs: Any) -> Any:
        opened.append(os.fspath(file) if isinstance(file, str | os.PathLike) else "<file object>")
        return real_load(file, *args, **kwargs)

    monkeypatch.setattr(np, "load", counting_load)
    ds = load_pgm("deepmind", data_dir=tmp_path)
    assert len(ds) == 1000 and opened == []
    assert ds._names.nbytes < 64_000  # the listing: fixed-width names, no per-file objects
    _assert_schema(ds[123], _expected(123, side=4))
    assert opened == [str(folder / "PGM_neutral_train_123.npz")]
    streamed = load_pgm("deepmind", data_dir=tmp_path, streaming=True)
    assert opened == [str(folder / "PGM_neutral_train_123.npz")]
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


def _bad_file_cases() -> dict[str, tuple[dict[str, Any], str]]:
    wrong_image = np.zeros((15, SIDE, SIDE), dtype=np.uint8)
    return {
        "missing key": ({"target": None}, "missing ['target']"),
        "wrong shape": ({"image": wrong_image}, "'image' has shape (15, 160, 160)"),
        "target out of range": ({"target": np.array(9)}, "'target' is 9; expected an integer 0-7"),
        "meta_target shape": ({"meta_target": np.zeros(11)}, "'meta_target' has shape (11,)"),
        "pixel range": (
            {"image": np.full((SIDE, SIDE, 16), 300)},
            "values 300..300; expected integers 0-255",
        ),
    }


@pytest.mark.parametrize("case", [*_bad_file_cases(), "not a zip"])
def test_bad_file_is_named(tmp_path: Path, case: str) -> None:
    _write_npz(tmp_path / "PGM_neutral_train_1.npz", 1)
    bad = tmp_path / "PGM_neutral_train_2.npz"
    if case == "not a zip":
        bad.write_bytes(b"PK\x03\x04 truncated")
        message = "cannot be read as .npz"
    else:
        overrides, message = _bad_file_cases()[case]
        _write_npz(bad, 2, **overrides)
    ds = load_pgm("deepmind", data_dir=tmp_path)
    _assert_schema(ds[0], _expected(1))
    with pytest.raises(PGMFileError, match="expected") as error:
        ds[1]
    assert str(bad) in str(error.value) and message in str(error.value)
    assert error.value.file == str(bad)
    archive = tmp_path / "neutral.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tmp_path / "PGM_neutral_train_1.npz", arcname="neutral/PGM_neutral_train_1.npz")
        tar.add(bad, arcname="neutral/PGM_neutral_train_2.npz")
    with pytest.raises(PGMFileError, match=r"neutral\.tar\.gz:neutral/PGM_neutral_train_2\.npz") as error:
        list(load_pgm("deepmind", data_dir=archive))
    assert message in str(error.value)


def test_skip_bad_files_warns_names_and_counts(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    for puzzle_id in (1, 3):
        _write_npz(tmp_path / f"PGM_neutral_train_{puzzle_id}.npz", puzzle_id)
    bad = tmp_path / "PGM_neutral_train_2.npz"
    bad.write_bytes(b"garbage")
    with caplog.at_level(logging.WARNING, logger="ni_hf.data.pgm"):
        ds = load_pgm("deepmind", data_dir=tmp_path, skip_bad_files=True)
        _assert_schema(ds[1], _expected(3))  # the next good file stands in
        assert ds.skipped_files == [str(bad)]
        streamed = [
            _key(p) for p in load_pgm("deepmind", data_dir=tmp_path, streaming=True, skip_bad_files=True)
        ]
    assert sorted(streamed) == _keys((1, 3))
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
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['shuffle'\]; expected \['num_shards'"):
        load_pgm("deepmind", data_dir=deepmind["root"], shuffle=True)
    with pytest.raises(ValueError, match="archive, which can only be streamed"):
        load_pgm("deepmind", data_dir=deepmind["archive"], streaming=False)
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
    assert isinstance(ds, datasets.IterableDataset) and ds.n_shards == 2
    puzzles = list(ds)
    assert len(puzzles) == len(TRAIN_IDS)
    for puzzle, puzzle_id in zip(puzzles, TRAIN_IDS, strict=True):
        _assert_schema(puzzle, _expected(puzzle_id))
    val = list(load_pgm("hub", split="val", data_dir=hub_folder))
    assert [_key(p) for p in val] == [_key(_expected(i)) for i in VAL_IDS]
    assert len(list(load_pgm("hub", data_dir=hub_folder, max_samples=4))) == 4


def test_hub_parquet_without_streaming(hub_folder: Path, tmp_path: Path) -> None:
    ds = load_pgm("hub", data_dir=hub_folder, streaming=False, cache_dir=str(tmp_path), max_samples=5)
    assert isinstance(ds, datasets.Dataset) and len(ds) == 5
    _assert_schema(ds[1], _expected(TRAIN_IDS[1]))


def test_hub_other_layouts_and_refusals(tmp_path: Path, hub_folder: Path) -> None:
    rows = _hub_rows((4, 6))
    rows["panels"] = [a + b for a, b in zip(rows.pop("panels"), rows.pop("choices"), strict=True)]
    features = datasets.Features({k: v for k, v in HUB_FEATURES.items() if k != "choices"})
    for name in ("sixteen", "odd"):
        (tmp_path / name).mkdir()
    datasets.Dataset.from_dict(rows, features=features).to_parquet(
        str(tmp_path / "sixteen" / "train.parquet")
    )
    for puzzle, puzzle_id in zip(load_pgm("hub", data_dir=tmp_path / "sixteen"), (4, 6), strict=True):
        _assert_schema(puzzle, _expected(puzzle_id))

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
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['skip_bad_files'\]"):
        load_pgm("hub", data_dir=hub_folder, skip_bad_files=True)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_pgm("hub", data_dir="/nonexistent/pgm/parquet")


def test_hub_bad_row_is_named(tmp_path: Path) -> None:
    rows = _hub_rows((2,))
    rows["target"] = [11]
    datasets.Dataset.from_dict(rows, features=HUB_FEATURES).to_parquet(str(tmp_path / "train.parquet"))
    with pytest.raises(PGMFileError, match=r"row id=2: 'target' is 11; expected an integer 0-7"):
        list(load_pgm("hub", data_dir=tmp_path))


# ----------------------------------------------------------------------------------------------------------
# Generated (a stand-in with the generator's API; the real one below when it exists)
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
        puzzle = _expected(1000 * self.seed + index, side=self.panel_size)
        return {**puzzle, "relations": [("progression", "shape", "color")]}


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    module = types.SimpleNamespace(
        PGMGenerator=_StandInGenerator, REGIMES=("neutral", "interpolation"), SPLITS=("train", "val", "test")
    )
    monkeypatch.setattr(pgm, "_generator_module", lambda: module)
    _StandInGenerator.calls.clear()
    return module


def test_generated_wraps_the_generator(stand_in: types.SimpleNamespace) -> None:
    ds = load_pgm("generated", split="val", max_samples=5, seed=2, panel_size=16, max_triples=2)
    assert isinstance(ds, pgm.GeneratedPGM) and len(ds) == 5
    assert _StandInGenerator.calls == [
        dict(regime="neutral", split="val", num_puzzles=5, seed=2, panel_size=16, max_triples=2)
    ]
    _assert_schema(ds[3], _expected(2003, side=16))
    assert "relations" in load_pgm("generated", max_samples=2, keep_extra_keys=True)[0]
    assert len(load_pgm("generated")) == 10_000
    streamed = load_pgm("generated", max_samples=6, streaming=True, num_shards=2)
    assert isinstance(streamed, datasets.IterableDataset)
    assert _loader_keys(streamed) == sorted(_key(_expected(i, 80)) for i in range(6))
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
    pytest.importorskip("ni_hf.data.pgm_generator")
    first = load_pgm("generated", split="train", max_samples=3, seed=0)
    again = load_pgm("generated", split="train", max_samples=3, seed=0)
    assert len(first) == 3
    for index in range(3):
        puzzle = first[index]
        assert set(puzzle) == set(pgm.SCHEMA_KEYS) and puzzle["panels"].shape == (16, 80, 80)
        np.testing.assert_array_equal(puzzle["panels"], again[index]["panels"])
