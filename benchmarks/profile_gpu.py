#!/usr/bin/env python
"""Where a training step of the digits preset spends its GPU time: torch.profiler over a few compiled bf16 steps.

    PYTHONPATH=src python benchmarks/profile_gpu.py [--batch-size 128] [--compile-mode default] [--steps 5] [--shapes]
        [--token-alignment 8]

Prints the wall time per step, the summed kernel time per step (their ratio says how much of the step the GPU is
idle, i.e. launch- or CPU-bound), and the kernels that take the most time.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterable
from typing import Any

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from ni_hf import NeuralInterpreterConfig, NeuralInterpreterForImageClassification
from ni_hf.modeling_neural_interpreter import (
    patchify,
    set_bilinear_logits,
    set_columns_attention,
    set_fused_attention,
    set_token_alignment,
)


def device_time_and_launches(events: Iterable[Any]) -> tuple[float, int]:
    """Summed device time (us) and count of the device-side events, as the profiler's "Self CUDA time total" sums.

    An operator that launches a kernel carries that kernel's time as its own self device time too, and so does a
    user annotation (e.g. ``Optimizer.step#RAdam.step``): summed over every row, each kernel counts twice.
    """
    device_events = [e for e in events if e.device_type == DeviceType.CUDA and not e.is_user_annotation]
    return sum(e.self_device_time_total for e in device_events), sum(e.count for e in device_events)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-size", type=int, default=128, help="Images per training step.")
    p.add_argument("--compile-mode", default="default", help="torch.compile mode, or 'none' for eager.")
    p.add_argument("--steps", type=int, default=5, help="Profiled training steps (after 3 warm-up steps).")
    p.add_argument("--top", type=int, default=25, help="Rows of the kernel table.")
    p.add_argument(
        "--shapes",
        action="store_true",
        help="Then a second table of the operators grouped by input shapes (which products are slow).",
    )
    p.add_argument("--device", default="cuda", help="cuda, or cpu to check the script without a GPU.")
    p.add_argument(
        "--token-alignment",
        type=int,
        default=1,
        help="Pad the tokens of the eager attention to a multiple of this (LineOfCode.token_alignment), e.g. 8.",
    )
    p.add_argument(
        "--fused-attention",
        action="store_true",
        help="Eq. 6 through SDPA's fused kernels (LineOfCode.fused_attention; the benchmark's ni-fused model).",
    )
    p.add_argument(
        "--bilinear-logits",
        action="store_true",
        help="The logits as (h A_uh) . h (LineOfCode.bilinear_logits; the benchmark's ni-bilinear model).",
    )
    p.add_argument(
        "--columns-attention",
        action="store_true",
        help="Eq. 6 as A @ [C v, C] over the last column (LineOfCode.columns_attention; ni-columns).",
    )
    args = p.parse_args(argv)
    device = torch.device(args.device)
    on_cuda = device.type == "cuda"

    def synchronize() -> None:
        if on_cuda:
            torch.cuda.synchronize(device)

    torch.manual_seed(0)
    config = NeuralInterpreterConfig.from_paper("digits")
    model = NeuralInterpreterForImageClassification(config).to(device).train()
    set_token_alignment(model, args.token_alignment)
    set_fused_attention(model, args.fused_attention)
    set_bilinear_logits(model, args.bilinear_logits)
    set_columns_attention(model, args.columns_attention)
    runner = model if args.compile_mode == "none" else torch.compile(model, mode=args.compile_mode)
    optimizer = torch.optim.RAdam(model.parameters(), lr=1e-4)
    images = torch.rand(args.batch_size, 3, config.image_size, config.image_size, device=device) * 2 - 1
    inputs = {
        "pixel_values": patchify(images, config.patch_size),
        "task_ids": torch.randint(0, config.num_tasks, (args.batch_size,), device=device),
        "labels": torch.randint(0, config.num_labels, (args.batch_size,), device=device),
    }

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = runner(**inputs).loss
        loss.backward()
        optimizer.step()

    for _ in range(3):
        step()
    synchronize()
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if on_cuda else [ProfilerActivity.CPU]
    with profile(activities=activities, record_shapes=args.shapes) as prof:
        start = time.perf_counter()
        for _ in range(args.steps):
            step()
        synchronize()
        wall = (time.perf_counter() - start) / args.steps
    events = prof.key_averages()
    kernel_us, launches = (total / args.steps for total in device_time_and_launches(events))
    print(
        f"batch {args.batch_size}, compile {args.compile_mode}: {wall * 1e3:.1f} ms/step "
        f"({args.batch_size / wall:,.0f} img/s under the profiler); kernels {kernel_us / 1e3:.1f} ms/step "
        f"({kernel_us / 1e6 / wall:.0%} of the wall time), about {launches:,.0f} kernel launches/step"
    )
    sort_by = "self_device_time_total" if on_cuda else "self_cpu_time_total"
    print(events.table(sort_by=sort_by, row_limit=args.top, max_name_column_width=70))
    if args.shapes:
        by_shape = prof.key_averages(group_by_input_shape=True)
        print(by_shape.table(sort_by=sort_by, row_limit=args.top, max_name_column_width=40))


if __name__ == "__main__":
    main()
