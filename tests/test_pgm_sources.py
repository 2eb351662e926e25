"""The PGM sources at load_pgm's entry point: every split's length (so that Trainer derives its steps), the
pre-training check and what it skips, the errors that name their file, archive member or row, DeepMind's image
read exactly, and the same puzzles from every source for the same files."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pytest
import torch
from _pgm_files import (
    BAD_NPZ,
    HUB_FEATURES,
    SIDE,
    content_key,
    content_keys,
    deepmind_arrays,
    hub_rows,
    puzzle,
    write_bad_npz,
    write_deepmind_archive,
    write_deepmind_folder,
    write_hub_parquet,
    write_npz,
)

from ni_hf.data import pgm
from ni_hf.data.pgm import PGMFileError, PGMStream, check_pgm_source, first_puzzles, load_pgm, pgm_num_rows

SPLITS = {"train": (3, 10, 25, 7, 100), "val": (5, 1), "test": (9, 4, 8)}
HUB_SPLITS = {"train": "train", "val": "validation", "test": "test"}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same puzzles as a DeepMind folder, its neutral.tar.gz, and Parquet in the Hub's layout."""
    root = tmp_path_factory.mktemp("pgm_sources")
    folder = write_deepmind_folder(root / "deepmind", SPLITS)
    hub = {HUB_SPLITS[split]: [ids[:2], ids[2:]] if len(ids) > 2 else [ids] for split, ids in SPLITS.items()}
    return {
        "folder": folder,
        "archive": write_deepmind_archive(root / "neutral.tar.gz", folder),
        "hub": write_hub_parquet(root / "hub", hub),
        "index": root / "index",
        "cache": root / "cache",
    }


def _load(files: dict[str, Path], source: str, split: str = "train", **kwargs: Any) -> Any:
    """One split of the fixture's puzzles from `source` (folder, streamed folder, archive, hub, hub rows)."""
    if source == "folder":
        return load_pgm("deepmind", split=split, data_dir=files["folder"], **kwargs)
    if source == "streamed folder":
        return load_pgm("deepmind", split=split, data_dir=files["folder"], streaming=True, **kwargs)
    if source == "archive":
        return load_pgm(
            "deepmind", split=split, data_dir=files["archive"], index_dir=files["index"], **kwargs
        )
    if source == "hub":
        return load_pgm("hub", split=split, data_dir=files["hub"], **kwargs)
    return load_pgm(
        "hub", split=split, data_dir=files["hub"], streaming=False, cache_dir=str(files["cache"]), **kwargs
    )


SOURCES = ("folder", "streamed folder", "archive", "hub", "hub rows")


# ----------------------------------------------------------------------------------------------------------
# Lengths
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("source", SOURCES)
def test_every_source_knows_the_length_of_every_split(files: dict[str, Path], source: str) -> None:
    for split, ids in SPLITS.items():
        ds = _load(files, source, split)
        assert len(ds) == pgm_num_rows(ds) == len(ids), split
        assert sorted(content_key(one) for one in _every(ds)) == content_keys(ids), split
    limited = _load(files, source, "train", max_samples=3)
    assert len(limited) == 3 == len(list(_every(limited)))
    assert len(first_puzzles(limited, 2)) == 2 and len(first_puzzles(limited, 64)) == 3


def _every(ds: Any) -> list[dict[str, Any]]:
    return list(ds) if isinstance(ds, PGMStream) else [ds[i] for i in range(len(ds))]


def test_an_archive_is_counted_in_one_pass_kept_for_every_split_and_run(
    files: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    passes: list[Path] = []
    real_scan = pgm.deepmind._scan
    monkeypatch.setattr(pgm.deepmind, "_scan", lambda path, n: passes.append(path) or real_scan(path, n))
    monkeypatch.setattr(pgm.deepmind, "_INDEXES", {})
    lengths = [
        len(load_pgm("deepmind", split=s, data_dir=files["archive"], index_dir=tmp_path)) for s in SPLITS
    ]
    assert lengths == [len(ids) for ids in SPLITS.values()] and passes == [files["archive"]]
    monkeypatch.setattr(pgm.deepmind, "_INDEXES", {})  # a new run: the index comes from index_dir
    assert len(load_pgm("deepmind", data_dir=files["archive"], index_dir=tmp_path)) == 5 and len(passes) == 1
    declared = load_pgm("deepmind", data_dir=files["archive"], index_dir=tmp_path / "other", num_rows=5)
    assert len(declared) == 5 and len(passes) == 1  # a length given is not counted


def test_hub_parquet_is_counted_from_its_footers_without_reading_a_row(
    files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pgm.hub.pq.ParquetFile, "iter_batches", lambda *a, **k: pytest.fail("read rows"))
    assert len(load_pgm("hub", data_dir=files["hub"])) == 5


def test_a_hub_split_of_unknown_size_says_so_and_names_max_steps(
    files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    parquet = sorted(str(f) for f in (files["hub"] / "data").glob("train-*.parquet"))
    calls: list[tuple[str, dict[str, Any]]] = []
    real_load = datasets.load_dataset

    def hub_without_sizes(path: str, **kwargs: Any) -> datasets.IterableDataset:
        calls.append((path, kwargs))
        return real_load("parquet", data_files={"train": parquet}, split="train", streaming=True)

    monkeypatch.setattr(datasets, "load_dataset", hub_without_sizes)
    stream = load_pgm("hub")  # HuggingFaceM4/PGM, here a stand-in without split sizes
    assert calls[0][0] == pgm.HUB_REPO_ID and calls[0][1]["split"] == "train"
    assert pgm_num_rows(stream) is None
    with pytest.raises(TypeError, match=r"HuggingFaceM4/PGM \(train\) is not known .*pass --max_steps"):
        len(stream)
    assert sorted(content_key(one) for one in stream) == content_keys(SPLITS["train"])
    assert len(load_pgm("hub", num_rows=5)) == 5
    with_sizes = datasets.load_dataset(
        "parquet", data_files={"train": parquet}, split="train", streaming=True
    )
    with_sizes.info.splits = datasets.SplitDict({"train": datasets.SplitInfo("train", num_examples=5)})
    monkeypatch.setattr(datasets, "load_dataset", lambda path, **kwargs: with_sizes)
    assert len(load_pgm("hub")) == 5 and len(load_pgm("hub", max_samples=2)) == 2


class _Tiny(torch.nn.Module):
    """Scores the 8 candidates from the mean of each candidate panel (enough for Trainer to step)."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(()))

    def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = self.scale * pixel_values[:, 8:].float().mean(dim=(2, 3))
        return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}


def _collate(puzzles: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    return {
        "pixel_values": torch.from_numpy(np.stack([p["panels"][:, ::40, ::40] for p in puzzles])) / 255.0,
        "labels": torch.tensor([p["target"] for p in puzzles]),
    }


@pytest.mark.parametrize("source", ["archive", "hub"])
def test_trainer_derives_its_steps_from_a_streamed_split(
    files: dict[str, Path], tmp_path: Path, source: str
) -> None:
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(
        str(tmp_path), per_device_train_batch_size=2, num_train_epochs=2, report_to="none", use_cpu=True,
        save_strategy="no", logging_strategy="no", dataloader_num_workers=0, remove_unused_columns=False,
    )  # fmt: skip
    trainer = Trainer(model=_Tiny(), args=args, train_dataset=_load(files, source), data_collator=_collate)
    assert trainer.train().global_step == 2 * 3  # 5 puzzles: 3 batches of 2 per epoch


# ----------------------------------------------------------------------------------------------------------
# The pre-training check and skipped files
# ----------------------------------------------------------------------------------------------------------


def _folder_with_bad(tmp_path: Path, kind: str) -> tuple[Path, Path]:
    folder = write_deepmind_folder(tmp_path / "deepmind", {"train": (1, 3, 4)})
    return folder, write_bad_npz(folder / "PGM_neutral_train_2.npz", kind)


@pytest.mark.parametrize("kind", sorted(BAD_NPZ))
def test_the_check_refuses_a_bad_file_before_training(tmp_path: Path, kind: str) -> None:
    folder, bad = _folder_with_bad(tmp_path, kind)
    ds = load_pgm("deepmind", data_dir=folder)
    with pytest.raises(PGMFileError) as error:  # a sample of 1 misses the bad file: its headers catch it
        check_pgm_source(ds, sample_size=1)
    assert error.value.file == str(bad)
    assert (
        str(bad) in str(error.value)
        and BAD_NPZ[kind] in str(error.value)
        and "skip_bad_files" in str(error.value)
    )
    archive = load_pgm(
        "deepmind", data_dir=write_deepmind_archive(tmp_path / "neutral.tar.gz", folder), index_dir=tmp_path
    )
    with pytest.raises(PGMFileError, match=r"neutral\.tar\.gz:neutral/PGM_neutral_train_2\.npz") as error:
        check_pgm_source(archive, sample_size=16)
    assert BAD_NPZ[kind] in str(error.value)


def test_the_header_check_reads_no_pixels(files: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(np, "load", lambda *a, **k: pytest.fail("np.load reads whole arrays"))
    report = check_pgm_source(_load(files, "folder"), sample_size=0)
    assert (report.checked, report.read_fully, report.bad, report.num_rows) == (5, 0, [], 5)


def test_a_check_of_the_sample_only_opens_only_the_sample(tmp_path: Path) -> None:
    folder, bad = _folder_with_bad(tmp_path, "target 9")  # files 1, 2 (bad), 3, 4: a sample of 2 is 1 and 4
    report = check_pgm_source(load_pgm("deepmind", data_dir=folder), sample_size=2, every_file=False)
    assert (report.checked, report.read_fully, report.bad) == (2, 2, [])
    with pytest.raises(PGMFileError, match="'target' is 9"):
        check_pgm_source(load_pgm("deepmind", data_dir=folder), sample_size=2)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_skip_bad_files_leaves_out_what_the_check_finds_and_counts_it(
    tmp_path: Path, num_workers: int
) -> None:
    folder, bad = _folder_with_bad(tmp_path, "truncated")
    write_bad_npz(folder / "PGM_neutral_train_5.npz", "meta_target disagrees", puzzle_id=5)
    log = tmp_path / "skipped.tsv"
    ds = load_pgm("deepmind", data_dir=folder, skip_bad_files=True, skip_log=log)
    assert len(ds) == 5
    report = check_pgm_source(ds, sample_size=16, num_workers=num_workers)
    assert len(ds) == report.num_rows == 3 and sorted(content_key(ds[i]) for i in range(3)) == content_keys(
        (1, 3, 4)
    )
    assert ds.skipped_files == [str(bad), str(folder / "PGM_neutral_train_5.npz")] == pgm.skipped_files(ds)
    summary = report.to_dict()
    assert summary["num_bad"] == 2 and summary["skipped"] and "'meta_target' marks" in summary["bad"][1]
    assert len(log.read_text().splitlines()) == 2  # the file a run script can keep beside its results


def test_skip_bad_files_in_an_archive_and_in_hub_parquet(tmp_path: Path) -> None:
    folder, _ = _folder_with_bad(tmp_path, "target 9")
    archive = load_pgm(
        "deepmind", data_dir=write_deepmind_archive(tmp_path / "neutral.tar.gz", folder), index_dir=tmp_path,
        skip_bad_files=True,
    )  # fmt: skip
    report = check_pgm_source(archive)
    assert len(archive) == report.num_rows == 3 and report.to_dict()["num_bad"] == 1
    assert sorted(content_key(one) for one in archive) == content_keys((1, 3, 4))
    assert archive.skipped_files == [f"{tmp_path}/neutral.tar.gz:neutral/PGM_neutral_train_2.npz"]

    rows = hub_rows((1, 2, 3))
    rows["panels"][1][3] = {"bytes": b"\x89PNG\r\n\x1a\n not an image", "path": None}
    datasets.Dataset.from_dict(rows, features=HUB_FEATURES).to_parquet(str(tmp_path / "train.parquet"))
    hub = load_pgm("hub", data_dir=tmp_path / "train.parquet", skip_bad_files=True)
    assert len(hub) == 3 and check_pgm_source(hub).num_rows == len(hub) == 2
    assert sorted(content_key(one) for one in hub) == content_keys((1, 3))
    assert hub.skipped_files == [f"{tmp_path}/train.parquet row 1 (id=2)"]


def test_files_skipped_in_dataloader_workers_are_counted(tmp_path: Path) -> None:
    folder, bad = _folder_with_bad(tmp_path, "pixels above 255")  # passes the header check: found when read
    for streaming in (False, True):
        ds = load_pgm("deepmind", data_dir=folder, skip_bad_files=True, streaming=streaming)
        loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, collate_fn=lambda x: x)
        keys = [content_key(one) for one in loader]
        assert set(keys) == set(content_keys((1, 3, 4))), streaming
        assert set(ds.skipped_files) == {str(bad)}, streaming


def test_check_pgm_source_refuses_what_load_pgm_did_not_make() -> None:
    with pytest.raises(TypeError, match="check_pgm_source takes a split from load_pgm, got list"):
        check_pgm_source([])


# ----------------------------------------------------------------------------------------------------------
# Errors that name their cause
# ----------------------------------------------------------------------------------------------------------


def test_a_truncated_archive_names_the_archive_and_the_member(files: dict[str, Path], tmp_path: Path) -> None:
    data = files["archive"].read_bytes()
    truncated = tmp_path / "neutral.tar.gz"
    truncated.write_bytes(data[: len(data) * 2 // 3])
    with pytest.raises(
        PGMFileError, match=rf"{truncated}(:neutral/PGM_neutral_\w+\.npz: | .*member 'neutral/PGM_)"
    ):
        list(load_pgm("deepmind", split="val", data_dir=truncated))
    with pytest.raises(
        PGMFileError, match=r"is truncated or corrupt .*expected a complete <regime>\.tar\.gz"
    ):
        len(load_pgm("deepmind", data_dir=truncated, index_dir=tmp_path))


@pytest.mark.parametrize("damage", ["corrupt", "truncated"])
def test_a_bad_png_in_hub_parquet_names_the_file_and_the_row(tmp_path: Path, damage: str) -> None:
    rows = hub_rows((6, 7))
    png = rows["choices"][1][2]
    encoded = datasets.Image().encode_example(png)["bytes"]
    rows["choices"][1][2] = {
        "bytes": encoded[: len(encoded) // 2] if damage == "truncated" else b"garbage",
        "path": None,
    }
    file = tmp_path / "data" / "train-00000-of-00001.parquet"
    file.parent.mkdir()
    datasets.Dataset.from_dict(rows, features=HUB_FEATURES).to_parquet(str(file))
    message = rf"{file} row 1 \(id=7\): panel 10 cannot be decoded as an image"
    with pytest.raises(PGMFileError, match=message):
        list(load_pgm("hub", data_dir=tmp_path))
    with pytest.raises(PGMFileError, match=message):
        check_pgm_source(load_pgm("hub", data_dir=tmp_path))
    with pytest.raises(PGMFileError, match=message):
        load_pgm("hub", data_dir=tmp_path, streaming=False, cache_dir=str(tmp_path / "cache"))[1]


def test_a_bad_row_in_the_second_parquet_file_is_named_by_that_file(tmp_path: Path) -> None:
    write_hub_parquet(tmp_path, {"train": [(1, 2), (3, 4)]})
    second = tmp_path / "data" / "train-00001-of-00002.parquet"
    rows = hub_rows((3, 4))
    rows["target"][1] = 8
    datasets.Dataset.from_dict(rows, features=HUB_FEATURES).to_parquet(str(second))
    message = rf"{second} row 1 \(id=4\): 'target' is 8"
    with pytest.raises(PGMFileError, match=message):
        list(load_pgm("hub", data_dir=tmp_path))
    rows_dataset = load_pgm("hub", data_dir=tmp_path, streaming=False, cache_dir=str(tmp_path / "cache"))
    assert [content_key(rows_dataset[i]) for i in range(3)] == [content_key(puzzle(i)) for i in (1, 2, 3)]
    with pytest.raises(PGMFileError, match=message):
        rows_dataset[3]


def test_a_hub_row_whose_meta_target_disagrees_is_refused(tmp_path: Path) -> None:
    rows = hub_rows((6,))
    rows["meta_target"][0] = 1 - rows["meta_target"][0]
    datasets.Dataset.from_dict(rows, features=HUB_FEATURES).to_parquet(str(tmp_path / "train.parquet"))
    with pytest.raises(PGMFileError, match=r"row 0 \(id=6\): 'meta_target' marks .* but the rows of"):
        list(load_pgm("hub", data_dir=tmp_path))


# ----------------------------------------------------------------------------------------------------------
# DeepMind's image, and the same puzzles from every source
# ----------------------------------------------------------------------------------------------------------


def test_deepmind_image_is_reshaped_as_its_readme_says(tmp_path: Path) -> None:
    arrays = deepmind_arrays(11)
    assert arrays["image"].shape == (SIDE, SIDE, 16) and arrays["image"].dtype == np.uint8
    expected = arrays["image"].reshape(16, SIDE, SIDE)  # the README's fix
    read = load_pgm("deepmind", data_dir=write_deepmind_folder(tmp_path, {"train": (11,)}))[0]["panels"]
    np.testing.assert_array_equal(read, expected)
    np.testing.assert_array_equal(read, puzzle(11)["panels"])
    assert not np.array_equal(read, np.moveaxis(arrays["image"], -1, 0))  # a transpose scrambles the panels
    write_npz(tmp_path / "neutral" / "PGM_neutral_train_11.npz", 11, image=expected)  # stored (16, 160, 160)
    np.testing.assert_array_equal(load_pgm("deepmind", data_dir=tmp_path)[0]["panels"], expected)


def test_every_source_gives_the_same_puzzles_for_the_same_files(files: dict[str, Path]) -> None:
    for split, ids in SPLITS.items():
        by_source = {
            source: {content_key(p): p for p in _every(_load(files, source, split))} for source in SOURCES
        }
        assert all(sorted(found) == content_keys(ids) for found in by_source.values()), split
        for key, one in by_source["folder"].items():
            for source in SOURCES[1:]:
                other = by_source[source][key]
                for field in pgm.SCHEMA_KEYS:
                    np.testing.assert_array_equal(
                        other[field], one[field], err_msg=f"{split} {source} {field}"
                    )
    hub_order = [content_key(p) for p in _load(files, "hub")]
    assert hub_order == [content_key(puzzle(i)) for i in SPLITS["train"]]  # the Parquet files' order


def test_a_shuffled_stream_changes_order_with_the_epoch_and_keeps_every_puzzle(
    files: dict[str, Path],
) -> None:
    stream = _load(files, "archive", shuffle_buffer_size=3, seed=4, num_shards=2)
    orders = []
    for epoch in range(3):
        stream.set_epoch(epoch)
        orders.append([content_key(one) for one in stream])
    assert all(sorted(order) == content_keys(SPLITS["train"]) for order in orders)
    assert len({tuple(order) for order in orders}) > 1


def test_skip_warnings_name_the_file(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    folder, bad = _folder_with_bad(tmp_path, "empty")
    with caplog.at_level(logging.WARNING, logger="ni_hf.data.pgm"):
        check_pgm_source(load_pgm("deepmind", data_dir=folder, skip_bad_files=True))
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1 and messages[0].startswith(f"skipping bad PGM file (1 skipped so far): {bad}: ")
    assert BAD_NPZ["empty"] in messages[0]
