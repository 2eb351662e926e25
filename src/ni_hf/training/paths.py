"""Where a checkpoint argument points: a local folder or a Hub repo id, with a clear error for neither."""

from __future__ import annotations

import os
from pathlib import Path


def check_model_path(path: str, option: str = "--model_name_or_path") -> str:
    """``path`` itself (``~`` expanded) if it is a folder; a Hub repo id as it is; an error for a missing local path.

    A path counts as local when it is absolute, starts with ``.`` or ``~``, or has more than one ``/`` (a Hub
    repo id is ``name`` or ``namespace/name``); transformers would take a missing one for a malformed repo id.
    """
    if not path or not path.strip():
        raise ValueError(f"{option} is empty; expected a saved model's folder or a Hub repo id.")
    local = Path(path).expanduser()
    if local.is_dir():
        return str(local)
    if local.exists():
        raise ValueError(
            f"{option} {path}: not a directory; expected a saved model's folder or a Hub repo id."
        )
    if os.path.isabs(path) or path.startswith((".", "~")) or path.count("/") > 1:
        raise ValueError(
            f"{option} {path}: no such directory; expected a saved model's folder (or a Hub repo id "
            "'namespace/name')."
        )
    return path


__all__ = ["check_model_path"]
