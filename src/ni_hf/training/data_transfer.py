"""How the example scripts feed a GPU: pinned batches copied asynchronously (so no step waits for the one before),
DataLoader workers by default, and static shapes under torch.compile (the last three functions say why).

transformers' Trainer copies each batch to the device through accelerate with ``non_blocking=False``
(``AcceleratorConfig.non_blocking``'s default). PyTorch carries out such a host-to-device copy and then
synchronizes the stream, so the host waits at every step for the GPU to finish all the work queued before it (the
previous step's forward, backward and optimizer step): the Trainer's own per-step host work (data loading, the
loop, callbacks, the optimizer's launches) then adds to the GPU's time instead of overlapping it. A step that is
short on the GPU (a compiled, CUDA-graphed step of a small model) pays that in full. From pinned memory with
``non_blocking=True`` the copy is queued on the stream like a kernel and the host goes on.
"""

from __future__ import annotations

import os
from typing import Any

import torch

DATALOADER_WORKERS_HELP = (
    "DataLoader worker processes per training process; they decode and resize the images beside the training "
    "step. Default: where CUDA is available, one per core of "
    "this process's share of the machine (cores / LOCAL_WORLD_SIZE) but one, at most 8; on the CPU 0 (workers "
    "would take cores from the training step's threads)."
)

PIN_MEMORY_HELP = (
    "Pin batches in memory (default: where CUDA is available; then they are also copied to the GPU asynchronously, "
    "see --accelerator_config; transformers' default, true, only draws a warning on a machine without a GPU)."
)

STATIC_BATCHES_NOTE = (
    "torch.compile for static shapes (ACCELERATE_DYNAMO_USE_DYNAMIC=false): an epoch's last, smaller batch gets a "
    "graph of its own, and the full batches keep theirs."
)


def _cuda_available() -> bool:
    return torch.cuda.is_available()


def default_non_blocking_copies(args: Any, cuda_available: bool | None = None) -> bool:
    """Set ``args.accelerator_config = {"non_blocking": True}`` for pinned batches on a GPU; return whether it did.

    Call it at the top of a ``TrainingArguments`` subclass's ``__post_init__`` (before transformers turns
    ``accelerator_config`` into an ``AcceleratorConfig``). It does nothing when the user passed an
    ``accelerator_config`` of their own, when batches are not pinned (``dataloader_pin_memory``), on the CPU
    (``use_cpu``, or no CUDA device), so a CPU run gets no warning about non-blocking copies without pinning.
    """
    if cuda_available is None:
        cuda_available = _cuda_available()
    if (
        getattr(args, "accelerator_config", None) is not None
        or not getattr(args, "dataloader_pin_memory", False)
        or getattr(args, "use_cpu", False)
        or not cuda_available
    ):
        return False
    args.accelerator_config = {"non_blocking": True}
    return True


def batch_transfer_note(args: Any) -> str | None:
    """One log line on how the Trainer's batches reach a CUDA device (None on any other device)."""
    if args.device.type != "cuda":
        return None
    non_blocking = bool(getattr(args.accelerator_config, "non_blocking", False))
    if non_blocking and args.dataloader_pin_memory:
        return "Batches reach the GPU from pinned memory by asynchronous copies: no step waits for the one before."
    memory = "pinned" if args.dataloader_pin_memory else "pageable"
    return (
        f"Batches reach the GPU by blocking copies ({memory} memory, non_blocking={non_blocking}): every step "
        "waits for the GPU to finish the one before."
    )


def default_dataloader_workers(
    use_cpu: bool,
    cuda_available: bool | None = None,
    cores: int | None = None,
    local_world_size: int | None = None,
    most: int = 8,
) -> int:
    """DataLoader worker processes per training process when the user names none: on a GPU, one per core this
    process may count on (the node's cores over ``LOCAL_WORLD_SIZE``) but one, at most ``most``; on the CPU, none.

    With workers, decoding, resizing and the batch augmentation run beside the GPU's step instead of before it. A
    process with fewer than two cores of its own gets none (a worker would take the core its loop needs), and so
    does a CPU run, whose workers would take cores from the training step's own threads.
    """
    if cuda_available is None:
        cuda_available = _cuda_available()
    if use_cpu or not cuda_available:
        return 0
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if local_world_size is None:
        local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    per_process = cores // max(local_world_size, 1)
    return min(most, per_process - 1) if per_process >= 2 else 0  # one core stays with the training loop


def apply_gpu_loading_defaults(args: Any) -> None:
    """The example scripts' defaults for feeding a GPU: non-blocking copies of pinned batches
    (:func:`default_non_blocking_copies`), and, where ``dataloader_num_workers`` is left at None, the workers of
    :func:`default_dataloader_workers`. Call it first in a ``TrainingArguments`` subclass's ``__post_init__``."""
    default_non_blocking_copies(args)
    if getattr(args, "dataloader_num_workers", 0) is None:
        args.dataloader_num_workers = default_dataloader_workers(args.use_cpu)


def compile_for_static_batches(args: Any) -> bool:
    """Under ``--torch_compile``, have the Trainer compile for static shapes; return whether this set it.

    An epoch whose size is no multiple of the batch ends in a smaller batch. With dynamo's default (automatic dynamic
    shapes) that batch makes it compile the model again with a dynamic batch dimension, and every later step, full
    batches included, runs the dynamic graph. ``dynamic=False`` compiles the last batch's size as a second static
    graph and keeps the full batches on the first. The Trainer takes ``dynamic`` from accelerate's
    ``ACCELERATE_DYNAMO_USE_DYNAMIC``; a value the user set stands.
    """
    if not getattr(args, "torch_compile", False) or "ACCELERATE_DYNAMO_USE_DYNAMIC" in os.environ:
        return False
    os.environ["ACCELERATE_DYNAMO_USE_DYNAMIC"] = "false"
    return True
