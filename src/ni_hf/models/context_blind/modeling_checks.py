# Copied from ni_hf.models.neural_interpreter.modeling_checks: edit the original, not this copy
"""Checks of the models' inputs and outputs: errors that name the input and what was expected.

Every model folder holds a copy of this file (marked "Copied from", checked by tests/test_model_copies.py), which its
checkpoints copy next to the modeling file, so their code runs without `ni_hf`.
"""

from __future__ import annotations

import numbers
from typing import Any

import torch
from torch import nn
from transformers.utils import logging

logger = logging.get_logger(__name__)


def check_not_empty(batch_size: int) -> None:
    if batch_size == 0:
        raise ValueError("Got an empty batch (0 samples); pass at least one image or set.")


def check_tensor(name: str, values: Any, expected: str) -> None:
    """Refuse anything but a floating-point tensor: a cast would run raw uint8 pixels as garbage."""
    if not isinstance(values, torch.Tensor):
        raise ValueError(
            f"`{name}` must be a torch.Tensor ({expected}), got {type(values).__name__}; convert it with "
            "torch.as_tensor, or pass images through the image processor with return_tensors='pt'."
        )
    if not values.is_floating_point():
        raise ValueError(f"`{name}` must be a floating-point tensor ({expected}), got dtype {values.dtype}.")


def check_forward(
    module: nn.Module,
    inputs: dict[str, torch.Tensor | None],
    outputs: dict[str, torch.Tensor],
    routing_peak: torch.Tensor | None = None,
) -> None:
    """Raise, naming the tensor, on NaN or inf in an input or output; warn once when no function accepts any token.

    One host sync for all of it; skipped while compiling or tracing.
    """
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return
    checked = {
        name: t
        for name, t in {**inputs, **outputs}.items()
        if isinstance(t, torch.Tensor) and t.is_floating_point()
    }
    device = next(iter(outputs.values())).device
    if device.type == "meta":  # shapes only (e.g. under accelerate's init_empty_weights): no values to check
        return
    flags = [torch.isfinite(t).all().to(device) for t in checked.values()]
    if routing_peak is not None:
        flags.append(routing_peak.to(device) > 0)
    if bool(torch.stack(flags).all()):
        return
    if routing_peak is not None and not bool(routing_peak > 0):
        logger.warning_once(
            "No function accepted any token in this forward pass (every compatibility C is 0): the model's output "
            "ignores its input. truncation_tau or sigma is too small for these types; raise them, or check that "
            "no function is disabled by mistake."
        )
    for name in inputs:
        if name in checked and not bool(torch.isfinite(checked[name]).all()):
            raise ValueError(f"`{name}` contains NaN or infinite values: expected finite numbers.")
    broken_outputs = [n for n in outputs if not bool(torch.isfinite(checked[n]).all())]
    if not broken_outputs:
        return
    broken = [n for n, p in module.named_parameters() if not bool(torch.isfinite(p).all())]
    if broken:
        cause = (
            f"the parameters {broken[:3]}{' ...' if len(broken) > 3 else ''} are already NaN or inf (a diverged "
            "training run: lower the learning rate, or reload a checkpoint)"
        )
    else:
        magnitudes = [float(t.abs().max()) for n, t in checked.items() if n in inputs and t.numel()]
        largest = f" (largest magnitude {max(magnitudes):.3g})" if magnitudes else ""
        cause = (
            f"the inputs{largest} overflow {next(module.parameters()).dtype} inside the network: normalize them "
            "(NeuralInterpreterImageProcessor does) or use a wider dtype"
        )
    raise FloatingPointError(
        f"The forward pass produced NaN or infinite values in `{broken_outputs[0]}`: {cause}."
    )


def index_list(values: Any, name: str) -> list[int]:
    """Integers from a list, tuple, array or tensor of them; a ValueError naming `name` for anything else."""
    if isinstance(values, torch.Tensor) or hasattr(values, "tolist"):
        values = values.tolist()
    if isinstance(values, int) and not isinstance(values, bool):
        return [values]
    if not isinstance(values, (list, tuple)) or any(
        not isinstance(v, numbers.Integral) or isinstance(v, bool) for v in values
    ):
        raise ValueError(
            f"`{name}` must be integers (a list, tuple, array or tensor of them), got {values!r}."
        )
    return [int(v) for v in values]


def resolve_task_ids(task_ids: Any, config: Any, batch_size: int, device: torch.device) -> torch.Tensor:
    """(B,) long task ids; `config.default_task` when not given (e.g. under `pipeline`)."""
    if task_ids is None:
        return torch.full((batch_size,), config.default_task, dtype=torch.long, device=device)
    task_ids = torch.as_tensor(task_ids, device=device)
    if task_ids.is_floating_point() or task_ids.is_complex() or task_ids.dtype == torch.bool:
        raise ValueError(f"`task_ids` must be integer task indices, got {task_ids.dtype} values.")
    if task_ids.dim() > 1 or (task_ids.dim() == 1 and task_ids.shape[0] not in (1, batch_size)):
        raise ValueError(
            f"`task_ids` must be one task index, or a 1-D tensor with one per sample ({batch_size}), got shape "
            f"{tuple(task_ids.shape)}."
        )
    task_ids = task_ids.long().reshape(-1).expand(batch_size)
    # One host sync in eager execution; none when compiling (a data-dependent branch would break the graph).
    if (
        not task_ids.is_meta
        and not torch.compiler.is_compiling()
        and bool(((task_ids < 0) | (task_ids >= config.num_tasks)).any())
    ):
        raise ValueError(
            f"`task_ids` must lie in 0..{config.num_tasks - 1} (tasks {config.task_names}), got {task_ids.tolist()}."
        )
    return task_ids
