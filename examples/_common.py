"""What the digits example scripts share: the dataset transform, --config_overrides, checkpoints, the run lock,
--max_train_minutes."""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import os
import re
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import torch
from transformers import PretrainedConfig, TrainerCallback

from ni_hf import NeuralInterpreterImageProcessor

logger = logging.getLogger(__name__)

LOCK_NAME = "_run.lock"  # "_*" files stay local when the folder is pushed (ni_hf.training.publishing)


@dataclass
class DigitsTransform:
    """Dataset transform: PIL images -> normalized (3, 32, 32) float arrays, labels and the model's task ids.

    The task id is ``task_id`` for every sample if given, else the row's ``task_id`` mapped through
    ``model_task_ids`` (a saved model evaluated on some of its tasks, or in another order). A class at module
    level, not a closure, so that DataLoader workers started by spawn or forkserver can unpickle it.
    """

    processor: NeuralInterpreterImageProcessor
    model_task_ids: list[int] | None = None
    task_id: int | None = None

    def __call__(self, batch: dict[str, list[Any]]) -> dict[str, Any]:
        pixel_values = self.processor(images=batch["image"], do_patchify=False)["pixel_values"]
        if self.task_id is not None:
            task_ids = [self.task_id] * len(batch["label"])
        else:
            task_ids = [int(task_id) for task_id in batch["task_id"]]
            if self.model_task_ids is not None:
                task_ids = [self.model_task_ids[task_id] for task_id in task_ids]
        return {
            "pixel_values": [np.asarray(image, dtype=np.float32) for image in pixel_values],
            "labels": [int(label) for label in batch["label"]],
            "task_ids": task_ids,
        }


# ------------------------------------------------------------------------------------------ config overrides


def config_argument_names(config_class: type[PretrainedConfig]) -> set[str]:
    """The names of a config's own arguments, not those every PretrainedConfig has."""
    common = {f.name for f in dataclasses.fields(PretrainedConfig)}
    return {
        name
        for name, parameter in inspect.signature(config_class.__init__).parameters.items()
        if name != "self" and parameter.kind is not inspect.Parameter.VAR_KEYWORD and name not in common
    }


def _parse_override_value(text: str) -> Any:
    """One override value: JSON (numbers, true/false, null, lists), Python's True/False/None, else a string."""
    text = text.strip()
    python_literals = {"True": True, "False": False, "None": None}
    if text in python_literals:
        return python_literals[text]
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_config_overrides(
    overrides: str | None,
    config_class: type[PretrainedConfig],
    reserved: Iterable[str] = (),
    option: str = "--config_overrides",
) -> dict[str, Any]:
    """Turn ``"key=value,key2=[1,2]"`` into a dict; every key must be an argument of ``config_class``, none reserved."""
    if not overrides or not overrides.strip():
        return {}
    valid = config_argument_names(config_class)
    reserved = set(reserved)
    result: dict[str, Any] = {}
    for item in re.split(r",(?=\s*[A-Za-z_]\w*\s*=)", overrides.strip()):
        if "=" not in item:
            raise ValueError(f"{option}: expected key=value, got {item!r} in {overrides!r}.")
        key, value = (part.strip() for part in item.split("=", 1))
        if "," in value and not value.startswith(("[", "{", '"')):
            # The split above keeps a bare name after a comma glued to the previous value.
            first, *rest = (part.strip() for part in value.split(","))
            raise ValueError(
                f"{option}: expected key=value items, got {rest[-1]!r} without a value (after {key}={first}); "
                "a value that holds commas must be a JSON list, e.g. num_function_iterations=[2,1]."
            )
        if key in reserved:
            raise ValueError(f"{option}: {key} is set by the script from its data and cannot be overridden.")
        if key not in valid:
            raise ValueError(
                f"{option}: unknown setting {key!r}; {config_class.__name__} accepts {sorted(valid)}."
            )
        result[key] = _parse_override_value(value)
    return result


# ------------------------------------------------------------------------------------------------ checkpoints


def check_weights_readable(path: str) -> None:
    """A local model folder's ``model.safetensors`` must open; else an error naming the file (not a raw traceback)."""
    weights = Path(path) / "model.safetensors"
    if not weights.is_file():
        return
    from safetensors import safe_open

    try:
        with safe_open(str(weights), framework="pt") as handle:
            handle.keys()
    except Exception as error:  # noqa: BLE001 - safetensors raises its own, unexported error types
        raise ValueError(
            f"{weights} is not a readable safetensors file ({type(error).__name__}: {error}); the checkpoint is "
            "damaged or was not written completely: save or download it again."
        ) from error


def last_complete_checkpoint(output_dir: str) -> str:
    """The newest ``checkpoint-<step>`` in ``output_dir`` that holds ``trainer_state.json`` (a finished save).

    A process killed while saving leaves a folder with weights but no trainer state; it is skipped, with a warning.
    """
    folders = sorted(
        (p for p in Path(output_dir).glob("checkpoint-*") if p.is_dir() and p.name.split("-")[-1].isdigit()),
        key=lambda p: int(p.name.split("-")[-1]),
        reverse=True,
    )
    for folder in folders:
        if (folder / "trainer_state.json").is_file():
            return str(folder)
        logger.warning(f"Skipping {folder}: no trainer_state.json, its save did not finish.")
    raise ValueError(
        f"--resume_from_checkpoint last: no complete checkpoint (a checkpoint-* folder with trainer_state.json) "
        f"in {output_dir}."
    )


# ----------------------------------------------------------------------------------------------- the run lock


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


# ------------------------------------------------------------------------------------------ training time limit


class TrainingTimeLimit(TrainerCallback):
    """Stop training once ``max_minutes`` of wall-clock time have passed since it began (checked after every
    optimizer step), with a warning that says at which step and epoch.

    A guard for a run that must end in time (a job on a lent GPU), not a schedule: the learning-rate schedule is
    planned for the run's epochs or steps, and a run stopped early ends before the schedule does. Choose the epochs
    so that the run should finish within the time, and let this only catch a slower machine. The clock starts when
    training begins (after data loading; compilation, which happens in the first steps, counts), and anew in a
    resumed run. The run then saves and evaluates as after a finished one.
    """

    def __init__(self, max_minutes: float) -> None:
        if not max_minutes > 0:  # also refuses NaN
            raise ValueError(f"--max_train_minutes {max_minutes}: must be a positive number of minutes.")
        self.max_minutes = max_minutes
        self.start: float | None = None
        self.stopped_at_step: int | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.start = time.monotonic()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.start is None or control.should_training_stop:
            return
        minutes = (time.monotonic() - self.start) / 60
        if minutes < self.max_minutes or state.global_step >= state.max_steps:
            return
        control.should_training_stop = True
        self.stopped_at_step = state.global_step
        epochs = args.num_train_epochs if args.max_steps <= 0 else state.num_train_epochs
        logger.warning(
            f"--max_train_minutes {self.max_minutes:g}: stopped training early after {minutes:.2f} minutes, at step "
            f"{state.global_step} of {state.max_steps} (epoch {state.epoch or 0:.2f} of {epochs:g}); the "
            "learning-rate schedule did not reach its end."
        )


def time_limit_callbacks(max_minutes: float | None) -> list[TrainerCallback]:
    """``[TrainingTimeLimit(max_minutes)]``, or no callback when ``max_minutes`` is None."""
    return [] if max_minutes is None else [TrainingTimeLimit(max_minutes)]


def add_routing_to_card(
    model: torch.nn.Module, test: datasets.Dataset, card: Path, num_images: int = 64
) -> None:
    """Append the computational path of a test image and the function usage of a test batch to the model card."""
    try:
        from ni_hf.visualization import write_routing_card_assets
    except ImportError as error:  # matplotlib is the `vis` extra
        logger.warning(f"No routing picture on the model card ({error}); pip install 'ni_hf[vis]' for it")
        return
    batch = test.shuffle(seed=0).select(range(min(num_images, len(test))))[:]
    assets = write_routing_card_assets(
        model,
        torch.as_tensor(np.stack(batch["pixel_values"])).to(model.device),
        torch.as_tensor(batch["task_ids"]),
        card.parent,
        labels=batch["labels"],
    )
    with card.open("a") as f:
        f.write("\n" + assets["markdown"].rstrip() + "\n")
    logger.info(
        f"Routing picture and function usage added to the model card: {', '.join(map(str, assets['files']))}"
    )
