"""Upload a finished run's folder to the Hub, say clearly why an upload failed, and record the command that ran.

The example scripts upload at the very end, after everything was saved locally, with
:meth:`huggingface_hub.HfApi.upload_folder` rather than ``Trainer.push_to_hub`` (which would replace the run's
model card with its generic one). Checkpoints (``checkpoint-*``, also inside sub-folders) and private files
(``_*``) stay local.
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "UPLOAD_IGNORE_PATTERNS",
    "Launch",
    "warn_if_fewer_processes",
    "check_push",
    "detect_launch",
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


# ------------------------------------------------------------------------------------------ the command run

# The launchers a script may run under: how each shows in its process's command line (the entry point's name, or the
# module after "-m"), the name it is recorded by, and the flag that asks for processes (per node for torchrun).
LAUNCHERS = (
    ("accelerate", "accelerate launch", "num_processes"),
    ("accelerate.commands.launch", "accelerate launch", "num_processes"),
    ("torchrun", "torchrun", "nproc_per_node"),
    ("torch.distributed.run", "python -m torch.distributed.run", "nproc_per_node"),
    ("torch.distributed.launch", "python -m torch.distributed.launch", "nproc_per_node"),
    ("deepspeed", "deepspeed", "num_gpus"),
)
TWO_CPU_PROCESSES = (
    "accelerate launch --multi_gpu --num_processes 2 --num_machines 1 --mixed_precision no --dynamo_backend no "
    "{script} --use_cpu true ...",
    "torchrun --nproc_per_node 2 {script} --use_cpu true ...",
)


@dataclass(frozen=True)
class Launch:
    """How this process was started: the launcher's command line as its process holds it (``argv``, empty when the
    process was not started by a known launcher or its parent cannot be read), the launcher's name, and the
    processes it was asked for (None when its flags do not say)."""

    argv: tuple[str, ...] = ()
    launcher: str | None = None
    requested_processes: int | None = None


def _cmdline(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part] or None


def _flag_value(argv: list[str], flag: str) -> str | None:
    """The value of ``--flag N``, ``--flag=N`` or their hyphenated spellings in ``argv`` (the last one given)."""
    names = {f"--{flag}", f"--{flag.replace('_', '-')}"}
    value = None
    for i, item in enumerate(argv):
        name, sep, given = item.partition("=")
        if name in names:
            value = given if sep else (argv[i + 1] if i + 1 < len(argv) else None)
    return value


def _launcher_of(argv: list[str]) -> tuple[str, list[str], str] | None:
    """(the launcher's name, its arguments, its processes flag) of a launcher's command line, else None."""
    items = argv[1:] if Path(argv[0]).name.startswith("python") else list(argv)
    while items and items[0].startswith("-") and items[0] != "-m":  # the interpreter's own options
        items = items[2:] if items[0] in ("-X", "-W") else items[1:]
    if not items:
        return None
    entry, rest = (
        (items[1], items[2:]) if items[0] == "-m" and len(items) > 1 else (Path(items[0]).name, items[1:])
    )
    for shown, name, flag in LAUNCHERS:
        if entry != shown:
            continue
        if shown == "accelerate":  # the accelerate command: its "launch" subcommand only
            if rest[:1] != ["launch"]:
                return None
            rest = rest[1:]
        return name, rest, flag
    return None


def detect_launch() -> Launch:
    """The launcher that started this process, read from its parent's command line in ``/proc`` (Linux): accelerate
    launch, torchrun, ``python -m torch.distributed.run`` or deepspeed; ``Launch()`` when none (or not readable)."""
    parent = _cmdline(os.getppid())
    found = _launcher_of(parent) if parent else None
    if found is None:
        return Launch()
    name, rest, flag = found
    value = _flag_value(rest, flag)
    requested = int(value) if value is not None and value.isdigit() else None
    return Launch((*name.split(), *rest), name, requested)


def _relative(path: str) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except (ValueError, OSError):
        return path


def reconstruct_command(script: str | os.PathLike, argv: list[str], world_size: int) -> tuple[str, str]:
    """The command line that started this run and a note on how it is known: the launcher's own command line with
    all its flags where the parent process is a known launcher that names ``script``; else ``python script argv``
    for one process, or a launcher guessed from the environment (said so) for several."""
    script_text = _relative(str(script))
    launch = detect_launch()
    names_script = any(Path(item).name == Path(script).name for item in launch.argv)
    processes = f"{world_size} process{'es' if world_size != 1 else ''}"
    if launch.launcher and names_script:
        command = shlex.join(_relative(item) if item.endswith(".py") else item for item in launch.argv)
        note = f"{processes}; the command line of the launcher ({launch.launcher}) as its process holds it"
        if launch.requested_processes and launch.requested_processes > world_size:
            note += f", which asked for {launch.requested_processes} processes (see the run's log)"
        return command, note
    if world_size <= 1:
        return f"python {script_text} {shlex.join(argv)}".strip(), f"{processes}; started without a launcher"
    if any(key.startswith("ACCELERATE_") for key in os.environ):
        launcher = f"accelerate launch --num_processes {world_size}"
    else:
        launcher = f"torchrun --nproc_per_node {world_size}"
    return (
        f"{launcher} {script_text} {shlex.join(argv)}".strip(),
        f"{processes}; the launcher could not be read from the parent process, so its name and flags here are "
        "reconstructed from the environment and may differ from those given",
    )


def warn_if_fewer_processes(world_size: int, script: str | os.PathLike | None = None) -> str | None:
    """Warn (and return the warning) when a launcher asked for more processes than the run has, saying how two CPU
    processes are started (for ``script``, default this process's): ``accelerate launch --cpu`` starts one process
    whatever ``--num_processes`` says."""
    launch = detect_launch()
    if not launch.requested_processes or launch.requested_processes <= world_size:
        return None
    script_text = _relative(str(script if script is not None else sys.argv[0]))
    ways = " or ".join(f"`{way.format(script=script_text)}`" for way in TWO_CPU_PROCESSES)
    cpu = " (accelerate's --cpu launcher starts one process)" if "--cpu" in launch.argv else ""
    message = (
        f"`{launch.launcher}` was asked for {launch.requested_processes} processes, but this run has {world_size}"
        f"{cpu}. Two processes on a CPU start with {ways}."
    )
    logger.warning(message)
    return message
