"""Upload a finished run's folder to the Hub, and say clearly why an upload failed.

The example scripts upload at the very end, after everything was saved locally, with
:meth:`huggingface_hub.HfApi.upload_folder` rather than ``Trainer.push_to_hub`` (which would replace the run's
model card with its generic one). Checkpoints (``checkpoint-*``, also inside sub-folders) and private files
(``_*``) stay local.
"""

from __future__ import annotations

import logging
import os
import shlex
from pathlib import Path
from typing import Any

__all__ = [
    "UPLOAD_IGNORE_PATTERNS",
    "check_push",
    "explain_push_failure",
    "hub_repo_id",
    "push_folder",
    "push_run",
    "reconstruct_command",
]

logger = logging.getLogger(__name__)

UPLOAD_IGNORE_PATTERNS = ("_*", "checkpoint-*", "*/checkpoint-*", "*/_*")


def hub_repo_id(args: Any) -> str:
    """The repo a run uploads to: ``--hub_model_id``, else the name of ``--output_dir``."""
    return args.hub_model_id or Path(args.output_dir).absolute().name


def check_push(args: Any) -> None:
    """Refuse ``--push_to_hub`` where the upload at the end of the run cannot work: offline, no token, a bad repo id."""
    from huggingface_hub import constants, get_token
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if constants.HF_HUB_OFFLINE:
        raise ValueError(
            "--push_to_hub: HF_HUB_OFFLINE is set, so the upload would fail; unset it, or drop --push_to_hub and "
            "upload the output folder later with `hf upload`."
        )
    if not (args.hub_token or get_token()):
        raise ValueError(
            "--push_to_hub needs a write token: run `hf auth login`, set HF_TOKEN, or pass --hub_token."
        )
    repo_id = hub_repo_id(args)
    try:
        validate_repo_id(repo_id)
    except HFValidationError as error:
        option = "--hub_model_id" if args.hub_model_id else "--output_dir's name (pass --hub_model_id)"
        raise ValueError(f"{option} {repo_id!r} is not a Hub repo id: {error}") from None


def push_run(output_dir: str | os.PathLike, args: Any, commit_message: str) -> str:
    """Upload a finished run's ``output_dir`` to ``hub_repo_id(args)`` with ``args``' token, privacy and revision;
    on failure log why and how to upload it later, and exit with status 1. Returns the commit URL."""
    repo_id = hub_repo_id(args)
    logger.info(f"Uploading {output_dir} to the Hub repo {repo_id}")
    try:
        url = push_folder(
            output_dir,
            repo_id,
            commit_message=commit_message,
            token=args.hub_token,
            private=args.hub_private_repo,
            revision=args.hub_revision,
        )
    except Exception as error:  # noqa: BLE001 - every failure gets the same explanation
        logger.error(explain_push_failure(error, output_dir, repo_id))
        raise SystemExit(1) from error
    logger.info(f"Pushed to {url}")
    return url


def push_folder(
    folder: str | os.PathLike,
    repo_id: str,
    *,
    commit_message: str,
    token: str | None = None,
    private: bool | None = None,
    revision: str | None = None,
) -> str:
    """Create the repo if needed and upload ``folder`` without its checkpoints; return the commit URL."""
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    repo = api.create_repo(repo_id, private=private, exist_ok=True)
    commit = api.upload_folder(
        repo_id=repo.repo_id,
        folder_path=str(folder),
        commit_message=commit_message,
        ignore_patterns=list(UPLOAD_IGNORE_PATTERNS),
        revision=revision,
    )
    return str(getattr(commit, "commit_url", commit))


def explain_push_failure(error: BaseException, folder: str | os.PathLike, repo_id: str) -> str:
    """A message that says why the upload failed and how to upload the saved folder later."""
    from huggingface_hub.errors import OfflineModeIsEnabled

    if isinstance(error, OfflineModeIsEnabled):
        reason = "HF_HUB_OFFLINE is set, so huggingface_hub refuses to contact the Hub"
    else:
        reason = f"the Hub could not be reached or refused the upload ({type(error).__name__}: {error})"
    excludes = " ".join(f"--exclude '{pattern}'" for pattern in UPLOAD_IGNORE_PATTERNS)
    return (
        f"--push_to_hub failed: {reason}. Everything was saved locally in {folder}. Upload it later from "
        f"a machine with network access and a write token (`hf auth login`) with:\n"
        f"    hf upload {repo_id} {folder} . {excludes}"
    )


def reconstruct_command(script: str | os.PathLike, argv: list[str], world_size: int) -> tuple[str, str]:
    """The command line of this run (as well as it can be known from inside) and a note on the launcher."""
    script = Path(script).resolve()
    try:
        script_text = str(script.relative_to(Path.cwd()))
    except ValueError:
        script_text = str(script)
    if world_size <= 1:
        launcher, note = "python", "one process"
    elif any(key.startswith("ACCELERATE_") for key in os.environ):
        launcher, note = f"accelerate launch --num_processes {world_size}", f"{world_size} processes"
    else:
        launcher, note = f"torchrun --nproc_per_node {world_size}", f"{world_size} processes"
    return (
        f"{launcher} {script_text} {shlex.join(argv)}".strip(),
        note + "; launcher reconstructed by the script",
    )
