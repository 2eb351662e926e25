#!/usr/bin/env python
"""Cost benchmark of Neural Interpreters against the paper's ViT baseline (see benchmarks/README.md).

Measures, for each model (our Neural Interpreter with SDPA and with eager attention, and transformers'
``ViTForImageClassification`` with ``ni_hf.vit_baseline_config()``):

- parameters (total, trainable);
- forward FLOPs per image, counted with ``torch.utils.flop_counter.FlopCounterMode`` on the eager
  attention path (SDPA kernels hide their FLOPs from the counter), and the counted forward + backward FLOPs;
- inference and training throughput (images/s; training = forward + backward + RAdam step) with plain
  PyTorch timing: warm-up, then repeats in which the models take turns, so machine noise hits all alike;
  median, min/max and interquartile range over the repeats;
- achieved GFLOP/s (training counted as 3x the forward FLOPs);
- peak memory: on CPU the growth of the peak RSS over the RSS after model construction, measured in a fresh
  subprocess per model and mode; on CUDA ``torch.cuda.max_memory_allocated`` over the allocation before the step;
- routing density of our model: the fraction of (function, token) pairs with C > 0 in each function iteration,
  for the freshly initialised model and optionally a trained checkpoint, on real images or random patches.

Run from the repository root, e.g. ``PYTHONPATH=src python benchmarks/benchmark.py --preset digits``.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import datetime
import gc
import json
import math
import os
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import ni_hf
from ni_hf import NeuralInterpreterConfig, NeuralInterpreterForImageClassification, vit_baseline_config
from ni_hf.cpu_allocator import keep_freed_memory
from ni_hf.cpu_bf16 import native_bf16_features
from ni_hf.evaluation import routing_density as evaluation_routing_density
from ni_hf.mkl_dispatch import mkl_code_path
from ni_hf.modeling_neural_interpreter import (
    enable_activation_checkpointing,
    patchify,
    release_workspace,
    set_bilinear_logits,
    set_columns_attention,
    set_fused_attention,
    set_token_alignment,
)

# The eager model with GPU experiments of the LOCs switched on (asked for by name only), by key.
EXPERIMENTS: dict[str, tuple[Callable[[nn.Module], None], ...]] = {
    "ni-eager-aligned": (lambda model: set_token_alignment(model, 8),),
    "ni-fused": (set_fused_attention,),
    "ni-bilinear": (set_bilinear_logits,),
    "ni-columns": (set_columns_attention,),
    "ni-bilinear-columns": (set_bilinear_logits, set_columns_attention),
    "ni-bilinear-columns-aligned": (
        set_bilinear_logits,
        set_columns_attention,
        lambda model: set_token_alignment(model, 8),
    ),
}
MODEL_KEYS: tuple[str, ...] = ("ni-sdpa", "ni-eager", "vit", *EXPERIMENTS)
"""Benchmarked models: our model with SDPA / eager attention, transformers' ViT baseline, and (asked for by name
only) eager attention with the tokens padded to a multiple of 8 (`LineOfCode.token_alignment`: aligned GEMM rows on
a GPU), the eager model with Eq. 6 through SDPA's fused kernels (`LineOfCode.fused_attention`), with its logits in
the bilinear form (`LineOfCode.bilinear_logits`), with Eq. 6 as A @ [C v, C] (`LineOfCode.columns_attention`), and
with both of the last two, on tokens as they are or padded to a multiple of 8; the FLOPs reported for those are the
unpadded eager model's (the model's work; "as run" counts what each executes)."""
DEFAULT_MODELS: tuple[str, ...] = ("ni-sdpa", "ni-eager", "vit")

MODES: tuple[str, ...] = ("inference", "training")
TRAINING_FLOPS_FACTOR = 3.0
"""Training FLOPs are counted as this many times the forward FLOPs (forward + backward ~ 2x forward)."""

MIB = 2**20


# ----------------------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------------------


def _split_models(values: Sequence[str]) -> list[str]:
    """Model keys from `--models`, given space- or comma-separated; checked against MODEL_KEYS."""
    keys = [key.strip() for value in values for key in value.split(",") if key.strip()]
    unknown = [key for key in keys if key not in MODEL_KEYS]
    if unknown or not keys:
        raise argparse.ArgumentTypeError(
            f"--models must name some of {list(MODEL_KEYS)}, got {list(values)}."
        )
    return list(dict.fromkeys(keys))


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    """`key=value` strings -> dict; values are Python literals when they parse as one, else strings."""
    overrides: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--override expects key=value, got {item!r}.")
        try:
            value: Any = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            value = raw
        overrides[key.strip()] = value
    return overrides


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface (see benchmarks/README.md)."""
    p = argparse.ArgumentParser(
        description="Parameters, FLOPs, throughput, memory and routing density of Neural Interpreters vs ViT.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--preset", default="digits", help="NeuralInterpreterConfig.from_paper preset.")
    p.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Override a field of our model's config (repeatable), e.g. num_function_iterations=1.",
    )
    p.add_argument(
        "--models",
        nargs="+",
        default=list(DEFAULT_MODELS),
        help=f"Subset of {list(MODEL_KEYS)} (space/comma separated).",
    )
    p.add_argument(
        "--modes", nargs="+", default=list(MODES), choices=MODES, help="Throughput/memory modes to measure."
    )
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N.")
    p.add_argument(
        "--dtype",
        default="float32",
        choices=("float32", "bfloat16"),
        help="float32, or bfloat16 autocast (weights stay float32).",
    )
    p.add_argument("--repeats", type=int, default=5, help="Timed repeats (the models take turns in each).")
    p.add_argument("--warmup", type=int, default=1, help="Untimed warm-up rounds before the repeats.")
    p.add_argument(
        "--steps-per-repeat",
        type=int,
        default=None,
        help="Steps timed together in one repeat (default: 1 on CPU, 20 on CUDA).",
    )
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's).")
    p.add_argument("--seed", type=int, default=0, help="Seed of the weights and of the random inputs.")
    p.add_argument("--lr", type=float, default=1e-4, help="RAdam learning rate of the training steps.")
    p.add_argument(
        "--gradient-checkpointing",
        action="store_true",
        help="Enable activation (gradient) checkpointing on every model for training.",
    )
    p.add_argument(
        "--compare-checkpointing",
        action="store_true",
        help="Measure training with and without checkpointing; report memory reduction %% and slowdown %%.",
    )
    p.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the models (for GPUs; on CPU it slowed our model, see RESULTS.md).",
    )
    p.add_argument(
        "--compile-mode",
        default=None,
        choices=("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"),
        help="torch.compile mode (implies --compile).",
    )
    p.add_argument(
        "--cuda-graphs",
        action="store_true",
        help='CUDA graphs through torch.compile(mode="reduce-overhead") unless --compile-mode says otherwise.',
    )
    p.add_argument(
        "--memory",
        default="auto",
        choices=("auto", "subprocess", "inprocess", "off"),
        help="Peak memory: auto = a fresh subprocess per model and mode on CPU, CUDA allocator stats on CUDA.",
    )
    p.add_argument(
        "--flop-batch", type=int, default=2, help="Batch size of the FLOP count (per image result)."
    )
    p.add_argument(
        "--no-training-flop-count",
        action="store_true",
        help="Skip counting forward+backward FLOPs (training GFLOP/s always uses 3x forward).",
    )
    p.add_argument(
        "--checkpoint", default=None, help="Trained NeuralInterpreterForImageClassification folder."
    )
    p.add_argument(
        "--data-dir",
        default=None,
        help="Local Parquet digits data (e.g. /work/shared/data) for routing density on real MNIST/MNIST-M "
        "test images; random patches otherwise.",
    )
    p.add_argument("--density-samples", type=int, default=128, help="Images used for the routing density.")
    p.add_argument("--no-density", action="store_true", help="Skip the routing-density measurement.")
    p.add_argument("--output-json", default=None, help="Write all results to this JSON file.")
    p.add_argument(
        "--append-results",
        default=None,
        help="Append the Markdown report to this file (e.g. benchmarks/RESULTS.md).",
    )
    p.add_argument(
        "--keep-freed-memory",
        action="store_true",
        help="Before anything runs, tell glibc to keep freed memory for reuse (ni_hf.cpu_allocator), as the example "
        "scripts' --keep_freed_memory does; it applies to every model of the run (and to the memory subprocesses).",
    )
    p.add_argument(
        "--no-finite-check",
        action="store_true",
        help="Turn off the models' NaN/inf check (`model.checks_finite = False`), to measure what its host sync "
        "costs; torch.compile skips it anyway.",
    )
    p.add_argument("--quiet", action="store_true", help="No progress messages on stderr.")
    # Internal: one peak-memory measurement in this (fresh) process; prints one JSON line.
    p.add_argument(
        "--_measure-memory", nargs=2, metavar=("MODEL", "MODE"), default=None, help=argparse.SUPPRESS
    )
    return p


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse and normalise the arguments."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.models = _split_models(args.models)
        args.overrides = parse_overrides(args.override)
    except (argparse.ArgumentTypeError, ValueError) as err:
        parser.error(str(err))
    args.modes = list(dict.fromkeys(args.modes))
    if args.cuda_graphs and args.compile_mode is None:
        args.compile_mode = "reduce-overhead"
    if args.compile_mode is not None:
        args.compile = True
    if args.compile and args.compile_mode is None:
        args.compile_mode = "default"
    if args.gradient_checkpointing and args.compare_checkpointing:
        parser.error("--compare-checkpointing already measures with and without --gradient-checkpointing.")
    for name in ("batch_size", "repeats", "flop_batch", "density_samples"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1.")
    if args.warmup < 0:
        parser.error("--warmup must be >= 0.")
    args.device = torch.device(args.device)
    if args.device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda given but torch.cuda.is_available() is False.")
    if args.steps_per_repeat is None:
        args.steps_per_repeat = 20 if args.device.type == "cuda" else 1
    if args.memory == "auto":
        args.memory = "inprocess" if args.device.type == "cuda" else "subprocess"
    return args


def _log(args: argparse.Namespace, message: str) -> None:
    """Progress message on stderr (stdout carries the report)."""
    if not args.quiet:
        print(f"[benchmark {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------------------
# Models and inputs
# ----------------------------------------------------------------------------------------------------------


def ni_config(args: argparse.Namespace) -> NeuralInterpreterConfig:
    """Our model's config: the preset with the `--override`s."""
    return NeuralInterpreterConfig.from_paper(args.preset, **args.overrides)


def is_ni(key: str) -> bool:
    """Whether a model key names our Neural Interpreter (else the ViT baseline)."""
    return key.startswith("ni-")


def build_model(key: str, args: argparse.Namespace, attn_implementation: str | None = None) -> nn.Module:
    """A freshly initialised model (seeded: ni-sdpa and ni-eager get identical weights), float32 on the device."""
    from transformers import ViTForImageClassification

    torch.manual_seed(args.seed)
    if is_ni(key):
        model: nn.Module = NeuralInterpreterForImageClassification(ni_config(args))
        impl = attn_implementation or ("eager" if key in EXPERIMENTS else key.split("-")[1])
        for switch_on in EXPERIMENTS.get(key, ()):
            switch_on(model)
    else:
        model = ViTForImageClassification(vit_baseline_config())
        impl = attn_implementation or "sdpa"
    model.set_attn_implementation(impl)
    if args.no_finite_check and is_ni(key):
        model.checks_finite = False
    return model.to(args.device)


def make_inputs(
    key: str, args: argparse.Namespace, batch_size: int, device: torch.device
) -> dict[str, torch.Tensor]:
    """Random images in [-1, 1] (the processor's range): patches (B, P, p*p*C) + task ids for ours, (B, C, H, W) for ViT.

    Both models see the same images (same seed); labels are random classes.
    """
    config = ni_config(args) if is_ni(key) else vit_baseline_config()
    generator = torch.Generator().manual_seed(args.seed + 1)
    images = (
        torch.rand(batch_size, config.num_channels, config.image_size, config.image_size, generator=generator)
        .mul_(2)
        .sub_(1)
    )
    labels = torch.randint(0, config.num_labels, (batch_size,), generator=generator)
    if is_ni(key):
        task_ids = torch.randint(0, config.num_tasks, (batch_size,), generator=generator)
        inputs = {"pixel_values": patchify(images, config.patch_size), "task_ids": task_ids, "labels": labels}
    else:
        inputs = {"pixel_values": images, "labels": labels}
    return {name: tensor.to(device) for name, tensor in inputs.items()}


def count_parameters(model: nn.Module) -> dict[str, int]:
    """Total and trainable parameter counts."""
    params = list(model.parameters())
    return {
        "total": sum(p.numel() for p in params),
        "trainable": sum(p.numel() for p in params if p.requires_grad),
    }


def autocast_context(args: argparse.Namespace) -> contextlib.AbstractContextManager:
    """bfloat16 autocast on the device, or nothing for float32."""
    if args.dtype == "bfloat16":
        return torch.autocast(device_type=args.device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work (timing boundary); nothing on CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ----------------------------------------------------------------------------------------------------------
# FLOPs
# ----------------------------------------------------------------------------------------------------------


def count_flops(
    key: str, args: argparse.Namespace, attn_implementation: str = "eager", backward: bool = False
) -> float:
    """FLOPs per image of one forward (and backward, if asked) at batch `--flop-batch`, on CPU in float32.

    Counted with FlopCounterMode on a model built like the benchmarked one (same seed, so the same routing),
    with the given attention implementation; "eager" makes attention's matmuls visible to the counter.
    """
    saved_device = args.device
    args.device = torch.device("cpu")
    try:
        model = build_model(key, args, attn_implementation=attn_implementation)
        inputs = make_inputs(key, args, args.flop_batch, torch.device("cpu"))
    finally:
        args.device = saved_device
    if backward:
        model.train()
        with FlopCounterMode(display=False) as counter:
            model(**inputs).loss.backward()
    else:
        model.eval()
        inputs.pop("labels")
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            model(**inputs)
    return counter.get_total_flops() / args.flop_batch


def forward_flops_per_image(args: argparse.Namespace, overrides: dict[str, Any] | None = None) -> float:
    """Forward FLOPs per image of our model (eager attention): the quantity SPEC.md's "Cost" section targets."""
    local = argparse.Namespace(**vars(args))
    if overrides is not None:
        local.overrides = overrides
    return count_flops("ni-eager", local)


# ----------------------------------------------------------------------------------------------------------
# Timing
# ----------------------------------------------------------------------------------------------------------


@dataclass
class Variant:
    """One benchmarked model instance: a model key, with or without activation checkpointing."""

    key: str
    checkpointing: bool
    model: nn.Module
    runner: Callable[..., Any]
    optimizer: torch.optim.Optimizer
    inputs: dict[str, torch.Tensor]
    snapshot: list[torch.Tensor]
    seconds: dict[str, list[float]] = field(default_factory=lambda: {mode: [] for mode in MODES})

    @property
    def name(self) -> str:
        return f"{self.key}+ckpt" if self.checkpointing else self.key


def make_variant(key: str, checkpointing: bool, args: argparse.Namespace) -> Variant:
    """Build the model (compiled if asked), its RAdam optimizer, inputs and a copy of its initial weights."""
    model = build_model(key, args)
    if checkpointing:
        enable_activation_checkpointing(model)
    runner: Callable[..., Any] = model
    if args.compile:
        runner = torch.compile(model, mode=None if args.compile_mode == "default" else args.compile_mode)
    optimizer = torch.optim.RAdam([p for p in model.parameters() if p.requires_grad], lr=args.lr)
    snapshot = [p.detach().clone() for p in model.parameters()]
    inputs = make_inputs(key, args, args.batch_size, args.device)
    return Variant(key, checkpointing, model, runner, optimizer, inputs, snapshot)


@torch.no_grad()
def restore_weights(variant: Variant) -> None:
    """Reset the weights to their initial values, so that every timed step runs the same model (and routing)."""
    for param, saved in zip(variant.model.parameters(), variant.snapshot, strict=True):
        param.copy_(saved)


CUDA_GRAPH_COMPILE_MODES = ("reduce-overhead", "max-autotune")
"""torch.compile modes that record CUDA graphs (on a CUDA device)."""


def uses_cuda_graphs(args: argparse.Namespace) -> bool:
    """Whether the compile mode records CUDA graphs (on a CUDA device)."""
    return bool(args.compile) and args.compile_mode in CUDA_GRAPH_COMPILE_MODES


def _mark_cudagraph_step(args: argparse.Namespace) -> None:
    """Tell torch.compile's CUDA graphs that a new iteration starts (outputs of the last one are dead)."""
    if uses_cuda_graphs(args):
        mark = getattr(torch.compiler, "cudagraph_mark_step_begin", None)
        if mark is not None:
            mark()


def run_step(variant: Variant, mode: str, args: argparse.Namespace) -> None:
    """One inference forward (no grad) or one training step (forward, backward, RAdam step)."""
    _mark_cudagraph_step(args)
    if mode == "inference":
        variant.model.eval()
        inputs = {k: v for k, v in variant.inputs.items() if k != "labels"}
        with torch.no_grad(), autocast_context(args):
            variant.runner(**inputs)
    else:
        variant.model.train()
        variant.optimizer.zero_grad(set_to_none=True)
        with autocast_context(args):
            loss = variant.runner(**variant.inputs).loss
        loss.backward()
        variant.optimizer.step()


def time_steps(variant: Variant, mode: str, args: argparse.Namespace) -> float:
    """Seconds for `--steps-per-repeat` steps (weights restored first, outside the timing)."""
    restore_weights(variant)
    synchronize(args.device)
    start = time.perf_counter()
    for _ in range(args.steps_per_repeat):
        run_step(variant, mode, args)
    synchronize(args.device)
    return time.perf_counter() - start


COMPILED_AGREEMENT_WARNING = 0.1
"""A compiled model whose logits leave its eager run's by more than this (absolute) is flagged in the report: bf16
rounding moves them by about 1e-2, the CUDA miscompile of 2026-11-27 by 1.1-1.7 (RESULTS.md)."""


@torch.no_grad()
def _eager_outputs(variant: Variant, args: argparse.Namespace) -> tuple[torch.Tensor, torch.Tensor]:
    with autocast_context(args):
        out = variant.model(**variant.inputs)
    return out.loss.float(), out.logits.float()


def compiled_agreement(variant: Variant, args: argparse.Namespace) -> dict[str, Any] | None:
    """The compiled training forward against the same model run eagerly, same weights, batch and autocast.

    Under `--compile` a speed means little if the compiled function is another one (inductor compiled our "sdpa"
    LOCs wrongly on CUDA once). This runs the compiled model's training graph (grad on, train mode: no recompile)
    and the uncompiled model on the benchmark's batch and records the largest |logit difference| and both losses.
    Skipped (None) without `--compile` and for models with active dropout, whose two runs would differ by chance.
    """
    if not args.compile:
        return None
    variant.model.train()
    if any(isinstance(m, nn.Dropout) and m.p > 0 for m in variant.model.modules()):
        return None
    restore_weights(variant)
    eager_loss, eager_logits = _eager_outputs(variant, args)
    try:  # after the timing: a failure here must not cost the measurements
        _mark_cudagraph_step(args)
        with autocast_context(args):
            out = variant.runner(**variant.inputs)
        # clone at once: a CUDA-graph replay overwrites its outputs
        compiled_loss, compiled_logits = (
            out.loss.detach().float().clone(),
            out.logits.detach().float().clone(),
        )
        del out
    except Exception as error:  # noqa: BLE001  (reported, not raised)
        return {"error": f"{type(error).__name__}: {error}"[:300], "flagged": True}
    difference = (compiled_logits - eager_logits).abs().max().item()
    return {
        "max_abs_logit_difference": difference,
        "eager_loss": eager_loss.item(),
        "compiled_loss": compiled_loss.item(),
        "flagged": not difference <= COMPILED_AGREEMENT_WARNING,
    }


def _rotated(items: Sequence[Any], shift: int) -> list[Any]:
    """`items` rotated left by `shift` (which model goes first changes from repeat to repeat)."""
    shift %= max(len(items), 1)
    return list(items[shift:]) + list(items[:shift])


def benchmark_throughput(variants: list[Variant], args: argparse.Namespace) -> None:
    """Warm-up rounds, then `--repeats` rounds in which every variant runs every mode once; fills `seconds`.

    The variant that goes first changes from repeat to repeat (rotation), and within a repeat each variant
    runs inference then training, so slow phases of a shared machine hit all models alike.
    """

    def jobs(order: Sequence[Variant]) -> list[tuple[Variant, str]]:
        return [(v, m) for v in order for m in args.modes if not (m == "inference" and v.checkpointing)]

    for round_index in range(args.warmup):
        _log(args, f"warm-up {round_index + 1}/{args.warmup}")
        for variant, mode in jobs(variants):
            time_steps(variant, mode, args)
    for repeat in range(args.repeats):
        for variant, mode in jobs(_rotated(variants, repeat)):
            seconds = time_steps(variant, mode, args)
            variant.seconds[mode].append(seconds)
            _log(args, f"repeat {repeat + 1}/{args.repeats} {variant.name} {mode}: {seconds:.3f} s")
    for variant in variants:
        restore_weights(variant)


def throughput_stats(seconds: Sequence[float], images_per_run: int) -> dict[str, Any] | None:
    """Images/s over the repeats: median, min, max, quartiles, and the raw seconds."""
    if not seconds:
        return None
    rates = sorted(images_per_run / s for s in seconds)
    if len(rates) >= 2:
        q1, _, q3 = statistics.quantiles(rates, n=4, method="inclusive")
    else:
        q1 = q3 = rates[0]
    return {
        "images_per_s_median": statistics.median(rates),
        "images_per_s_min": rates[0],
        "images_per_s_max": rates[-1],
        "images_per_s_q1": q1,
        "images_per_s_q3": q3,
        "images_per_s_iqr": q3 - q1,
        "seconds": list(seconds),
    }


# ----------------------------------------------------------------------------------------------------------
# Memory
# ----------------------------------------------------------------------------------------------------------


def _proc_status_kib(field_name: str) -> int | None:
    """A `VmXXX:` field of /proc/self/status in KiB, or None where there is no procfs."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak_rss() -> bool:
    """Reset the process's peak RSS (VmHWM) to its current RSS (Linux >= 4.0); False where not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
        return True
    except OSError:
        return False


def _maxrss_kib() -> int:
    """Peak RSS of this process so far in KiB (ru_maxrss is KiB on Linux, bytes on macOS)."""
    value = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return value // 1024 if sys.platform == "darwin" else value


def measure_cpu_peak_memory(variant: Variant, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """Peak RSS growth of one step over the RSS after construction (model, optimizer, inputs).

    Where /proc/self/clear_refs works, the peak is reset to the current RSS first and growth = VmHWM after the
    step - VmRSS before it; else growth = ru_maxrss after - ru_maxrss before (an underestimate if an earlier
    phase, e.g. imports, peaked higher than the step's working set). Our model's reused CPU buffers are
    released first, so that the step's growth includes them.
    """
    release_workspace()
    gc.collect()
    if _reset_peak_rss() and _proc_status_kib("VmHWM") is not None:
        method = "VmHWM - VmRSS (peak reset via /proc/self/clear_refs)"
        baseline = _proc_status_kib("VmRSS") or 0
        run_step(variant, mode, args)
        peak = _proc_status_kib("VmHWM") or 0
    else:
        method = "ru_maxrss growth"
        baseline = _maxrss_kib()
        run_step(variant, mode, args)
        peak = _maxrss_kib()
    return {
        "peak_mib": max(peak - baseline, 0) / 1024,
        "baseline_rss_mib": baseline / 1024,
        "method": method,
    }


def measure_cuda_peak_memory(variant: Variant, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """torch.cuda.max_memory_allocated during one step, minus the allocation before it."""
    gc.collect()
    variant.optimizer.zero_grad(set_to_none=True)
    synchronize(args.device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(args.device)
    baseline = torch.cuda.memory_allocated(args.device)
    run_step(variant, mode, args)
    synchronize(args.device)
    peak = torch.cuda.max_memory_allocated(args.device)
    return {
        "peak_mib": (peak - baseline) / MIB,
        "baseline_allocated_mib": baseline / MIB,
        "max_allocated_mib": peak / MIB,
        "method": "torch.cuda.max_memory_allocated - memory_allocated before the step",
    }


MEMORY_WARMUP_BATCH = 2
"""Batch size of the untimed step run before a CPU memory measurement (see `measure_memory_here`)."""


def measure_memory_here(key: str, mode: str, checkpointing: bool, args: argparse.Namespace) -> dict[str, Any]:
    """Build one variant in this process and measure the peak memory of one full-batch step.

    A warm-up step comes first so that one-time costs (lazily loaded kernels and libraries, thread pools, the
    optimizer's state, torch.compile) are in the baseline, not in the peak: on CPU one step on a batch of
    MEMORY_WARMUP_BATCH images (its buffers are too small to pre-grow the allocator for the real batch), on CUDA
    max(--warmup, 1) full steps (the caching allocator keeps its pool, but `max_memory_allocated` counts live
    tensors only).
    """
    variant = make_variant(key, checkpointing, args)
    if args.device.type == "cuda":
        for _ in range(max(args.warmup, 1)):
            run_step(variant, mode, args)
        restore_weights(variant)
        return measure_cuda_peak_memory(variant, mode, args)
    full_inputs = variant.inputs
    variant.inputs = make_inputs(key, args, min(MEMORY_WARMUP_BATCH, args.batch_size), args.device)
    run_step(variant, mode, args)
    variant.inputs = full_inputs
    restore_weights(variant)
    variant.optimizer.zero_grad(set_to_none=True)
    return measure_cpu_peak_memory(variant, mode, args)


def _child_args(args: argparse.Namespace, key: str, mode: str, checkpointing: bool) -> list[str]:
    """Command line of a fresh `--_measure-memory` process with this run's settings."""
    argv = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--_measure-memory",
        key,
        mode,
        "--preset",
        args.preset,
        "--batch-size",
        str(args.batch_size),
        "--device",
        str(args.device),
        "--dtype",
        args.dtype,
        "--seed",
        str(args.seed),
        "--lr",
        str(args.lr),
        "--warmup",
        str(args.warmup),
        "--steps-per-repeat",
        str(args.steps_per_repeat),
        "--quiet",
    ]
    for item in args.override:
        argv += ["--override", item]
    if args.threads is not None:
        argv += ["--threads", str(args.threads)]
    if args.compile:
        argv += ["--compile-mode", args.compile_mode]
    if args.keep_freed_memory:
        argv.append("--keep-freed-memory")
    if args.no_finite_check:
        argv.append("--no-finite-check")
    if checkpointing:
        argv.append("--gradient-checkpointing")
    return argv


def measure_memory_subprocess(
    key: str, mode: str, checkpointing: bool, args: argparse.Namespace
) -> dict[str, Any]:
    """Peak memory of one step measured in a fresh Python process (clean allocator, no earlier peaks)."""
    env = dict(os.environ)
    package_root = str(Path(ni_hf.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    argv = _child_args(args, key, mode, checkpointing)
    result = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    if result.returncode != 0:
        raise RuntimeError(
            f"Memory measurement failed ({shlex.join(argv)}), exit {result.returncode}:\n{result.stderr[-4000:]}"
        )
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(
            f"Memory measurement printed no JSON ({shlex.join(argv)}):\n{result.stdout[-2000:]}"
        )
    measured = json.loads(lines[-1])
    measured["method"] += " in a fresh subprocess"
    return measured


def measure_memory(
    key: str, mode: str, checkpointing: bool, args: argparse.Namespace
) -> dict[str, Any] | None:
    """Peak memory of one step of one model in one mode, as `--memory` says (None for "off")."""
    if args.memory == "off":
        return None
    if args.device.type == "cuda" and uses_cuda_graphs(args):
        # The graphs allocate their memory pool while they are recorded (in the warm-up), so the growth over one
        # replayed step reads ~0: not a peak. Measure without --cuda-graphs instead.
        return None
    if args.memory == "subprocess":
        return measure_memory_subprocess(key, mode, checkpointing, args)
    return measure_memory_here(key, mode, checkpointing, args)


# ----------------------------------------------------------------------------------------------------------
# Routing density
# ----------------------------------------------------------------------------------------------------------


def load_real_pixel_values(
    data_dir: str, num_samples: int, config: NeuralInterpreterConfig
) -> tuple[torch.Tensor, str]:
    """Processed MNIST + MNIST-M test images (half each) from local Parquet files: (patches, description)."""
    from ni_hf.digits_data import load_digits_tasks

    per_task = math.ceil(num_samples / 2)
    data, names = load_digits_tasks(
        ["mnist", "mnistm"],
        source="local",
        data_dir=data_dir,
        max_train_samples=1,
        max_eval_samples=per_task,
    )
    test = data["test"]
    processor = ni_hf.NeuralInterpreterImageProcessor(
        patch_size=config.patch_size, size={"height": config.image_size, "width": config.image_size}
    )
    pixel_values = processor(images=list(test["image"]), return_tensors="pt")["pixel_values"]
    return pixel_values, f"real images: {len(test)} test images of {'+'.join(names)} from {data_dir}"


def random_pixel_values(
    num_samples: int, config: NeuralInterpreterConfig, seed: int
) -> tuple[torch.Tensor, str]:
    """Random patches in [-1, 1] (the processor's value range): (patches, description)."""
    generator = torch.Generator().manual_seed(seed + 2)
    images = (
        torch.rand(
            num_samples, config.num_channels, config.image_size, config.image_size, generator=generator
        )
        .mul_(2)
        .sub_(1)
    )
    return patchify(images, config.patch_size), f"random patches: {num_samples} uniform [-1, 1] images"


def routing_density(
    model: NeuralInterpreterForImageClassification, pixel_values: torch.Tensor, batch_size: int
) -> dict[str, Any]:
    """Routing density (`ni_hf.evaluation.routing_density`) over all images, in batches of `batch_size`."""
    batches = (
        {"pixel_values": pixel_values[start : start + batch_size]}
        for start in range(0, pixel_values.shape[0], batch_size)
    )
    density = evaluation_routing_density(model, batches)
    density["num_images"] = density.pop("num_samples")
    return density


def measure_routing_density(args: argparse.Namespace) -> dict[str, Any]:
    """Routing density of the freshly initialised model and, with `--checkpoint`, of the trained one."""
    results: dict[str, Any] = {}
    models: list[tuple[str, NeuralInterpreterForImageClassification]] = [
        ("fresh", build_model("ni-sdpa", args))  # type: ignore[list-item]
    ]
    if args.checkpoint:
        trained = NeuralInterpreterForImageClassification.from_pretrained(args.checkpoint)
        models.append(("checkpoint", trained.to(args.device)))
    for label, model in models:
        config = model.config
        if args.data_dir:
            pixel_values, source = load_real_pixel_values(args.data_dir, args.density_samples, config)
        else:
            pixel_values, source = random_pixel_values(args.density_samples, config, args.seed)
        density = routing_density(model, pixel_values, args.batch_size)
        density["inputs"] = source
        density["model"] = (
            args.checkpoint
            if label == "checkpoint"
            else f"freshly initialised {args.preset} (seed {args.seed})"
        )
        results[label] = density
    return results


# ----------------------------------------------------------------------------------------------------------
# Environment and report
# ----------------------------------------------------------------------------------------------------------


def cpu_model_name() -> str:
    """CPU model from /proc/cpuinfo, else lscpu, else platform.processor()."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def environment(args: argparse.Namespace) -> dict[str, Any]:
    """Date, hardware, library versions and the exact command line."""
    import transformers

    try:
        usable_cores: int | None = len(os.sched_getaffinity(0))
    except AttributeError:
        usable_cores = None
    env: dict[str, Any] = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "cpu": cpu_model_name(),
        "cpu_count": os.cpu_count(),
        "cpu_usable_cores": usable_cores,
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "ni_hf": getattr(ni_hf, "__version__", "unknown"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "gpu": None,
        "command": shlex.join(getattr(sys, "orig_argv", [sys.executable, *sys.argv])),
        "cwd": os.getcwd(),
        # MKL's code path (0: its generic kernels, as on AMD CPUs unless examples/with_mkl_on_amd.sh preloads its
        # library) moves float32 CPU throughput by up to 2x; LD_PRELOAD says whether the wrapper ran.
        "mkl_code_path": mkl_code_path(),
        "ld_preload": os.environ.get("LD_PRELOAD"),
        # Instructions that multiply bf16 natively: with them, --dtype bfloat16 on CPU runs at about twice float32.
        "native_bf16": native_bf16_features(),
    }
    if os.environ.get("PYTHONPATH"):
        env["command"] = f"PYTHONPATH={shlex.quote(os.environ['PYTHONPATH'])} {env['command']}"
    if args.device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(args.device)
        env["cuda"] = torch.version.cuda
    return env


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """The run's settings, as recorded in the JSON."""
    return {
        "preset": args.preset,
        "overrides": args.overrides,
        "models": args.models,
        "modes": args.modes,
        "batch_size": args.batch_size,
        "device": str(args.device),
        "dtype": args.dtype,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "steps_per_repeat": args.steps_per_repeat,
        "seed": args.seed,
        "optimizer": f"RAdam(lr={args.lr})",
        "gradient_checkpointing": args.gradient_checkpointing,
        "compare_checkpointing": args.compare_checkpointing,
        "compile": args.compile,
        "compile_mode": args.compile_mode if args.compile else None,
        "memory": args.memory,
        "flop_batch": args.flop_batch,
        "training_flops_factor": TRAINING_FLOPS_FACTOR,
        "weights_restored_before_each_repeat": True,
        "keep_freed_memory": getattr(args, "kept_freed_memory", False),
        "finite_check": not args.no_finite_check,
    }


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    return None if numerator is None or not denominator else numerator / denominator


def _median(result: dict[str, Any], mode: str) -> float | None:
    stats = result.get(mode)
    return None if stats is None else stats["images_per_s_median"]


def compute_ratios(models: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """ours(sdpa) / ViT achieved GFLOP/s (inference, training) and ours' training images/s as % of ViT's."""
    ours, vit = models.get("ni-sdpa"), models.get("vit")
    if ours is None or vit is None:
        return {
            "gflops_inference_ni_sdpa_over_vit": None,
            "gflops_training_ni_sdpa_over_vit": None,
            "training_images_per_s_ni_sdpa_pct_of_vit": None,
            "inference_images_per_s_ni_sdpa_pct_of_vit": None,
        }
    train_pct = _ratio(_median(ours, "training"), _median(vit, "training"))
    infer_pct = _ratio(_median(ours, "inference"), _median(vit, "inference"))
    return {
        "gflops_inference_ni_sdpa_over_vit": _ratio(
            ours["achieved_gflops"]["inference"], vit["achieved_gflops"]["inference"]
        ),
        "gflops_training_ni_sdpa_over_vit": _ratio(
            ours["achieved_gflops"]["training"], vit["achieved_gflops"]["training"]
        ),
        "training_images_per_s_ni_sdpa_pct_of_vit": None if train_pct is None else 100 * train_pct,
        "inference_images_per_s_ni_sdpa_pct_of_vit": None if infer_pct is None else 100 * infer_pct,
    }


def _fmt(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def _fmt_pct(value: float | None) -> str:
    return "–" if value is None else f"{value:,.1f}%"


def _fmt_rate(stats: dict[str, Any] | None) -> str:
    if stats is None:
        return "–"
    return (
        f"{stats['images_per_s_median']:,.1f} "
        f"[{stats['images_per_s_min']:,.1f}–{stats['images_per_s_max']:,.1f}]"
    )


def _fmt_mem(memory: dict[str, Any] | None, mode: str) -> str:
    if not memory or memory.get(mode) is None:
        return "–"
    return f"{memory[mode]['peak_mib']:,.0f}"


def _fmt_agreement(name: str, agreement: dict[str, Any]) -> str:
    if "error" in agreement:
        return f"{name} not checked ({agreement['error']})"
    flag = " (**a different function?**)" if agreement["flagged"] else ""
    return f"{name} {agreement['max_abs_logit_difference']:.4f}{flag}"


def markdown_report(report: dict[str, Any]) -> str:
    """The Markdown section appended to RESULTS.md: header (date, hardware, command) and tables."""
    env, cfg = report["environment"], report["settings"]
    lines = [
        f"## {env['date']} — preset `{cfg['preset']}`, batch {cfg['batch_size']}, {cfg['device']}, {cfg['dtype']}",
        "",
        f"- Hardware: {env['cpu']} ({env['cpu_count']} cores, {env['cpu_usable_cores']} usable), "
        f"torch {env['torch']} with {env['torch_threads']} threads, transformers {env['transformers']}, "
        f"Python {env['python']}"
        + (f"; GPU {env['gpu']} (CUDA {env.get('cuda')})" if env["gpu"] else "")
        + (f"; MKL code path {env['mkl_code_path']}" if env.get("mkl_code_path") is not None else "")
        + (f"; LD_PRELOAD={env['ld_preload']}" if env.get("ld_preload") else "")
        + (
            f"; native bf16 ({', '.join(env['native_bf16'])})"
            if env.get("native_bf16") and cfg["device"] == "cpu"
            else ""
        ),
        f"- Command: `{env['command']}`",
        f"- Timing: {cfg['warmup']} warm-up round(s), {cfg['repeats']} repeats of {cfg['steps_per_repeat']} step(s), "
        "models alternated within each repeat; images/s as median [min–max]; training = forward + backward + "
        f"{cfg['optimizer']} step; weights restored before each repeat."
        + (f" torch.compile mode `{cfg['compile_mode']}`." if cfg["compile"] else "")
        + (" Activation checkpointing on." if cfg["gradient_checkpointing"] else "")
        + (
            " glibc kept freed memory for reuse (`--keep-freed-memory`), for every model."
            if cfg.get("keep_freed_memory")
            else ""
        ),
        f"- FLOPs: FlopCounterMode, eager attention, batch {cfg['flop_batch']}; training GFLOP/s counts "
        f"{cfg['training_flops_factor']:g}x forward FLOPs. Peak memory: {cfg['memory']} "
        "(one full-batch step after a warm-up step; CPU: peak RSS growth over the RSS before the step; "
        "CUDA: max_memory_allocated growth"
        + (
            "; not measured under CUDA graphs, which allocate their pool while recording"
            if cfg["compile"]
            and cfg["compile_mode"] in CUDA_GRAPH_COMPILE_MODES
            and cfg["device"].startswith("cuda")
            else ""
        )
        + ").",
    ]
    if cfg["overrides"]:
        lines.append(f"- Config overrides of our model: `{cfg['overrides']}`")
    lines += [
        "",
        "| Model | Params (trainable) | Fwd GFLOP/img | Inference img/s | Training img/s | Inference GFLOP/s "
        "| Training GFLOP/s | Peak mem inference (MiB) | Peak mem training (MiB) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, result in report["models"].items():
        params = result["parameters"]
        gflops = result["achieved_gflops"]
        lines.append(
            f"| {name} | {params['total']:,} ({params['trainable']:,}) | "
            f"{result['flops']['forward_per_image'] / 1e9:.3f} | {_fmt_rate(result.get('inference'))} | "
            f"{_fmt_rate(result.get('training'))} | {_fmt(gflops['inference'])} | {_fmt(gflops['training'])} | "
            f"{_fmt_mem(result.get('memory'), 'inference')} | {_fmt_mem(result.get('memory'), 'training')} |"
        )
    checked = {
        name: r["compiled_vs_eager"] for name, r in report["models"].items() if r.get("compiled_vs_eager")
    }
    if checked:
        lines += [
            "",
            "Compiled against eager (the training forward, same weights, batch and autocast): largest |logit "
            "difference| " + ", ".join(_fmt_agreement(name, c) for name, c in checked.items()) + ".",
        ]
    ratios = report["ratios"]
    lines += [
        "",
        "Ratios (ours = ni-sdpa): achieved GFLOP/s ours / ViT: inference "
        f"{_fmt(ratios['gflops_inference_ni_sdpa_over_vit'], 3)}, training "
        f"{_fmt(ratios['gflops_training_ni_sdpa_over_vit'], 3)}; our training images/s = "
        f"{_fmt_pct(ratios['training_images_per_s_ni_sdpa_pct_of_vit'])} of ViT's (inference "
        f"{_fmt_pct(ratios['inference_images_per_s_ni_sdpa_pct_of_vit'])}).",
    ]
    if report.get("checkpointing"):
        lines += [
            "",
            "Activation checkpointing (training):",
            "",
            "| Model | img/s off | img/s on | Slowdown % | Peak MiB off | Peak MiB on | Memory reduction % |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, row in report["checkpointing"].items():
            lines.append(
                f"| {name} | {_fmt(row['images_per_s_off'])} | {_fmt(row['images_per_s_on'])} | "
                f"{_fmt(row['slowdown_pct'])} | {_fmt(row['peak_mib_off'], 0)} | {_fmt(row['peak_mib_on'], 0)} | "
                f"{_fmt(row['memory_reduction_pct'])} |"
            )
    density = report.get("routing_density")
    if density:
        num_iters = max(len(d["per_iteration"]) for d in density.values())
        lines += [
            "",
            "Routing density: fraction of (function, token) pairs with C > 0, per function iteration:",
            "",
            "| Model | Inputs | "
            + " | ".join(f"it {i + 1}" for i in range(num_iters))
            + " | Mean | Functions/token |",
            "|---|---|" + "---|" * num_iters + "---|---|",
        ]
        for label, d in density.items():
            cells = [f"{v:.3f}" for v in d["per_iteration"]] + [""] * (num_iters - len(d["per_iteration"]))
            lines.append(
                f"| {label} | {d['inputs']} | "
                + " | ".join(cells)
                + f" | {d['mean']:.3f} | {d['functions_per_token_mean']:.2f} of {d['num_functions']} |"
            )
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """Silence transformers' info/warning logging while building models."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def checkpointing_comparison(
    models: dict[str, dict[str, Any]], keys: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """Training speed and peak memory with vs without activation checkpointing, per model key."""
    rows: dict[str, dict[str, Any]] = {}
    for key in keys:
        off, on = models.get(key), models.get(f"{key}+ckpt")
        if off is None or on is None:
            continue
        rate_off, rate_on = _median(off, "training"), _median(on, "training")
        mem_off = (off.get("memory") or {}).get("training")
        mem_on = (on.get("memory") or {}).get("training")
        peak_off = None if mem_off is None else mem_off["peak_mib"]
        peak_on = None if mem_on is None else mem_on["peak_mib"]
        rows[key] = {
            "images_per_s_off": rate_off,
            "images_per_s_on": rate_on,
            "slowdown_pct": None if not rate_off or not rate_on else 100 * (rate_off / rate_on - 1),
            "peak_mib_off": peak_off,
            "peak_mib_on": peak_on,
            "memory_reduction_pct": None
            if not peak_off or peak_on is None
            else 100 * (1 - peak_on / peak_off),
        }
    return rows


def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    """The whole benchmark; returns the report (also written/printed by `main`)."""
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    env = environment(args)
    _log(args, f"{env['cpu']}, {env['torch_threads']} torch threads, device {args.device}")

    checkpoint_settings = [False, True] if args.compare_checkpointing else [args.gradient_checkpointing]
    with _quiet_transformers():
        variants = [make_variant(key, ckpt, args) for key in args.models for ckpt in checkpoint_settings]

    flops: dict[str, dict[str, float | None]] = {}
    for key in args.models:
        _log(args, f"counting FLOPs of {key}")
        with _quiet_transformers():
            # The model's FLOPs (the padding of the aligned and fused variants is not the model's work); "as run"
            # counts it.
            model_key = "ni-eager" if key in EXPERIMENTS else key
            forward = count_flops(model_key, args, "eager")
            as_run_attention = None if key == "ni-eager" else "eager" if key in EXPERIMENTS else "sdpa"
            as_run = forward if as_run_attention is None else count_flops(key, args, as_run_attention)
            training = (
                None if args.no_training_flop_count else count_flops(model_key, args, "eager", backward=True)
            )
        flops[key] = {
            "forward_per_image": forward,
            "forward_per_image_as_run": as_run,
            "training_per_image_counted": training,
            "training_per_image_assumed": TRAINING_FLOPS_FACTOR * forward,
        }

    benchmark_throughput(variants, args)
    agreement = {}
    for variant in variants:
        agreement[variant.name] = compiled_agreement(variant, args)
        if agreement[variant.name] and agreement[variant.name]["flagged"]:
            _log(
                args,
                f"WARNING: compiled {variant.name} departs from its eager run: {agreement[variant.name]}",
            )

    models: dict[str, dict[str, Any]] = {}
    images_per_run = args.batch_size * args.steps_per_repeat
    for variant in variants:
        fwd = flops[variant.key]["forward_per_image"]
        result: dict[str, Any] = {
            "model": variant.key,
            "gradient_checkpointing": variant.checkpointing,
            "attn_implementation": variant.model.config._attn_implementation,
            "parameters": count_parameters(variant.model),
            "flops": flops[variant.key],
            "compiled_vs_eager": agreement[variant.name],
        }
        for mode in MODES:
            result[mode] = throughput_stats(variant.seconds[mode], images_per_run)
        inf_rate, train_rate = _median(result, "inference"), _median(result, "training")
        result["achieved_gflops"] = {
            "inference": None if inf_rate is None else fwd * inf_rate / 1e9,
            "training": None if train_rate is None else TRAINING_FLOPS_FACTOR * fwd * train_rate / 1e9,
        }
        models[variant.name] = result

    # Free the timed models before measuring memory (subprocesses or in-process).
    keys = [(v.key, v.checkpointing, v.name) for v in variants]
    del variant
    variants.clear()
    gc.collect()
    for key, ckpt, name in keys:
        memory: dict[str, Any] = {}
        for mode in args.modes:
            if mode == "inference" and ckpt:
                continue
            _log(args, f"peak memory of {name} {mode} ({args.memory})")
            with _quiet_transformers():
                memory[mode] = measure_memory(key, mode, ckpt, args)
        models[name]["memory"] = memory if args.memory != "off" else None

    density = None
    if not args.no_density and any(is_ni(key) for key in args.models):
        _log(args, "routing density")
        with _quiet_transformers():
            density = measure_routing_density(args)

    return {
        "environment": env,
        "settings": settings(args),
        "models": models,
        "ratios": compute_ratios(models),
        "checkpointing": checkpointing_comparison(models, args.models)
        if args.compare_checkpointing
        else None,
        "routing_density": density,
    }


def memory_child(args: argparse.Namespace) -> int:
    """`--_measure-memory MODEL MODE`: measure one step's peak memory here and print it as one JSON line."""
    key, mode = args._measure_memory
    if key not in MODEL_KEYS or mode not in MODES:
        raise SystemExit(f"--_measure-memory expects MODEL in {MODEL_KEYS} and MODE in {MODES}.")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    with _quiet_transformers():
        measured = measure_memory_here(key, mode, args.gradient_checkpointing, args)
    print(json.dumps(measured))
    return 0


def main(argv: Sequence[str] | None = None) -> dict[str, Any] | None:
    """Run the benchmark, print the Markdown report, write JSON / append Markdown as asked."""
    args = parse_args(argv)
    args.kept_freed_memory = keep_freed_memory() if args.keep_freed_memory else False
    if args._measure_memory is not None:
        memory_child(args)
        return None
    report = run_benchmark(args)
    text = markdown_report(report)
    print(text)
    if args.output_json:
        path = Path(args.output_json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2) + "\n")
    if args.append_results:
        path = Path(args.append_results)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as out:
            out.write("\n" + text)
    return report


if __name__ == "__main__":
    main()
