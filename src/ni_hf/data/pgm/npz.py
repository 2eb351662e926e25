"""One DeepMind `.npz` file: read in full into the schema, or checked from its headers without its pixels.

DeepMind's files (github.com/google-deepmind/abstract-reasoning-matrices, README) hold ``image`` ("a
160x160x16 integer array with values from 0 to 255", stored panel-major, hence ``reshape(16, 160, 160)``),
``target``, ``meta_target`` (12 bits), ``relation_structure_encoded`` (4x12 bits; the README calls it
``meta_matrix``, also accepted) and ``relation_structure`` (the triples' names, not read).
"""

from __future__ import annotations

import os
import zipfile
from typing import IO, Any

import numpy as np

from .common import PGMFileError, check_image_layout, check_labels, make_puzzle, panels_from_image

NPZ_EXPECTED = (
    "keys 'image' (16 square panels, 160x160x16 integers 0-255), 'target' (0-7), 'meta_target' (12 bits), "
    "'relation_structure_encoded' (4x12 bits)"
)
_LABEL_KEYS = ("target", "meta_target")


def _unreadable(where: str, err: Exception) -> PGMFileError:
    return PGMFileError(
        where, f"cannot be read as .npz ({type(err).__name__}: {err}); expected an .npz with {NPZ_EXPECTED}"
    )


def _keys(names: list[str], where: str) -> tuple[str, str, str, str]:
    """The members holding image, target, meta_target and the structure, or refuse naming the missing ones."""
    keys = {name.removesuffix(".npy") for name in names}
    structure = "relation_structure_encoded" if "relation_structure_encoded" in keys else "meta_matrix"
    missing = [key for key in ("image", *_LABEL_KEYS) if key not in keys]
    if structure not in keys:
        missing.append("relation_structure_encoded")
    if missing:
        raise PGMFileError(where, f"has keys {sorted(keys)}, missing {missing}; expected {NPZ_EXPECTED}")
    return "image", "target", "meta_target", structure


def read_deepmind_npz(file: str | os.PathLike[str] | IO[bytes], name: str | None = None) -> dict[str, Any]:
    """Read one DeepMind `.npz` (a path or a binary file object) into the schema; `name` labels errors."""
    where = name if name is not None else os.fspath(file)  # type: ignore[arg-type]
    try:
        data = np.load(file, allow_pickle=False)
    except Exception as err:  # anything numpy raises on a file that is not a readable .npz
        raise _unreadable(where, err) from err
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise PGMFileError(
            where, f"holds a single {type(data).__name__}, not an .npz archive; expected {NPZ_EXPECTED}"
        )
    with data:
        keys = _keys(list(data.files), where)
        try:
            image, target, meta_target, structure = (data[key] for key in keys)
        except Exception as err:  # a corrupt member (CRC, zlib) surfaces only when it is read
            raise _unreadable(where, err) from err
    return make_puzzle(panels_from_image(image, where), target, meta_target, structure, where)


def _header(archive: zipfile.ZipFile, member: str) -> tuple[tuple[int, ...], np.dtype, int]:
    """Shape, dtype and header length of one .npy member, read from its first bytes only."""
    with archive.open(member) as file:
        version = np.lib.format.read_magic(file)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(file)
        else:
            shape, _, dtype = np.lib.format.read_array_header_2_0(file)
        return tuple(shape), dtype, file.tell()


def _read_small(archive: zipfile.ZipFile, member: str) -> np.ndarray:
    with archive.open(member) as file:
        return np.lib.format.read_array(file, allow_pickle=False)


def inspect_deepmind_npz(file: str | os.PathLike[str] | IO[bytes], name: str | None = None) -> None:
    """Check one DeepMind `.npz` without reading its uint8 pixels: that it opens, its keys, `image`'s shape,
    dtype and stored size, and the labels in full (a few bytes); pixels of another integer type are read to
    check their range. Raise :class:`PGMFileError` naming what is wrong."""
    where = name if name is not None else os.fspath(file)  # type: ignore[arg-type]
    try:
        with zipfile.ZipFile(file) as archive:
            members = {member.removesuffix(".npy"): member for member in archive.namelist()}
            image_key, *label_keys = _keys(list(members), where)
            shape, dtype, header_bytes = _header(archive, members[image_key])
            stored = archive.getinfo(members[image_key]).file_size
            labels = [_read_small(archive, members[key]) for key in label_keys]
            # Pixels other than uint8 may leave 0-255: those (rare) files are read in full.
            image = _read_small(archive, members[image_key]) if np.dtype(dtype) != np.uint8 else None
    except PGMFileError:
        raise
    except Exception as err:  # zipfile, numpy's header parser, zlib: a file that is not a readable .npz
        raise _unreadable(where, err) from err
    check_image_layout(shape, dtype, where)
    expected = header_bytes + int(np.prod(shape)) * np.dtype(dtype).itemsize
    if stored != expected:
        raise PGMFileError(
            where, f"'image' stores {stored} bytes; its header {shape} {dtype} needs {expected} (truncated?)"
        )
    check_labels(*labels, where)
    if image is not None:
        panels_from_image(image, where)
