"""Checkpoints a script reads or resumes from: weights that must fit the model and match their recorded SHA-256, the
newest complete ``checkpoint-<step>`` of a run that has not finished, and the lock that keeps two runs out of one output
folder."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers.trainer_utils import TrainOutput, get_last_checkpoint

logger = logging.getLogger(__name__)

__all__ = [
    "CHECKSUM_NAME",
    "LOCK_NAME",
    "ExactResumeMixin",
    "WeightsChecksumMixin",
    "check_not_finished",
    "check_weights_readable",
    "last_complete_checkpoint",
    "load_checked",
    "output_dir_lock",
    "read_checkpoint_config",
    "resolve_resume_checkpoint",
    "verify_weights_checksum",
    "whole_run_train_loss",
    "write_weights_checksum",
]

LOCK_NAME = "_run.lock"  # "_*" files stay local when the folder is pushed (ni_hf.training.publishing)
CHECKSUM_NAME = (
    "weights_sha256.json"  # uploaded with the weights, so that a downloaded copy can be checked too
)
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


# -------------------------------------------------------------------------------------------------- checksums


def _weights_files(folder: Path) -> list[Path]:
    """The weights files of a model folder: the first of ``WEIGHTS_NAMES`` there, with the shards its index names."""
    for name in WEIGHTS_NAMES:
        path = folder / name
        if not path.is_file():
            continue
        if not name.endswith(".index.json"):
            return [path]
        try:
            shards = sorted(set(json.loads(path.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError) as error:
            raise ValueError(f"{path} is not a readable weights index ({error}).") from error
        return [path, *(folder / shard for shard in shards)]
    return []


def _sha256(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def write_weights_checksum(output_dir: str | os.PathLike) -> dict[str, str]:
    """Write ``<output_dir>/weights_sha256.json``, the SHA-256 of each weights file there (safetensors records none of
    its own), and return it as {file name: hex digest}; a folder without weights is an error."""
    folder = Path(output_dir)
    files = _weights_files(folder)
    if not files:
        raise ValueError(f"{folder}: no weights file ({', '.join(WEIGHTS_NAMES)}) to write a checksum of.")
    digests = {path.name: _sha256(path) for path in files}
    text = json.dumps({"algorithm": "sha256", "files": digests}, indent=2) + "\n"
    temporary = (
        folder / f"_{CHECKSUM_NAME}.tmp"
    )  # replaced in one step: a kill leaves the old file or the new one
    temporary.write_text(text)
    temporary.replace(folder / CHECKSUM_NAME)
    return digests


def verify_weights_checksum(path: str | os.PathLike, option: str = "--model_name_or_path") -> bool:
    """Check a local model folder's weights files against its ``weights_sha256.json``: a file that differs, or is
    missing, is an error naming the option, the file and both hashes. True when checked; a folder without the file
    (saved by ``save_pretrained`` alone, or before checksums) is not checked: False, with an info log."""
    folder = Path(path)
    record = folder / CHECKSUM_NAME
    if not record.is_file():
        logger.info(
            f"{option} {path}: no {CHECKSUM_NAME}, so its weights are loaded without a checksum check."
        )
        return False
    try:
        saved = json.loads(record.read_text())
        algorithm, digests = saved["algorithm"], dict(saved["files"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{option} {path}: {record} is not a readable checksum file ({error!r}).") from error
    if algorithm != "sha256":
        raise ValueError(f"{option} {path}: {record} records {algorithm!r} hashes; expected 'sha256'.")
    for name, expected in digests.items():
        weights = folder / name
        if not weights.is_file():
            raise ValueError(f"{option} {path}: {record} records {name}, which is not in the folder.")
        found = _sha256(weights)
        if found != expected:
            raise ValueError(
                f"{option} {path}: {weights} has SHA-256 {found}, but {record} records {expected}: the file changed "
                f"after it was saved (damaged on disk or in a copy). Save or download it again; if you replaced it "
                f"on purpose, delete {CHECKSUM_NAME}."
            )
    logger.info(f"{option} {path}: {', '.join(digests)} match {CHECKSUM_NAME}.")
    return True


def read_checkpoint_config(path: str, option: str = "--model_name_or_path") -> dict[str, Any]:
    """The config.json of a local folder or a Hub repo as a dict; neither is an error naming ``option``."""
    config_file = Path(path).expanduser() / "config.json"
    if (
        Path(path).expanduser().is_dir()
    ):  # transformers 5 reads a folder without config.json as an empty config
        if not config_file.is_file():
            raise ValueError(f"{option} {path}: the folder holds no config.json, so no saved model.")
        try:
            json.loads(config_file.read_text())
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ValueError(f"{option} {path}: {config_file} is not valid JSON ({error}).") from None
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
    """``model_class.from_pretrained(path, **kwargs)``, refusing a checkpoint of another model type, a local folder
    whose weights differ from its ``weights_sha256.json``, and weights that leave parameters of the model missing,
    hold tensors it lacks, or have other shapes (the error names the weights file, the counts and a few names);
    ``allow_mismatched_weights`` loads such weights with a warning instead."""
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
        verify_weights_checksum(path, option)
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


def resolve_resume_checkpoint(
    value: str | None, output_dir: str, training_args: transformers.TrainingArguments | None = None
) -> str | None:
    """``--resume_from_checkpoint``: None for none, the newest complete checkpoint for true/last/latest, else the
    given folder, which must hold a finished save. Its weights must match their checksum (``verify_weights_checksum``),
    and with ``training_args`` the run it belongs to must not have finished (``check_not_finished``)."""
    if value is None or not str(value).strip() or str(value).lower() == "false":
        return None
    if str(value).lower() in RESUME_LAST:
        checkpoint = last_complete_checkpoint(output_dir)
    else:
        folder = Path(value).expanduser()
        if not folder.is_dir():
            raise ValueError(f"--resume_from_checkpoint {value}: no such folder (or pass 'last').")
        if not (folder / "trainer_state.json").is_file():
            raise ValueError(
                f"--resume_from_checkpoint {value}: no trainer_state.json, so not a finished checkpoint of a "
                "training run; pass 'last' for the newest complete one in --output_dir."
            )
        checkpoint = str(folder)
    verify_weights_checksum(checkpoint, "--resume_from_checkpoint")
    if training_args is not None:
        check_not_finished(checkpoint, training_args)
    return checkpoint


def _trainer_state(checkpoint: str | os.PathLike) -> dict[str, Any]:
    path = Path(checkpoint) / "trainer_state.json"
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ValueError(
            f"--resume_from_checkpoint {checkpoint}: {path} is not readable ({error})."
        ) from error
    if not isinstance(state, dict) or not isinstance(state.get("global_step"), int):
        raise ValueError(f"--resume_from_checkpoint {checkpoint}: {path} records no global_step.")
    return state


def check_not_finished(checkpoint: str | os.PathLike, training_args: transformers.TrainingArguments) -> None:
    """Refuse to resume from a checkpoint at or past the end of the run: the Trainer would train one step past it
    and overwrite the final model. With ``--max_steps`` the run ends there; else where the checkpoint's run planned to
    end, unless ``--num_train_epochs`` now asks for more epochs than it did."""
    state = _trainer_state(checkpoint)
    step = state["global_step"]
    if training_args.max_steps > 0:
        end, planned = training_args.max_steps, f"--max_steps {training_args.max_steps}"
    else:
        saved_epochs = int(state.get("num_train_epochs") or 0)
        if math.ceil(training_args.num_train_epochs) > saved_epochs or not state.get("max_steps"):
            return  # more epochs than the saved run planned: it trains on
        end = int(state["max_steps"])
        planned = (
            f"the {saved_epochs} epochs its run planned, --num_train_epochs {training_args.num_train_epochs}"
        )
    if step < end:
        return
    raise ValueError(
        f"--resume_from_checkpoint: {checkpoint} is step {step}, and this run ends at step {end} ({planned}): it has "
        f"finished (its model is in {Path(checkpoint).parent}), and resuming would train past its end and overwrite "
        "that model. Pass a larger --max_steps (or --num_train_epochs) to train it further, or another --output_dir "
        "to train anew."
    )


def whole_run_train_loss(
    checkpoint: str | os.PathLike | dict[str, Any], train_loss: float, global_step: int
) -> float:
    """The mean training loss over all ``global_step`` steps of a resumed run, from the mean over the steps after the
    ``checkpoint`` (what ``Trainer.train`` returns) and the losses logged up to it in its ``trainer_state.json`` (or
    that file's content, read before the run's checkpoint rotation could delete it).

    Each logged ``loss`` is the mean over the steps since the log before; ``ExactResumeMixin`` logs at every save, so
    the windows cover every step up to a checkpoint. Steps a checkpoint's log does not cover (a checkpoint of another
    Trainer) count at the mean of the logged ones, with a warning."""
    state = checkpoint if isinstance(checkpoint, dict) else _trainer_state(checkpoint)
    checkpoint = f"checkpoint-{state['global_step']}" if isinstance(checkpoint, dict) else checkpoint
    resumed_at = state["global_step"]
    total, covered = 0.0, 0
    for entry in state.get("log_history", []):
        step = entry.get("step")
        if "loss" in entry and isinstance(step, int) and covered < step <= resumed_at:
            total += float(entry["loss"]) * (step - covered)
            covered = step
    if covered < resumed_at:
        if not covered:
            logger.warning(
                f"{checkpoint} logged no training loss: train_loss is the mean over steps {resumed_at + 1}-"
                f"{global_step} only."
            )
            return train_loss
        gap = (
            f"step {resumed_at} was"
            if covered + 1 == resumed_at
            else f"steps {covered + 1}-{resumed_at} were"
        )
        logger.warning(
            f"{checkpoint}: {gap} not logged; train_loss counts them at the mean of the logged steps before them."
        )
        total *= resumed_at / covered
    return (total + train_loss * (global_step - resumed_at)) / max(global_step, 1)


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


class WeightsChecksumMixin:
    """Trainer mixin: every model the Trainer saves (``save_model``, each ``checkpoint-<step>``) gets its
    ``weights_sha256.json`` (``write_weights_checksum``), written by the process that saves; a save without a weights
    file of transformers' names (a sharded FSDP or DeepSpeed state) gets none, with a warning."""

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        super().save_model(output_dir, _internal_call)
        folder = Path(output_dir or self.args.output_dir)
        if not self.args.should_save:
            return
        if _weights_files(folder):
            write_weights_checksum(folder)
        else:  # e.g. a sharded FSDP or DeepSpeed state, which its own engine reads
            logger.warning(f"{folder}: no weights file of {', '.join(WEIGHTS_NAMES)}, so no {CHECKSUM_NAME}.")


class _LogAtEverySave(transformers.TrainerCallback):
    """Log the training loss at every step that saves a checkpoint, so that its log history covers all its steps."""

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        control.should_log = control.should_log or control.should_save
        return control

    on_epoch_end = on_step_end


class ExactResumeMixin(WeightsChecksumMixin):
    """Trainer mixin: a resumed run draws the same random numbers as an uninterrupted one, with persistent
    DataLoader workers too, reports the mean loss over all its steps, and never resumes a run that has finished.

    Each new DataLoader iterator draws its workers' base seed from the loader's generator, torch's global one when
    the loader has none. A loader with persistent workers makes one iterator for the whole run; a resumed run makes
    a new one at its first epoch boundary (its partial first epoch has a loader of its own), so from there on the
    global generator, which RandAugment and dropout draw from, would be one number ahead of the uninterrupted run's.
    A generator of the loader's own leaves the global one alone. What workers draw themselves is not replayed: keep
    random transforms in the main process (as the digits script's batch augmentation is).

    ``Trainer.train`` averages ``train_loss`` over the steps after the checkpoint only; here it is the mean over the
    whole run (``whole_run_train_loss``). Every save also logs, and writes the weights' checksum, which ``train``
    checks before it resumes (``verify_weights_checksum``); a checkpoint at the end of the run is refused
    (``check_not_finished``).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.add_callback(_LogAtEverySave())

    def get_train_dataloader(self) -> Any:
        dataloader = super().get_train_dataloader()
        loader = getattr(
            dataloader, "base_dataloader", dataloader
        )  # accelerate's DataLoaderShard wraps a DataLoader
        loader.generator = torch.Generator().manual_seed(self.args.seed)
        return dataloader

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any) -> Any:
        """``Trainer.train``, refusing a damaged or finished checkpoint, with ``train_loss`` over the whole run."""
        checkpoint = resume_from_checkpoint
        if checkpoint is True:
            checkpoint = get_last_checkpoint(self.args.output_dir) or True
        if not isinstance(checkpoint, str | os.PathLike):
            return super().train(checkpoint or None, *args, **kwargs)
        verify_weights_checksum(checkpoint, "--resume_from_checkpoint")
        check_not_finished(checkpoint, self.args)
        state = _trainer_state(checkpoint)  # read now: the run's save_total_limit may delete the checkpoint
        output = super().train(checkpoint, *args, **kwargs)
        train_loss = whole_run_train_loss(state, output.training_loss, output.global_step)
        output.metrics["train_loss"] = train_loss
        if self.state.log_history and "train_loss" in self.state.log_history[-1]:
            self.state.log_history[-1]["train_loss"] = train_loss
        return TrainOutput(output.global_step, train_loss, output.metrics)
