#!/usr/bin/env python
"""Where a training step of the digits preset spends its GPU time: torch.profiler over a few compiled bf16 steps.

    PYTHONPATH=src python benchmarks/profile_gpu.py [--batch-size 128] [--compile-mode default] [--steps 5]

Prints the wall time per step, the summed kernel time per step (their ratio says how much of the step the GPU is
idle, i.e. launch- or CPU-bound), and the kernels that take the most time.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from ni_hf import NeuralInterpreterConfig, NeuralInterpreterForImageClassification
from ni_hf.modeling_neural_interpreter import patchify


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-size", type=int, default=128, help="Images per training step.")
    p.add_argument("--compile-mode", default="default", help="torch.compile mode, or 'none' for eager.")
    p.add_argument("--steps", type=int, default=5, help="Profiled training steps (after 3 warm-up steps).")
    p.add_argument("--top", type=int, default=25, help="Rows of the kernel table.")
    args = p.parse_args()

    torch.manual_seed(0)
    config = NeuralInterpreterConfig.from_paper("digits")
    model = NeuralInterpreterForImageClassification(config).cuda().train()
    runner = model if args.compile_mode == "none" else torch.compile(model, mode=args.compile_mode)
    optimizer = torch.optim.RAdam(model.parameters(), lr=1e-4)
    images = torch.rand(args.batch_size, 3, config.image_size, config.image_size, device="cuda") * 2 - 1
    inputs = {
        "pixel_values": patchify(images, config.patch_size),
        "task_ids": torch.randint(0, config.num_tasks, (args.batch_size,), device="cuda"),
        "labels": torch.randint(0, config.num_labels, (args.batch_size,), device="cuda"),
    }

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = runner(**inputs).loss
        loss.backward()
        optimizer.step()

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for _ in range(args.steps):
            step()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - start) / args.steps
    events = prof.key_averages()
    kernel_us = sum(e.self_device_time_total for e in events) / args.steps
    launches = sum(e.count for e in events if e.self_device_time_total > 0) / args.steps
    print(
        f"batch {args.batch_size}, compile {args.compile_mode}: {wall * 1e3:.1f} ms/step "
        f"({args.batch_size / wall:,.0f} img/s under the profiler); kernels {kernel_us / 1e3:.1f} ms/step "
        f"({kernel_us / 1e6 / wall:.0%} of the wall time), about {launches:,.0f} kernel launches/step"
    )
    print(events.table(sort_by="self_device_time_total", row_limit=args.top, max_name_column_width=70))


if __name__ == "__main__":
    main()
