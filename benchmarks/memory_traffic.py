#!/usr/bin/env python
"""Bytes a compiled training step of the digits preset moves through memory, by kind of kernel (inductor's count).

    PYTHONPATH=src python benchmarks/memory_traffic.py [--batch-size 128] [--device cpu] [--dtype bfloat16]
        [--attention eager|sdpa|columns|fused|bilinear|bilinear-columns] [--token-alignment 8] [--override KEY=VALUE] [--top 15] [--output-json FILE]

At batch 128 a step of our model on a GPU is mostly memory-bound work: fused elementwise kernels, reductions and
GEMMs on small matrices. inductor estimates, for every kernel it schedules, the bytes of the buffers the kernel reads
and writes (`GraphLowering.count_bytes`, logged under TORCH_LOGS=inductor_metrics); their sum over the forward and
backward graphs divided by a GPU's memory bandwidth is a floor on the step time that no launch-overhead saving
(CUDA graphs) can beat. The script compiles forward + backward under autocast (no optimizer step), sums those
estimates by kind of kernel (GEMMs that inductor calls out to; kernels that touch an N x N attention tensor; all
other fused elementwise and reduction kernels) and prints the floor at the HBM bandwidths of an H100 SXM and an H200
beside the per-step budget of the 15-minute goal (100 epochs x 193,257 images, benchmarks/README.md).

The fusion inductor picks differs by device (C++ loops on the CPU, Triton on a GPU), so a CPU count is an estimate
of the GPU's; it costs no GPU and shows what a change to the model does to the traffic. Each run compiles afresh
(inductor's caches off: a cached graph carries no per-kernel counts), about 2 minutes on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ni_hf import NeuralInterpreterConfig, NeuralInterpreterForImageClassification
from ni_hf.modeling_neural_interpreter import patchify, set_eager_formulation

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmark import parse_overrides  # noqa: E402  (benchmarks/ is not a package)

# HBM bandwidth in TB/s (datasheets): H100 SXM5 80 GB, H200 141 GB.
BANDWIDTHS_TB_S = {"H100 SXM": 3.35, "H200": 4.8}
EPOCHS, DIGITS_TRAINING_IMAGES, GOAL_MINUTES = 100, 193_257, 15


@dataclass
class KernelTraffic:
    """Bytes and kernel count of one kind of kernel in a compiled training step."""

    kind: str
    bytes: int = 0
    kernels: int = 0
    largest: list[tuple[int, str]] = field(default_factory=list)


# aten operations that only move data: a kernel made of these alone is a layout copy (a permute made contiguous).
LAYOUT_OPERATIONS = {
    "clone",
    "permute",
    "reshape",
    "view",
    "expand",
    "constant_pad_nd",
    "copy",
    "slice",
    "cat",
}


def kernel_kind(node: object, token_counts: set[int]) -> str:
    """The kind of an inductor scheduler node: a GEMM inductor calls out to, a layout copy, a kernel that reads or
    writes an N x N attention tensor (N in ``token_counts``: the tokens, and the padded tokens), or other work."""
    if type(node).__name__ == "ExternKernelSchedulerNode":
        # SDPA's fused kernels (`--attention fused` on a GPU) are extern calls too; their N x N tiles stay on chip
        return "fused attention (extern)" if "attention" in kernel_label(node) else "GEMM (extern)"
    if set(kernel_label(node).split(" -> ")[0].split(",")) <= LAYOUT_OPERATIONS:
        return "layout copy"
    for dep in list(node.read_writes.reads) + list(node.read_writes.writes):
        dims = [int(d) for d in getattr(dep, "size", None) or () if str(d).isdigit()]
        numel = math.prod(dims) if dims else 0
        # a flattened N x N tensor: B x U x H x N x N elements (at least N^3 of them)
        flat_square = any(numel % (n * n) == 0 and numel >= n**3 for n in token_counts)
        if (len(dims) >= 2 and dims[-1] in token_counts and dims[-2] in token_counts) or (
            len(dims) == 1 and flat_square
        ):
            return "attention N x N"
    return "elementwise / reduction"


def kernel_label(node: object) -> str:
    """The aten operations a scheduler node fuses (or the extern kernel's name), for the table of the largest."""
    if type(node).__name__ == "ExternKernelSchedulerNode":
        name = str(getattr(node.node, "python_kernel_name", None) or type(node.node).__name__)
        shapes = [
            tuple(int(d) for d in x.get_size())
            for x in getattr(node.node, "inputs", ())
            if hasattr(x, "get_size")
        ]
        return f"{name.removeprefix('extern_kernels.')} {' x '.join(str(s) for s in shapes)}"
    origins: set[str] = set()
    for sub in node.get_nodes():
        for origin in getattr(sub.node, "origins", ()):
            origins.add(str(origin.target).replace("aten.", "").split(".")[0])
    writes = [
        tuple(int(d) for d in dep.size) for dep in node.read_writes.writes if getattr(dep, "size", None)
    ]
    return f"{','.join(sorted(origins))} -> {' '.join(str(w) for w in writes)}"


def count_training_step(
    config: NeuralInterpreterConfig,
    batch_size: int,
    device: torch.device,
    dtype: torch.dtype,
    attention: str,
    token_alignment: int,
) -> tuple[dict[str, KernelTraffic], int]:
    """Compile forward + backward of the model once and sum inductor's byte estimates by kernel kind."""
    from torch._inductor import config as inductor_config
    from torch._inductor import metrics

    metrics_logger = logging.getLogger("torch._inductor.compile_fx.__inductor_metrics")
    logger_state = metrics_logger.level, metrics_logger.propagate
    quiet = logging.NullHandler()

    torch.manual_seed(0)
    model = NeuralInterpreterForImageClassification(config).to(device).train()
    model.set_attn_implementation("eager" if attention != "sdpa" else attention)
    set_eager_formulation(model, "literal" if attention in ("eager", "sdpa") else attention, token_alignment)
    images = torch.rand(batch_size, 3, config.image_size, config.image_size, device=device) * 2 - 1
    inputs = {
        "pixel_values": patchify(images, config.patch_size),
        "task_ids": torch.randint(0, config.num_tasks, (batch_size,), device=device),
        "labels": torch.randint(0, config.num_labels, (batch_size,), device=device),
    }
    metrics.reset()
    metrics_logger.setLevel(logging.INFO)  # count_bytes runs only when this logger is on
    metrics_logger.propagate = False
    metrics_logger.addHandler(quiet)
    try:
        # no cached graph: one restored from a cache carries no per-kernel counts
        with inductor_config.patch(force_disable_caches=True):
            runner = torch.compile(model, dynamic=False)  # static sizes: the counts need concrete shapes
            with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
                loss = runner(**inputs).loss
            loss.backward()
    finally:
        metrics_logger.setLevel(logger_state[0])
        metrics_logger.propagate = logger_state[1]
        metrics_logger.removeHandler(quiet)
    if not metrics.nodes_num_elem:
        raise RuntimeError(
            "inductor reported no per-kernel counts (is TORCH_LOGS overriding inductor_metrics?)"
        )
    tokens = config.num_task_tokens + config.num_patches
    # the padded counts: of the aligned tokens, and of the keys of the fused formulation (8)
    token_counts = {tokens, -(-tokens // token_alignment) * token_alignment}
    if attention == "fused":
        token_counts.add(-(-tokens // 8) * 8)
    kinds: dict[str, KernelTraffic] = {}
    for node, elements in metrics.nodes_num_elem:
        kind = kernel_kind(node, token_counts)
        traffic = kinds.setdefault(kind, KernelTraffic(kind))
        traffic.bytes += elements * 4  # count_bytes reports bytes // 4
        traffic.kernels += 1
        traffic.largest.append((elements * 4, kernel_label(node)))
    for traffic in kinds.values():
        traffic.largest.sort(reverse=True)
    return kinds, metrics.generated_kernel_count


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-size", type=int, default=128, help="Images per training step.")
    p.add_argument(
        "--device", default="cpu", help="Device to compile for (cpu needs no GPU; cuda: its own fusion)."
    )
    p.add_argument(
        "--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"], help="Autocast dtype."
    )
    p.add_argument(
        "--attention",
        default="eager",
        choices=["eager", "sdpa", "columns", "fused", "bilinear", "bilinear-columns"],
        help="Attention path; 'eager' is what a compiled model runs on a GPU (the sdpa path on the CPU differs); "
        "'columns': the eager model with `LineOfCode.columns_attention` (Eq. 6 as A @ [C v, C] over the last "
        "column, no N x N modulated weights); 'fused': "
        "the eager model with `LineOfCode.fused_attention` (SDPA's fused kernels; only a GPU count means much); "
        "'bilinear': the eager model with `LineOfCode.bilinear_logits` (q.k as (h A) . h); 'bilinear-columns': "
        "both switches on.",
    )
    p.add_argument("--token-alignment", type=int, default=1, help="LineOfCode.token_alignment (e.g. 8).")
    p.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Override a field of the digits preset (repeatable), e.g. num_function_iterations=1.",
    )
    p.add_argument("--top", type=int, default=10, help="Largest kernels listed per kind.")
    p.add_argument("--output-json", default=None, help="Write the counts here too.")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    config = NeuralInterpreterConfig.from_paper("digits", **parse_overrides(args.override))
    kinds, generated = count_training_step(
        config, args.batch_size, device, getattr(torch, args.dtype), args.attention, args.token_alignment
    )
    total = sum(t.bytes for t in kinds.values())
    steps_per_goal = EPOCHS * DIGITS_TRAINING_IMAGES / args.batch_size
    budget_ms = GOAL_MINUTES * 60 / steps_per_goal * 1e3
    print(
        f"digits preset{' with ' + ', '.join(args.override) if args.override else ''}, batch {args.batch_size}, {args.dtype} autocast, {args.attention} attention, token alignment "
        f"{args.token_alignment}, compiled for {device.type}: forward + backward move {total / 1e9:.2f} GB "
        f"in {sum(t.kernels for t in kinds.values())} kernels ({generated} generated by inductor)"
    )
    for traffic in sorted(kinds.values(), key=lambda t: -t.bytes):
        print(f"  {traffic.kind:<24} {traffic.bytes / 1e9:7.2f} GB  {traffic.kernels:5d} kernels")
    floors = {name: total / (bandwidth * 1e12) * 1e3 for name, bandwidth in BANDWIDTHS_TB_S.items()}
    for name, floor in floors.items():
        print(
            f"  at {name} peak bandwidth ({BANDWIDTHS_TB_S[name]} TB/s): {floor:.2f} ms/step, "
            f"{floor * steps_per_goal / 6e4:.1f} min for {EPOCHS} epochs"
        )
    print(
        f"  the {GOAL_MINUTES}-minute goal's budget: {budget_ms:.2f} ms/step (memory traffic and GEMMs together)"
    )
    for traffic in sorted(kinds.values(), key=lambda t: -t.bytes):
        print(f"largest {traffic.kind} kernels:")
        for size, label in traffic.largest[: args.top]:
            print(f"  {size / 1e6:8.1f} MB  {label[:150]}")
    result = {
        "batch_size": args.batch_size,
        "device": device.type,
        "dtype": args.dtype,
        "attention": args.attention,
        "token_alignment": args.token_alignment,
        "overrides": args.override,
        "torch": torch.__version__,
        "total_bytes": total,
        "generated_kernels": generated,
        "kinds": {t.kind: {k: v for k, v in asdict(t).items() if k != "largest"} for t in kinds.values()},
        "floor_ms": floors,
        "goal_budget_ms": budget_ms,
    }
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()
