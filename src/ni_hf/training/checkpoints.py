"""Checkpoints a script reads or resumes from: weights that must fit the model, the newest complete
``checkpoint-<step>``, and the lock that keeps two runs out of one output folder."""

from __future__ import annotations

import json
import logging
import os
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import transformers

logger = logging.getLogger(__name__)

__all__ = [
    "LOCK_NAME",
    "ExactResumeMixin",
    "check_weights_readable",
    "last_complete_checkpoint",
    "load_checked",
    "output_dir_lock",
    "read_checkpoint_config",
    "resolve_resume_checkpoint",
]

LOCK_NAME = "_run.lock"  # "_*" files stay local when the folder is pushed (ni_hf.training.publishing)
WEIGHTS_NAMES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
RESUME_LAST = ("true", "last", "latest")
ALLOW_FLAG = "--allow_mismatched_weights"


# --------------------------------------------------------------------------------------------------- weights


def weights_file(path: str) -> str:
    """The weights file transformers reads from a local model folder (safetensors first), else a description."""
    for name in WEIGHTS_NAMES:
        if (Path(path) / name).is_file():
            return str(Path(path) / name)
    return f"the weights of {path}"


def check_weights_readable(path: str, option: str = "--model_name_or_path") -> None:
    """A local model folder's weights file must open; else an error naming the option and the file."""
    folder = Path(path)
    safetensors = folder / "model.safetensors"
    if safetensors.is_file():
        from safetensors import safe_open

        try:
            with safe_open(str(safetensors), framework="pt") as handle:
                handle.keys()
        except Exception as error:  # noqa: BLE001 - safetensors raises its own, unexported error types
            raise ValueError(
                f"{option} {path}: {safetensors} is not a readable safetensors file ({type(error).__name__}: "
                f"{error}); the checkpoint is damaged or was not written completely: save or download it again."
            ) from error
        return
    pickled = folder / "pytorch_model.bin"
    if pickled.is_file():
        # torch.save writes a zip archive whose directory sits at the end: a truncated file has none.
        try:
            with zipfile.ZipFile(pickled) as archive:
                archive.namelist()
        except (zipfile.BadZipFile, OSError) as error:
            raise ValueError(
                f"{option} {path}: {pickled} is not a readable PyTorch weights file ({error}); the checkpoint is "
                "damaged or was not written completely: save or download it again."
            ) from error


def read_checkpoint_config(path: str, option: str = "--model_name_or_path") -> dict[str, Any]:
    """The config.json of a local folder or a Hub repo as a dict; neither is an error naming ``option``."""
    try:
        config_dict, _ = transformers.PretrainedConfig.get_config_dict(path)
    except OSError as error:
        where = (
            "holds no config.json" if os.path.isdir(path) else f"is no folder here ({Path(path).absolute()})"
        )
        raise ValueError(
            f"{option} {path}: {where}, and no model on the Hub could be read by that name either ({error})"
        ) from error
    return config_dict


def _examples(keys: Any, count: int = 3) -> str:
    keys = sorted(keys, key=str)
    shown = ", ".join(str(key) for key in keys[:count])
    return shown + (", ..." if len(keys) > count else "")


def load_checked(
    model_class: type[transformers.PreTrainedModel],
    path: str,
    allow_mismatched_weights: bool = False,
    option: str = "--model_name_or_path",
    **kwargs: Any,
) -> transformers.PreTrainedModel:
    """``model_class.from_pretrained(path, **kwargs)``, refusing a checkpoint of another model type, and weights that
    leave parameters of the model missing, hold tensors it lacks, or have other shapes (the error names the weights
    file, the counts and a few names); ``allow_mismatched_weights`` loads such weights with a warning instead."""
    config_class = getattr(model_class, "config_class", None)
    expected_type = getattr(config_class, "model_type", None)
    found_type = read_checkpoint_config(path, option).get("model_type")
    if expected_type and found_type != expected_type and "config" not in kwargs:
        raise ValueError(
            f"{option} {path}: its config.json describes a {found_type!r} model; {model_class.__name__} reads "
            f"{expected_type!r} checkpoints."
        )
    if os.path.isdir(path):
        check_weights_readable(path, option)
    model, info = model_class.from_pretrained(
        path, output_loading_info=True, ignore_mismatched_sizes=True, **kwargs
    )
    missing, unexpected, mismatched = info["missing_keys"], info["unexpected_keys"], info["mismatched_keys"]
    if not (missing or unexpected or mismatched):
        return model
    total = len(model.state_dict())
    problems = []
    if missing:
        problems.append(
            f"{len(missing)} of the model's {total} tensors are missing from it ({_examples(missing)})"
        )
    if unexpected:
        problems.append(f"{len(unexpected)} of its tensors are not the model's ({_examples(unexpected)})")
    if mismatched:
        shapes = [
            f"{key}: {tuple(saved)} in the file, {tuple(built)} in the model"
            for key, saved, built in mismatched
        ]
        problems.append(f"{len(mismatched)} have another shape ({_examples(shapes, 2)})")
    message = (
        f"{option} {path}: {weights_file(path)} does not fit {model_class.__name__}: {'; '.join(problems)}. The "
        "weights belong to another model or config."
    )
    if not allow_mismatched_weights:
        raise ValueError(
            f"{message} Pass {ALLOW_FLAG} to use them anyway, with the missing and mismatched tensors randomly "
            "initialised."
        )
    logger.warning(f"{message} {ALLOW_FLAG}: the missing and mismatched tensors are randomly initialised.")
    return model


# ------------------------------------------------------------------------------------------------- resuming


def _complete(folder: Path) -> bool:
    """Whether a ``checkpoint-<step>`` folder holds a readable ``trainer_state.json`` of its step (the Trainer writes
    it last, so a save killed midway has none, or a truncated one)."""
    try:
        state = json.loads((folder / "trainer_state.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(state, dict) and str(state.get("global_step")) == folder.name.split("-")[-1]


def last_complete_checkpoint(output_dir: str) -> str:
    """The newest ``checkpoint-<step>`` in ``output_dir`` whose save finished; unfinished ones are skipped, with a
    warning."""
    folders = sorted(
        (p for p in Path(output_dir).glob("checkpoint-*") if p.is_dir() and p.name.split("-")[-1].isdigit()),
        key=lambda p: int(p.name.split("-")[-1]),
        reverse=True,
    )
    for folder in folders:
        if _complete(folder):
            return str(folder)
        logger.warning(
            f"Skipping {folder}: no readable trainer_state.json of its step, its save did not finish."
        )
    raise ValueError(
        f"--resume_from_checkpoint last: no complete checkpoint (a checkpoint-* folder with trainer_state.json) "
        f"in {output_dir}."
    )


def resolve_resume_checkpoint(value: str | None, output_dir: str) -> str | None:
    """``--resume_from_checkpoint``: None for none, the newest complete checkpoint for true/last/latest, else the
    given folder, which must hold a finished save."""
    if value is None or not str(value).strip() or str(value).lower() == "false":
        return None
    if str(value).lower() in RESUME_LAST:
        return last_complete_checkpoint(output_dir)
    folder = Path(value).expanduser()
    if not folder.is_dir():
        raise ValueError(f"--resume_from_checkpoint {value}: no such folder (or pass 'last').")
    if not (folder / "trainer_state.json").is_file():
        raise ValueError(
            f"--resume_from_checkpoint {value}: no trainer_state.json, so not a finished checkpoint of a training "
            "run; pass 'last' for the newest complete one in --output_dir."
        )
    return str(folder)


# ---------------------------------------------------------------------------------------------- the run lock


def _alive(pid: int) -> bool:
    """Whether a process with this id exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


@contextmanager
def output_dir_lock(output_dir: str, enabled: bool = True) -> Iterator[None]:
    """Hold ``<output_dir>/_run.lock`` (this PID) for the run: a second run on the same folder is refused while
    the first is alive; a lock left by a dead process is taken over."""
    if not enabled:
        yield
        return
    path = Path(output_dir) / LOCK_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            text = path.read_text().strip() if path.exists() else ""
            pid = int(text) if text.isdigit() else None
            if pid is not None and pid != os.getpid() and _alive(pid):
                raise RuntimeError(
                    f"--output_dir {output_dir} is in use by another run (process {pid}, lock file {path}); wait "
                    "for it to finish or pass another --output_dir."
                ) from None
            logger.warning(f"Taking over {path}: its process ({text or 'unknown'}) is gone.")
            path.unlink(missing_ok=True)
            continue
        with os.fdopen(fd, "w") as handle:
            handle.write(str(os.getpid()))
        break
    try:
        yield
    finally:
        path.unlink(missing_ok=True)


# ------------------------------------------------------------------------------------------ exact resuming


class ExactResumeMixin:
    """Trainer mixin: a resumed run draws the same random numbers as an uninterrupted one, with persistent
    DataLoader workers too.

    Each new DataLoader iterator draws its workers' base seed from the loader's generator, torch's global one when
    the loader has none. A loader with persistent workers makes one iterator for the whole run; a resumed run makes
    a new one at its first epoch boundary (its partial first epoch has a loader of its own), so from there on the
    global generator, which RandAugment and dropout draw from, would be one number ahead of the uninterrupted run's.
    A generator of the loader's own leaves the global one alone. What workers draw themselves is not replayed: keep
    random transforms in the main process (as the digits script's batch augmentation is).
    """

    def get_train_dataloader(self) -> Any:
        dataloader = super().get_train_dataloader()
        loader = getattr(
            dataloader, "base_dataloader", dataloader
        )  # accelerate's DataLoaderShard wraps a DataLoader
        loader.generator = torch.Generator().manual_seed(self.args.seed)
        return dataloader
