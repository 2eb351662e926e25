#!/usr/bin/env python
"""How many aten operations one training step dispatches: forward, backward and the RAdam step, per preset.

    PYTHONPATH=src python benchmarks/op_count.py [--preset fuzzy_boolean|digits] [--batch-size 128] [--device cpu]
        [--augmentation] [--threads N]

A small step on a GPU costs about a fixed overhead per operation (Python, dispatch, kernel launch) rather than
arithmetic: on one H200 the fuzzy-Boolean pre-training ran 23.4 steps/s eager (benchmarks/RESULTS.md, 2026-11-27).
Dividing a step's time by its operation count gives that overhead per operation, and says what CUDA graphs (one
launch per captured graph) could save. Counted with a TorchDispatchMode after two warm-up steps, for "sdpa" and
"eager" attention, on the device given (the "sdpa" path differs by device: explicit matmuls on CPU, SDPA on
CUDA). Views and other metadata-only operations are counted too: they cost dispatch time but launch no kernel.
--augmentation also counts examples/run_digits.py's RandAugment of one batch (n=2, m=9, p=0.5, drawn per image), the
work its training step adds on the device unless the DataLoader workers do it, and times it on the device.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ni_hf import (
    NeuralInterpreterConfig,
    NeuralInterpreterForImageClassification,
    NeuralInterpreterForSetRegression,
)
from ni_hf.augmentation import BatchRandAugment


class OperationCounter(TorchDispatchMode):
    """Counts the aten operations dispatched inside it, by operator name."""

    def __init__(self) -> None:
        super().__init__()
        self.operations: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # torch's signature
        self.operations[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def build(
    preset: str, batch_size: int, device: torch.device
) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """The preset's model in training mode and one batch of random inputs with labels."""
    torch.manual_seed(0)
    if preset == "fuzzy_boolean":
        config = NeuralInterpreterConfig.from_paper(preset, task_names=[f"f{i}" for i in range(20)])
        model = NeuralInterpreterForSetRegression(config)
        inputs = {
            "inputs": torch.rand(batch_size, config.num_input_variables),
            "labels": torch.rand(batch_size, config.num_tasks),
        }
    else:
        config = NeuralInterpreterConfig.from_paper(preset)
        model = NeuralInterpreterForImageClassification(config)
        inputs = {
            "pixel_values": torch.randn(
                batch_size, config.num_channels, config.image_size, config.image_size
            ),
            "labels": torch.randint(0, config.num_labels, (batch_size,)),
        }
    return model.to(device).train(), {name: t.to(device) for name, t in inputs.items()}


def count_step(model: torch.nn.Module, inputs: dict[str, torch.Tensor], warmup: int = 2) -> dict[str, int]:
    """Operations of one training step, by phase, after `warmup` steps (RAdam's state exists by then)."""
    optimizer = torch.optim.RAdam(model.parameters(), lr=1e-3, foreach=True)
    for _ in range(warmup):
        optimizer.zero_grad()
        model(**inputs).loss.backward()
        optimizer.step()
    optimizer.zero_grad()
    counters = {phase: OperationCounter() for phase in ("forward", "backward", "optimizer_step")}
    with counters["forward"]:
        loss = model(**inputs).loss
    with counters["backward"]:
        loss.backward()
    with counters["optimizer_step"]:
        optimizer.step()
    counts = {phase: sum(counter.operations.values()) for phase, counter in counters.items()}
    counts["total"] = sum(counts.values())
    return counts


def count_augmentation(batch_size: int, device: torch.device, draws: int = 5) -> dict[str, float]:
    """Operations of run_digits.py's default RandAugment on one batch (mean over draws), and its images/s."""
    augmentation = BatchRandAugment(num_ops=2, magnitude=9.0, probability=0.5).to(device)
    images = torch.rand(batch_size, 3, 32, 32, device=device) * 2 - 1
    counts, seconds = [], []
    with torch.no_grad():
        augmentation(images)  # warm-up
        for draw in range(draws):
            torch.manual_seed(draw)
            counter = OperationCounter()
            with counter:
                augmentation(images)
            counts.append(sum(counter.operations.values()))
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            augmentation(images)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            seconds.append(time.perf_counter() - start)
    return {
        "operations_mean": statistics.fmean(counts),
        "operations_min": min(counts),
        "operations_max": max(counts),
        "images_per_s": batch_size / statistics.median(seconds),
    }


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--preset", default="fuzzy_boolean", choices=["fuzzy_boolean", "digits"], help="Paper preset."
    )
    p.add_argument("--batch-size", type=int, default=128, help="Batch size of the step (the paper's: 128).")
    p.add_argument("--device", default="cpu", help="Device of the step.")
    p.add_argument(
        "--augmentation",
        action="store_true",
        help="Also count and time run_digits.py's RandAugment of a batch.",
    )
    p.add_argument(
        "--threads", type=int, default=None, help="torch.set_num_threads (a DataLoader worker: 1)."
    )
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model, inputs = build(args.preset, args.batch_size, torch.device(args.device))
    results = {}
    for implementation in ("sdpa", "eager"):
        model.set_attn_implementation(implementation)
        results[implementation] = count_step(model, inputs)
    if args.augmentation:
        results["randaugment"] = count_augmentation(args.batch_size, torch.device(args.device))
    print(
        json.dumps({"preset": args.preset, "batch_size": args.batch_size, "device": args.device, **results})
    )
    return results


if __name__ == "__main__":
    main()
