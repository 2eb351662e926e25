"""Small PGM files in the real layouts, for the loader tests and the run_pgm end-to-end tests.

- DeepMind's release: ``<root>/<regime>/PGM_<regime>_<split>_<id>.npz`` with the keys, shapes and dtypes of
  its files: ``target`` (0-d int64), ``image`` ((160, 160, 16) uint8, the panels stored panel-major under that
  label, so that ``reshape(16, 160, 160)`` gives them, as the release's README says),
  ``relation_structure_encoded`` ((4, 12) int64), ``relation_structure`` ((triples, 3) bytes: object,
  attribute, relation) and ``meta_target`` ((12,) int64, the OR of the structure's rows); and the regime's
  ``<regime>.tar.gz`` holding ``<regime>/...``.
- The Hub's ``HuggingFaceM4/PGM``: ``data/<train|validation|test>-0000k-of-0000n.parquet`` with its features
  (``panels`` and ``choices``: 8 PNG images each, Array2D structure and meta_target, uint8 target, int32 id).

Puzzle `i` is the same from every writer (`puzzle(i)`), so a test can compare what each source yields.
"""

from __future__ import annotations

import hashlib
import tarfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import datasets
import numpy as np
from PIL import Image

from ni_hf.data.pgm_generator import TRIPLES, encode_triples

SIDE = 160  # DeepMind's panel side

HUB_FEATURES = datasets.Features(
    {
        "panels": [datasets.Image(decode=True)],
        "choices": [datasets.Image(decode=True)],
        "relation_structure_encoded": datasets.Array2D(shape=(4, 12), dtype="uint8"),
        "relation_structure": datasets.Array2D(shape=(1, 3), dtype="string"),
        "meta_target": datasets.Array2D(shape=(1, 12), dtype="uint8"),
        "target": datasets.Value("uint8"),
        "id": datasets.Value("int32"),
    }
)


def triples(puzzle_id: int) -> list[tuple[str, str, str]]:
    """The 1-4 (object, attribute, relation) triples of puzzle `puzzle_id`."""
    rng = np.random.default_rng(10_000 + puzzle_id)
    chosen = rng.choice(len(TRIPLES), size=1 + puzzle_id % 4, replace=False)
    return [TRIPLES[i] for i in sorted(chosen)]


def puzzle(puzzle_id: int, side: int = SIDE) -> dict[str, Any]:
    """Puzzle `puzzle_id` in the loaders' schema: 16 panels of 4x4 blocks (compressible, all different)."""
    rng = np.random.default_rng(puzzle_id)
    blocks = rng.integers(0, 256, (16, 4, 4), dtype=np.uint8)
    if side % 4 == 0:
        panels = blocks.repeat(side // 4, axis=1).repeat(side // 4, axis=2)
    else:
        panels = rng.integers(0, 256, (16, side, side), dtype=np.uint8)
    meta_target, structure = encode_triples(triples(puzzle_id))
    return {
        "panels": panels,
        "target": puzzle_id % 8,
        "meta_target": meta_target,
        "relation_structure_encoded": structure,
    }


def deepmind_arrays(puzzle_id: int, side: int = SIDE) -> dict[str, np.ndarray]:
    """The arrays of DeepMind's file for puzzle `puzzle_id`, in its key order, shapes and dtypes."""
    one = puzzle(puzzle_id, side)
    return {
        "target": np.array(one["target"], dtype=np.int64),
        # Panel-major bytes labelled (H, W, 16): the README's fix is reshape(16, 160, 160), not a transpose.
        "image": one["panels"].reshape(side, side, 16),
        "relation_structure_encoded": one["relation_structure_encoded"].astype(np.int64),
        "relation_structure": np.array([[n.encode() for n in triple] for triple in triples(puzzle_id)]),
        "meta_target": one["meta_target"].astype(np.int64),
    }


def write_npz(path: Path, puzzle_id: int, side: int = SIDE, **overrides: Any) -> Path:
    """Write DeepMind's file for `puzzle_id`; `overrides` replace arrays (None removes a key)."""
    arrays: dict[str, Any] = {**deepmind_arrays(puzzle_id, side), **overrides}
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **{key: value for key, value in arrays.items() if value is not None})
    return path


def write_deepmind_folder(
    root: Path, splits: Mapping[str, Iterable[int]], regime: str = "neutral", side: int = SIDE
) -> Path:
    """Write ``<root>/<regime>/PGM_<regime>_<split>_<id>.npz`` for these ids per split; return the folder."""
    folder = root / regime
    for split, ids in splits.items():
        for puzzle_id in ids:
            write_npz(folder / f"PGM_{regime}_{split}_{puzzle_id}.npz", puzzle_id, side)
    return folder


def write_deepmind_archive(path: Path, folder: Path, arcname: str | None = None) -> Path:
    """Pack a regime folder as DeepMind's ``<regime>.tar.gz`` (members ``<regime>/<file>``, sorted)."""
    with tarfile.open(path, "w:gz", compresslevel=1) as tar:
        for file in sorted(folder.rglob("*")):
            tar.add(file, arcname=f"{arcname or folder.name}/{file.relative_to(folder)}", recursive=False)
    return path


def hub_rows(ids: Sequence[int], side: int = SIDE) -> dict[str, list[Any]]:
    """Rows in the Hub's layout for these puzzle ids."""
    rows: dict[str, list[Any]] = {key: [] for key in HUB_FEATURES}
    for puzzle_id in ids:
        one = puzzle(puzzle_id, side)
        rows["panels"].append([Image.fromarray(p) for p in one["panels"][:8]])
        rows["choices"].append([Image.fromarray(p) for p in one["panels"][8:]])
        rows["relation_structure_encoded"].append(one["relation_structure_encoded"])
        rows["relation_structure"].append(np.array([list(triples(puzzle_id)[0])]))
        rows["meta_target"].append(one["meta_target"][np.newaxis])
        rows["target"].append(one["target"])
        rows["id"].append(puzzle_id)
    return rows


def write_hub_parquet(root: Path, splits: Mapping[str, Sequence[Sequence[int]]], side: int = SIDE) -> Path:
    """Write ``<root>/data/<split>-0000k-of-0000n.parquet``, one file per id list; splits named as on the Hub
    (``train``, ``validation``, ``test``). Returns `root`."""
    (root / "data").mkdir(parents=True, exist_ok=True)
    for split, files in splits.items():
        for number, ids in enumerate(files):
            name = f"{split}-{number:05d}-of-{len(files):05d}.parquet"
            rows = datasets.Dataset.from_dict(hub_rows(ids, side), features=HUB_FEATURES)
            rows.to_parquet(str(root / "data" / name))
    return root


def content_key(one: Mapping[str, Any]) -> str:
    """A key identifying a puzzle by its content (panels, target, structure)."""
    parts = [
        np.ascontiguousarray(one[key]).astype(np.uint8).tobytes()
        for key in ("panels", "relation_structure_encoded")
    ]
    return hashlib.sha1(b"".join(parts) + bytes([int(one["target"])])).hexdigest()


def content_keys(ids: Iterable[int], side: int = SIDE) -> list[str]:
    return sorted(content_key(puzzle(i, side)) for i in ids)


# Bad files as a 1.2M-file epoch meets them: (how to write it, part of the message that names the problem).
def _disagreeing_meta_target(puzzle_id: int) -> np.ndarray:
    meta_target = puzzle(puzzle_id)["meta_target"].astype(np.int64)
    meta_target[11 if not meta_target[11] else 10] ^= 1
    return meta_target


BAD_NPZ = {
    "truncated": "cannot be read as .npz",
    "empty": "cannot be read as .npz",
    "target 9": "'target' is 9; expected an integer 0-7",
    "NaN": "'image' has dtype float64; expected integers 0-255",
    "15 panels": "'image' has shape (15, 160, 160); expected 16 square panels",
    "floats": "'image' has dtype float32; expected integers 0-255",
    "meta_target disagrees": "'meta_target' marks",
    "missing key": "missing ['target']",
    "pixels above 255": "values 0..300; expected integers 0-255",
}


def write_bad_npz(path: Path, kind: str, puzzle_id: int = 2) -> Path:
    """Write one of BAD_NPZ's bad files at `path`."""
    image = deepmind_arrays(puzzle_id)["image"]
    if kind in ("truncated", "empty"):
        data = write_npz(path, puzzle_id).read_bytes()
        path.write_bytes(data[: len(data) // 2] if kind == "truncated" else b"")
        return path
    overrides: dict[str, Any] = {
        "target 9": {"target": np.array(9)},
        "NaN": {"image": np.where(image > 128, np.nan, image.astype(np.float64))},
        "15 panels": {"image": np.zeros((15, SIDE, SIDE), dtype=np.uint8)},
        "floats": {"image": image.astype(np.float32)},
        "meta_target disagrees": {"meta_target": _disagreeing_meta_target(puzzle_id)},
        "missing key": {"target": None},
        "pixels above 255": {"image": np.where(image > 128, 300, 0).astype(np.int64)},
    }[kind]
    return write_npz(path, puzzle_id, **overrides)
