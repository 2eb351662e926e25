"""CPU time, system time and minor page faults of one training step: our digits preset against the ViT baseline.

Both models train in one process, taking turns (batch 128 by default, one thread, RAdam), and each step is measured
with getrusage, so the numbers hold on a shared machine where wall time does not. With `--keep-freed-memory`,
glibc is first told to keep freed memory (`ni_hf.cpu_allocator`).

    PYTHONPATH=src python benchmarks/page_faults.py [--keep-freed-memory] [--batch-size 128] [--steps 3]
"""

from __future__ import annotations

import argparse
import resource
import statistics

import torch
from transformers import ViTForImageClassification

from ni_hf import NeuralInterpreterConfig, NeuralInterpreterForImageClassification, vit_baseline_config
from ni_hf.cpu_allocator import keep_freed_memory
from ni_hf.modeling_neural_interpreter import patchify


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument(
        "--steps", type=int, default=3, help="Measured steps per model (after one warm-up step)."
    )
    parser.add_argument("--keep-freed-memory", action="store_true", help="Call keep_freed_memory() first.")
    args = parser.parse_args()
    if args.keep_freed_memory:
        print(f"keep_freed_memory() took effect: {keep_freed_memory()}")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    b = args.batch_size
    models = {
        "ni-sdpa": NeuralInterpreterForImageClassification(
            NeuralInterpreterConfig.from_paper("digits")
        ).train(),
        "vit": ViTForImageClassification(vit_baseline_config()).train(),
    }
    optimizers = {
        key: torch.optim.RAdam([p for p in m.parameters() if p.requires_grad], lr=1e-4)
        for key, m in models.items()
    }
    images = torch.rand(b, 3, 32, 32) * 2 - 1
    inputs = {
        "ni-sdpa": {"pixel_values": patchify(images, 4), "task_ids": torch.randint(0, 3, (b,))},
        "vit": {"pixel_values": images},
    }
    labels = torch.randint(0, 10, (b,))

    def step(key: str) -> tuple[float, float, int]:
        before = resource.getrusage(resource.RUSAGE_SELF)
        optimizers[key].zero_grad(set_to_none=True)
        models[key](**inputs[key], labels=labels).loss.backward()
        optimizers[key].step()
        after = resource.getrusage(resource.RUSAGE_SELF)
        system = after.ru_stime - before.ru_stime
        return after.ru_utime - before.ru_utime + system, system, after.ru_minflt - before.ru_minflt

    for key in models:
        step(key)
    measured: dict[str, list[tuple[float, float, int]]] = {key: [] for key in models}
    for i in range(args.steps):
        for key in models if i % 2 == 0 else reversed(list(models)):
            measured[key].append(step(key))
    for key, rows in measured.items():
        cpu, system, faults = (statistics.median(column) for column in zip(*rows, strict=True))
        print(
            f"{key}: {cpu:.2f} s CPU per step ({b / cpu:.1f} img/s of CPU time), system {system:.2f} s "
            f"({100 * system / cpu:.0f}%), {faults:,.0f} minor page faults ({faults * 4 / 1024:,.0f} MiB)"
        )


if __name__ == "__main__":
    main()
