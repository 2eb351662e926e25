#!/usr/bin/env python
"""What a Neural Interpreter costs next to the paper's ViT baseline and the authors' implementation.

Models (``--models``):

- ``ni``: ours, ``NeuralInterpreterForImageClassification(NeuralInterpreterConfig.from_paper(preset))`` with its
  attention implementation that is fastest there: "fast" (the package's CPU kernels) for the digits preset on a CPU
  in float32, else "sdpa" (the default; on PGM's sets of 10 tokens "sdpa" is the faster on a CPU too; under
  ``--dtype bfloat16`` too, since "fast" computes float32 only and refuses autocast; the report says so);
- ``ni-eager``: the same weights with ``attn_implementation="eager"``, the literal Eq. 6;
- ``ni-sdpa``: the same weights with ``attn_implementation="sdpa"`` (asked for by name);
- ``vit``: ``transformers.ViTForImageClassification(ni_hf.vit_baseline_config())``, the paper's digits ViT;
- ``authors``: the authors' ``NeuralInterpreter`` (nasimrahaman/neural-interpreter) built from its
  ``presets/<preset>.yml``, from a copy given with ``--authors-code DIR`` (needs einops, addict and pyyaml).

``--preset pgm`` benchmarks the PGM models of section 4.3 instead: ``ni`` is
``NeuralInterpreterForMultipleChoice(NeuralInterpreterConfig.from_paper("pgm", regime=...))`` and ``vit``
the paper's ViT baseline on the same scaffolding,
``MultiTaskViTForMultipleChoice(MultiTaskViTConfig.from_paper("pgm"))``. A sample is then a puzzle (8
context panels and 8 candidates of 80x80, scored as 8 sets of 10 elements): FLOPs and rates are per puzzle
(the report's ``settings.sample`` names the sample; the keys keep their ``image`` names).

For each: parameters; forward FLOPs per image (``FlopCounterMode`` on the literal path, since fused kernels hide
their FLOPs); images/s of inference (no grad, eval mode) and of training (forward, backward, RAdam step), each model
in its steady state (``--schedule steady``: its own warm-up steps just before its own timed steps, back to back as in
a training loop; ``--schedule rotate``: the models taking turns in every repeat, so that a busy machine slows all
alike, but each timed step then starts where another model left the caches and the allocator); achieved GFLOP/s
(training counted as
3x the forward FLOPs); peak memory of one step (CPU: peak RSS growth in a fresh process per model and mode; CUDA:
``torch.cuda.max_memory_allocated`` growth). Ratios: ours over the ViT in GFLOP/s, ours over the authors' in
images/s.

Run from the repository root, e.g. ``python benchmarks/benchmark.py --threads 2`` (see benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import datetime
import gc
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import ni_hf
from ni_hf import (
    MultiTaskViTConfig,
    MultiTaskViTForMultipleChoice,
    NeuralInterpreterConfig,
    NeuralInterpreterForImageClassification,
    NeuralInterpreterForMultipleChoice,
    vit_baseline_config,
)
from ni_hf.models.neural_interpreter.configuration_neural_interpreter import PGM_REGIMES
from ni_hf.models.neural_interpreter.modeling_neural_interpreter import patchify

MODEL_KEYS = ("ni", "ni-eager", "ni-sdpa", "vit", "authors")
DEFAULT_MODELS = ("ni", "ni-eager", "vit")
MODES = ("inference", "training")
SCHEDULES = ("steady", "rotate")
TRAINING_FLOPS_FACTOR = 3.0
"""Training FLOPs are counted as this many times the forward FLOPs (forward + backward ~ 2x forward)."""
FLOP_BATCH = 2
MIB = 2**20
PGM = "pgm"  # the preset whose models are the multiple-choice heads and whose samples are puzzles


# ----------------------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------------------


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
    """The command line, kept as one flat list of options (one call each, in --help's order) that a split would
    only scatter."""
    p = argparse.ArgumentParser(
        description="Parameters, FLOPs, images/s, GFLOP/s and peak memory of Neural Interpreters, the ViT "
        "baseline and the authors' implementation.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--preset",
        default="digits",
        help="NeuralInterpreterConfig.from_paper preset: 'digits' (image classification) or 'pgm' (PGM "
        "puzzles: the multiple-choice Neural Interpreter and ViT).",
    )
    p.add_argument(
        "--regime",
        default=None,
        help="With --preset pgm: the PGM regime whose selection from_paper takes (DeepMind's names; default "
        "neutral).",
    )
    p.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Change a field of our config (repeatable), e.g. num_function_iterations=1.",
    )
    p.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), help=f"Some of {list(MODEL_KEYS)}.")
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N.")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="bfloat16: autocast.")
    p.add_argument("--compile", action="store_true", help="torch.compile every model (meant for GPUs).")
    p.add_argument(
        "--compile-mode",
        default=None,
        choices=("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"),
        help="torch.compile mode (implies --compile; reduce-overhead = CUDA graphs).",
    )
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's).")
    p.add_argument("--repeats", type=int, default=5, help="Timed measurements per model and mode.")
    p.add_argument(
        "--warmup",
        type=int,
        default=2,
        help="Untimed measurements before the timed ones: per model and mode, just before its own (steady), or "
        "rounds of all models before the first repeat (rotate).",
    )
    p.add_argument(
        "--schedule",
        default="steady",
        choices=SCHEDULES,
        help="steady: each model's warm-up and timed steps back to back, one model after another; rotate: the "
        "models taking turns in every repeat, who goes first rotating.",
    )
    p.add_argument(
        "--steps-per-repeat", type=int, default=None, help="Steps timed together (default: 1 CPU, 20 CUDA)."
    )
    p.add_argument(
        "--memory",
        default="auto",
        choices=("auto", "subprocess", "inprocess", "off"),
        help="Peak memory: auto = a fresh process per model and mode on CPU, in process on CUDA.",
    )
    p.add_argument(
        "--authors-code",
        default=None,
        metavar="DIR",
        help="A copy of nasimrahaman/neural-interpreter (with neural_interpreters/ and presets/); adds 'authors' "
        "to the models.",
    )
    p.add_argument(
        "--authors-batch-size",
        type=int,
        default=None,
        help="Batch of the authors' model (default: --batch-size; its training step needs about 15 GB at 128).",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=1e-4, help="RAdam learning rate of the training steps.")
    p.add_argument("--output-json", default=None, help="Write all results, raw timings included, here.")
    p.add_argument("--quiet", action="store_true", help="No progress lines on stderr.")
    # Internal: one peak-memory measurement in this (fresh) process, printed as one JSON line.
    p.add_argument("--_measure-memory", nargs=2, metavar=("MODEL", "MODE"), help=argparse.SUPPRESS)
    return p


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.overrides = parse_overrides(args.override)
    except ValueError as err:
        parser.error(str(err))
    args.models = list(dict.fromkeys(k.strip() for v in args.models for k in v.split(",") if k.strip()))
    if args.authors_code and "authors" not in args.models:
        args.models.append("authors")
    unknown = [key for key in args.models if key not in MODEL_KEYS]
    if unknown or not args.models:
        parser.error(f"--models must name some of {list(MODEL_KEYS)}, got {unknown or args.models}.")
    if args.regime is not None and args.preset != PGM:
        parser.error(f"--regime applies to --preset {PGM} only, got --preset {args.preset}.")
    if args.regime is not None and args.regime not in PGM_REGIMES:
        parser.error(f"--regime {args.regime}: expected one of {list(PGM_REGIMES)}.")
    if args.preset == PGM and "authors" in args.models:
        parser.error(
            f"--preset {PGM}: the authors' implementation is benchmarked on image classification only."
        )
    if "authors" in args.models and not args.authors_code:
        parser.error(
            "the 'authors' model needs --authors-code DIR (a copy of nasimrahaman/neural-interpreter)."
        )
    args.modes = list(dict.fromkeys(args.modes))
    if args.compile_mode is not None:
        args.compile = True
    elif args.compile:
        args.compile_mode = "default"
    if args.authors_batch_size is None:
        args.authors_batch_size = args.batch_size
    for name in ("batch_size", "authors_batch_size", "repeats"):
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


def log(args: argparse.Namespace, message: str) -> None:
    if not args.quiet:
        print(f"[benchmark {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------------------
# Models and inputs
# ----------------------------------------------------------------------------------------------------------


class AuthorsClassifier(nn.Module):
    """The authors' `NeuralInterpreter` with the inputs and outputs of ours: images, task ids -> logits, loss.

    Their model predicts with one head per dataset (the digits preset: mnist, mnistm, svhn, one shared head); the
    loss is the cross entropy of each image's own task's prediction.
    """

    def __init__(self, code_dir: str, preset: str) -> None:
        super().__init__()
        if code_dir not in sys.path:
            sys.path.insert(0, code_dir)
        from neural_interpreters.core.interface import NeuralInterpreter
        from neural_interpreters.utils import read_yaml

        config = read_yaml(str(Path(code_dir) / "presets" / f"{preset}.yml"))
        self.model = NeuralInterpreter(**config.model.kwargs)

    def forward(self, pixel_values, task_ids, labels=None):
        predictions = self.model(pixel_values).predictions
        stacked = torch.stack(list(predictions.values()), dim=1)  # (B, tasks, classes)
        logits = stacked[torch.arange(len(task_ids), device=task_ids.device), task_ids]
        loss = None if labels is None else F.cross_entropy(logits, labels)
        return SimpleNamespace(logits=logits, loss=loss)


def ni_config(args: argparse.Namespace) -> NeuralInterpreterConfig:
    if args.preset == PGM:
        return NeuralInterpreterConfig.from_paper(PGM, regime=args.regime, **args.overrides)
    return NeuralInterpreterConfig.from_paper(args.preset, **args.overrides)


def build_model(key: str, args: argparse.Namespace, attn_implementation: str | None = None) -> nn.Module:
    """A freshly initialised model, seeded (ni, ni-eager and ni-sdpa get the same weights), on the device."""
    from transformers import ViTForImageClassification

    torch.manual_seed(args.seed)
    if key == "authors":
        model: nn.Module = AuthorsClassifier(args.authors_code, args.preset)
    elif key == "vit":
        model = (
            MultiTaskViTForMultipleChoice(MultiTaskViTConfig.from_paper(PGM))
            if args.preset == PGM
            else ViTForImageClassification(vit_baseline_config())
        )
        model.set_attn_implementation(attn_implementation or "sdpa")
    else:
        head = (
            NeuralInterpreterForMultipleChoice
            if args.preset == PGM
            else NeuralInterpreterForImageClassification
        )
        model = head(ni_config(args))
        named = {"ni-eager": "eager", "ni-sdpa": "sdpa"}.get(key)
        model.set_attn_implementation(attn_implementation or named or default_attn_implementation(args)[0])
    return model.to(args.device)


def default_attn_implementation(args: argparse.Namespace) -> tuple[str, str]:
    """The attention implementation of ``ni`` and why: the package's CPU kernels where they pay (the digits preset on
    a CPU in float32), else sdpa, the default."""
    if args.preset == PGM:
        return "sdpa", "the default; on PGM's sets of 10 tokens faster than 'fast' on a CPU"
    if torch.device(args.device).type != "cpu":
        return "sdpa", "the default; 'fast' is CPU code"
    if args.dtype != "float32":
        return "sdpa", f"'fast' computes float32 only and refuses {args.dtype} autocast"
    return "fast", "the package's CPU kernels, the fastest for the digits preset on a CPU"


def attn_implementation_of(model: nn.Module) -> str:
    config = getattr(model, "config", None)
    return getattr(config, "_attn_implementation", None) or "einsum (the authors')"


def batch_size_of(key: str, args: argparse.Namespace) -> int:
    return args.authors_batch_size if key == "authors" else args.batch_size


def make_inputs(key: str, args: argparse.Namespace, batch_size: int, device: torch.device) -> dict[str, Any]:
    """The same random images in [-1, 1] for every model (ours as patches), random labels and task ids; for
    PGM, random panels in [-1, 1] (the context panels, then the candidates) and random correct candidates."""
    config = ni_config(args)
    generator = torch.Generator().manual_seed(args.seed + 1)
    if args.preset == PGM:
        panels = config.num_context_panels + config.num_choices
        shape = (batch_size, panels, config.panel_channels, config.panel_size, config.panel_size)
        inputs = {
            "pixel_values": torch.rand(shape, generator=generator).mul_(2).sub_(1),
            "labels": torch.randint(0, config.num_choices, (batch_size,), generator=generator),
        }
        return {name: tensor.to(device) for name, tensor in inputs.items()}
    shape = (batch_size, config.num_channels, config.image_size, config.image_size)
    images = torch.rand(shape, generator=generator).mul_(2).sub_(1)
    labels = torch.randint(0, config.num_labels, (batch_size,), generator=generator)
    task_ids = torch.randint(0, config.num_tasks, (batch_size,), generator=generator)
    if key == "vit":
        inputs = {"pixel_values": images, "labels": labels}
    elif key == "authors":
        inputs = {"pixel_values": images, "task_ids": task_ids, "labels": labels}
    else:
        inputs = {"pixel_values": patchify(images, config.patch_size), "task_ids": task_ids, "labels": labels}
    return {name: tensor.to(device) for name, tensor in inputs.items()}


def count_parameters(model: nn.Module) -> dict[str, int]:
    params = list(model.parameters())
    return {
        "total": sum(p.numel() for p in params),
        "trainable": sum(p.numel() for p in params if p.requires_grad),
    }


def count_forward_flops(key: str, args: argparse.Namespace) -> float:
    """Forward FLOPs per image on the CPU in float32, with the literal attention (fused kernels hide theirs)."""
    local = argparse.Namespace(**{**vars(args), "device": torch.device("cpu")})
    model = build_model(key, local, attn_implementation=None if key == "authors" else "eager").eval()
    inputs = make_inputs(key, local, FLOP_BATCH, torch.device("cpu"))
    inputs.pop("labels")
    # The authors' model trips FlopCounterMode's module tracker under no_grad: counted with grad on.
    grad_mode = contextlib.nullcontext() if key == "authors" else torch.no_grad()
    with FlopCounterMode(display=False) as counter, grad_mode:
        model(**inputs)
    return counter.get_total_flops() / FLOP_BATCH


def forward_flops_per_image(args: argparse.Namespace) -> float:
    """Forward FLOPs per image of our model: the quantity the issue's FLOP invariant bounds (2.2 GFLOP)."""
    return count_forward_flops("ni", args)


def autocast(args: argparse.Namespace) -> contextlib.AbstractContextManager:
    if args.dtype == "bfloat16":
        return torch.autocast(device_type=args.device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ----------------------------------------------------------------------------------------------------------
# Timing
# ----------------------------------------------------------------------------------------------------------


@dataclass
class Bench:
    """One benchmarked model: the model, what runs it (compiled or not), its optimizer, inputs and initial weights."""

    key: str
    model: nn.Module
    runner: Callable[..., Any]
    optimizer: torch.optim.Optimizer
    inputs: dict[str, Any]
    snapshot: list[torch.Tensor]
    seconds: dict[str, list[float]] = field(default_factory=lambda: {mode: [] for mode in MODES})
    cpu_seconds: dict[str, list[float]] = field(default_factory=lambda: {mode: [] for mode in MODES})


def make_bench(key: str, args: argparse.Namespace) -> Bench:
    model = build_model(key, args)
    runner: Callable[..., Any] = model
    if args.compile:
        runner = torch.compile(model, mode=None if args.compile_mode == "default" else args.compile_mode)
    optimizer = torch.optim.RAdam([p for p in model.parameters() if p.requires_grad], lr=args.lr)
    snapshot = [p.detach().clone() for p in model.parameters()]
    inputs = make_inputs(key, args, batch_size_of(key, args), args.device)
    return Bench(key, model, runner, optimizer, inputs, snapshot)


@torch.no_grad()
def restore_weights(bench: Bench) -> None:
    """Back to the initial weights, so that every timed step runs the same model (and the same routing)."""
    for param, saved in zip(bench.model.parameters(), bench.snapshot, strict=True):
        param.copy_(saved)


def run_step(bench: Bench, mode: str, args: argparse.Namespace) -> None:
    """One inference forward (no grad, eval mode) or one training step (forward, backward, RAdam step)."""
    if args.compile and args.compile_mode in ("reduce-overhead", "max-autotune"):
        torch.compiler.cudagraph_mark_step_begin()
    if mode == "inference":
        bench.model.eval()
        inputs = {k: v for k, v in bench.inputs.items() if k != "labels"}
        with torch.no_grad(), autocast(args):
            bench.runner(**inputs)
    else:
        bench.model.train()
        bench.optimizer.zero_grad(set_to_none=True)
        with autocast(args):
            loss = bench.runner(**bench.inputs).loss
        loss.backward()
        bench.optimizer.step()


def time_steps(bench: Bench, mode: str, args: argparse.Namespace) -> tuple[float, float]:
    """Wall-clock and CPU seconds (all threads of this process) of `--steps-per-repeat` steps."""
    restore_weights(bench)
    synchronize(args.device)
    start, cpu_start = time.perf_counter(), time.process_time()
    for _ in range(args.steps_per_repeat):
        run_step(bench, mode, args)
    synchronize(args.device)
    return time.perf_counter() - start, time.process_time() - cpu_start


def benchmark_throughput(benches: list[Bench], args: argparse.Namespace) -> None:
    """Time every model in every mode, in its steady state or taking turns (``--schedule``)."""
    if args.schedule == "steady":
        time_steady(benches, args)
    else:
        time_rotating(benches, args)
    for bench in benches:
        restore_weights(bench)


def record(bench: Bench, mode: str, args: argparse.Namespace, label: str) -> None:
    seconds, cpu_seconds = time_steps(bench, mode, args)
    bench.seconds[mode].append(seconds)
    bench.cpu_seconds[mode].append(cpu_seconds)
    log(args, f"{label} {bench.key} {mode}: {seconds:.3f} s")


def time_steady(benches: list[Bench], args: argparse.Namespace) -> None:
    """One model and mode at a time: its warm-up steps, then its timed repeats, back to back as in a training loop."""
    for bench in benches:
        for mode in args.modes:
            for index in range(args.warmup):
                log(args, f"warm-up {index + 1}/{args.warmup} {bench.key} {mode}")
                time_steps(bench, mode, args)
            for repeat in range(args.repeats):
                record(bench, mode, args, f"repeat {repeat + 1}/{args.repeats}")


def time_rotating(benches: list[Bench], args: argparse.Namespace) -> None:
    """Warm-up rounds, then repeats in which every model runs every mode; who goes first rotates."""
    for round_index in range(args.warmup):
        log(args, f"warm-up {round_index + 1}/{args.warmup}")
        for bench in benches:
            for mode in args.modes:
                time_steps(bench, mode, args)
    for repeat in range(args.repeats):
        shift = repeat % len(benches)
        for bench in benches[shift:] + benches[:shift]:
            for mode in args.modes:
                record(bench, mode, args, f"repeat {repeat + 1}/{args.repeats}")


def throughput_stats(
    seconds: Sequence[float], images_per_run: int, cpu_seconds: Sequence[float] = ()
) -> dict[str, Any] | None:
    """Images/s over the repeats (median, min, max), images per CPU-second (median) and the raw seconds.

    On a machine shared with other work, CPU seconds count only this process's own work (with one thread; several
    threads add their waits for each other), so their ratios between models move less than wall-clock ones.
    """
    if not seconds:
        return None
    rates = sorted(images_per_run / s for s in seconds)
    return {
        "images_per_s_median": statistics.median(rates),
        "images_per_s_min": rates[0],
        "images_per_s_max": rates[-1],
        "images_per_cpu_s_median": statistics.median(images_per_run / s for s in cpu_seconds)
        if cpu_seconds
        else None,
        "seconds": list(seconds),
        "cpu_seconds": list(cpu_seconds),
    }


# ----------------------------------------------------------------------------------------------------------
# Memory
# ----------------------------------------------------------------------------------------------------------


def _proc_status_kib(name: str) -> int | None:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(name + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def measure_cpu_peak(bench: Bench, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """Peak RSS growth of one step: VmHWM after it minus VmRSS before it (the peak is reset first)."""
    gc.collect()
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")  # VmHWM := VmRSS (Linux >= 4.0)
    except OSError:
        return {"peak_mib": None, "method": "not measured: /proc/self/clear_refs is not writable"}
    baseline = _proc_status_kib("VmRSS") or 0
    run_step(bench, mode, args)
    peak = _proc_status_kib("VmHWM") or 0
    return {"peak_mib": max(peak - baseline, 0) / 1024, "method": "VmHWM - VmRSS"}


def measure_cuda_peak(bench: Bench, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """torch.cuda.max_memory_allocated during one step minus the allocation before it."""
    bench.optimizer.zero_grad(set_to_none=True)
    gc.collect()
    synchronize(args.device)
    torch.cuda.reset_peak_memory_stats(args.device)
    baseline = torch.cuda.memory_allocated(args.device)
    run_step(bench, mode, args)
    synchronize(args.device)
    peak = torch.cuda.max_memory_allocated(args.device)
    return {"peak_mib": (peak - baseline) / MIB, "method": "torch.cuda.max_memory_allocated growth"}


def measure_memory_here(bench: Bench, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """Peak memory of one full-batch step of a model already warmed up in this process."""
    restore_weights(bench)
    if args.device.type == "cuda":
        return measure_cuda_peak(bench, mode, args)
    bench.optimizer.zero_grad(set_to_none=True)
    return measure_cpu_peak(bench, mode, args)


def memory_child(args: argparse.Namespace) -> None:
    """`--_measure-memory MODEL MODE`: build, one warm-up step on a batch of 2, then measure; print JSON."""
    key, mode = args._measure_memory
    bench = make_bench(key, args)
    full_inputs = bench.inputs
    bench.inputs = make_inputs(key, args, min(2, batch_size_of(key, args)), args.device)
    run_step(bench, mode, args)  # lazily loaded kernels, thread pools, optimizer state: baseline, not peak
    bench.inputs = full_inputs
    print(json.dumps(measure_memory_here(bench, mode, args)))


def child_argv(args: argparse.Namespace, key: str, mode: str) -> list[str]:
    argv = [sys.executable, str(Path(__file__).resolve()), "--_measure-memory", key, mode, "--quiet"]
    argv += ["--preset", args.preset, "--device", str(args.device), "--dtype", args.dtype]
    if args.regime is not None:
        argv += ["--regime", args.regime]
    argv += ["--batch-size", str(args.batch_size), "--authors-batch-size", str(args.authors_batch_size)]
    argv += ["--seed", str(args.seed), "--lr", str(args.lr)]
    for item in args.override:
        argv += ["--override", item]
    if args.threads is not None:
        argv += ["--threads", str(args.threads)]
    if args.compile:
        argv += ["--compile-mode", args.compile_mode]
    if args.authors_code:
        argv += ["--authors-code", args.authors_code]
    return argv


def measure_memory_subprocess(key: str, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """Peak memory of one step in a fresh Python process (a clean allocator, no earlier peaks)."""
    env = dict(os.environ)
    package_root = str(Path(ni_hf.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    argv = child_argv(args, key, mode)
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{shlex.join(argv)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    measured = json.loads(lines[-1])
    measured["method"] += " in a fresh process"
    return measured


# ----------------------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------------------


def git_commit() -> str | None:
    """The commit of the ni_hf code that runs, with "+dirty" for uncommitted changes to it."""
    package = Path(ni_hf.__file__).resolve().parent

    def git(*argv: str) -> str:
        return subprocess.run(
            ["git", *argv], cwd=package, capture_output=True, text=True, check=False
        ).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD")
    if not commit:
        return None
    return commit + ("+dirty" if git("status", "--porcelain", "--", ".") else "")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def environment(args: argparse.Namespace) -> dict[str, Any]:
    """Date, hardware, versions, the commit and the command line."""
    import transformers

    command = shlex.join(getattr(sys, "orig_argv", [sys.executable, *sys.argv]))
    if os.environ.get("PYTHONPATH"):
        command = f"PYTHONPATH={shlex.quote(os.environ['PYTHONPATH'])} {command}"
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu": cpu_model(),
        "cpu_usable_cores": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "gpu": torch.cuda.get_device_name(args.device) if args.device.type == "cuda" else None,
        "commit": git_commit(),
        "command": command,
    }


def compute_ratios(models: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """Ours (the default implementation, else the first of ours) over the ViT in achieved GFLOP/s, wall-clock and
    per CPU-second, and over the authors' implementation in images/s."""
    ours = next((models[k] for k in ("ni", "ni-sdpa", "ni-eager") if k in models), None)

    def rate(result: dict[str, Any] | None, mode: str, key: str, per_flop: bool = False) -> float | None:
        if result is None or result[mode] is None or result[mode][key] is None:
            return None
        return result[mode][key] * (result["forward_flops_per_image"] if per_flop else 1)

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a and b else None

    ratios: dict[str, float | None] = {}
    for mode in MODES:
        for key, name in (("images_per_s_median", "gflops"), ("images_per_cpu_s_median", "gflop_per_cpu_s")):
            ratios[f"{mode}_{name}_ours_over_vit"] = ratio(
                rate(ours, mode, key, per_flop=True), rate(models.get("vit"), mode, key, per_flop=True)
            )
        ratios[f"{mode}_images_per_s_ours_over_authors"] = ratio(
            rate(ours, mode, "images_per_s_median"), rate(models.get("authors"), mode, "images_per_s_median")
        )
    return ratios


def _fmt(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def schedule_text(cfg: dict[str, Any]) -> str:
    steps = f"{cfg['repeats']} timed repeats of {cfg['steps_per_repeat']} step(s)"
    if cfg.get("schedule", "rotate") == "steady":
        return f"each model in its steady state: {cfg['warmup']} warm-up measurement(s) of its own just before its {steps}"
    return f"{cfg['warmup']} warm-up round(s), then {steps}, the models taking turns"


def markdown_report(report: dict[str, Any]) -> str:
    env, cfg = report["environment"], report["settings"]
    sample = cfg.get("sample", "image")
    unit = {"image": "img", "puzzle": "puzzle"}[sample]
    hardware = f"{env['cpu']}, {env['cpu_usable_cores']} usable cores, {env['torch_threads']} torch threads"
    if env["gpu"]:
        hardware += f"; GPU {env['gpu']}"
    lines = [
        f"{env['date']}, commit {env['commit']}; {hardware}; torch {env['torch']}, transformers "
        f"{env['transformers']}; load average at the start {env['load_average']}.",
        f"`{env['command']}`",
        f"Batch {cfg['batch_size']}, {cfg['device']}, {cfg['dtype']}"
        + (f", PGM puzzles (the {cfg['regime'] or 'neutral'} regime's models)" if sample == "puzzle" else "")
        + (f", torch.compile mode {cfg['compile_mode']}" if cfg["compile"] else "")
        + f"; {schedule_text(cfg)}; {sample}s/s as median [min–max]; training GFLOP/s counts 3x the forward "
        "FLOPs.",
        "",
        f"| Model | Attention | Params | Fwd GFLOP/{unit} | Inference {unit}/s | Training {unit}/s "
        "| Inference GFLOP/s | Training GFLOP/s | Peak MiB inference | Peak MiB training |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in report["models"].items():
        rates = {
            mode: "–"
            if r[mode] is None
            else f"{r[mode]['images_per_s_median']:,.1f} [{r[mode]['images_per_s_min']:,.1f}–"
            f"{r[mode]['images_per_s_max']:,.1f}]"
            for mode in MODES
        }
        memory = {mode: (r["memory"].get(mode) or {}).get("peak_mib") for mode in MODES}
        label = name if r["batch_size"] == cfg["batch_size"] else f"{name} (batch {r['batch_size']})"
        lines.append(
            f"| {label} | {r['attn_implementation']} | {r['parameters']['total']:,} | "
            f"{r['forward_flops_per_image'] / 1e9:.3f} | {rates['inference']} | {rates['training']} | "
            f"{_fmt(r['achieved_gflops']['inference'])} | {_fmt(r['achieved_gflops']['training'])} | "
            f"{_fmt(memory['inference'], 0)} | {_fmt(memory['training'], 0)} |"
        )
    ratios = report["ratios"]
    ni = report["models"].get("ni")
    if ni is not None and ni.get("attn_implementation_reason"):
        lines += ["", f"ni runs {ni['attn_implementation']!r}: {ni['attn_implementation_reason']}."]
    lines += [
        "",
        "Ours over the ViT, achieved GFLOP/s: inference "
        f"{_fmt(ratios['inference_gflops_ours_over_vit'], 3)}, training "
        f"{_fmt(ratios['training_gflops_ours_over_vit'], 3)}; per CPU-second of this process: inference "
        f"{_fmt(ratios['inference_gflop_per_cpu_s_ours_over_vit'], 3)}, training "
        f"{_fmt(ratios['training_gflop_per_cpu_s_ours_over_vit'], 3)}. Ours over the authors', {sample}s/s: "
        f"inference {_fmt(ratios['inference_images_per_s_ours_over_authors'], 2)}, training "
        f"{_fmt(ratios['training_images_per_s_ours_over_authors'], 2)}.",
    ]
    return "\n".join(lines) + "\n"


def settings(args: argparse.Namespace) -> dict[str, Any]:
    keys = ("preset", "regime", "overrides", "models", "modes", "batch_size", "authors_batch_size", "dtype")
    keys += ("compile", "compile_mode", "schedule", "repeats", "warmup", "steps_per_repeat", "seed", "memory")
    keys += ("authors_code",)
    sample = "puzzle" if args.preset == PGM else "image"
    return {"device": str(args.device), "optimizer": f"RAdam(lr={args.lr})", "sample": sample} | {
        k: getattr(args, k) for k in keys
    }


# ----------------------------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------------------------


def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    env = environment(args)
    log(args, f"{env['cpu']}, {env['torch_threads']} torch threads, {args.device}, commit {env['commit']}")
    if "ni" in args.models:
        log(args, "ni: attn_implementation {!r} ({})".format(*default_attn_implementation(args)))
    flops = {}
    for key in args.models:
        log(args, f"counting the FLOPs of {key}")
        flops[key] = count_forward_flops(key, args)
    benches = [make_bench(key, args) for key in args.models]
    benchmark_throughput(benches, args)

    models: dict[str, dict[str, Any]] = {}
    for bench in benches:
        images = batch_size_of(bench.key, args) * args.steps_per_repeat
        result: dict[str, Any] = {
            "attn_implementation": attn_implementation_of(bench.model),
            "attn_implementation_reason": default_attn_implementation(args)[1] if bench.key == "ni" else None,
            "batch_size": batch_size_of(bench.key, args),
            "parameters": count_parameters(bench.model),
            "forward_flops_per_image": flops[bench.key],
        }
        result |= {
            mode: throughput_stats(bench.seconds[mode], images, bench.cpu_seconds[mode]) for mode in MODES
        }
        result["achieved_gflops"] = {
            mode: None
            if result[mode] is None
            else (1 if mode == "inference" else TRAINING_FLOPS_FACTOR)
            * flops[bench.key]
            * result[mode]["images_per_s_median"]
            / 1e9
            for mode in MODES
        }
        result["memory"] = {}
        if args.memory == "inprocess":
            for mode in args.modes:
                result["memory"][mode] = measure_memory_here(bench, mode, args)
        models[bench.key] = result
    del benches, bench
    gc.collect()
    if args.memory == "subprocess":
        for key in args.models:
            for mode in args.modes:
                log(args, f"peak memory of {key} {mode} in a fresh process")
                models[key]["memory"][mode] = measure_memory_subprocess(key, mode, args)
    return {
        "environment": env,
        "settings": settings(args),
        "models": models,
        "ratios": compute_ratios(models),
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any] | None:
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # model construction's info and warnings would bury the report
    try:
        if args._measure_memory is not None:
            memory_child(args)
            return None
        report = run_benchmark(args)
    finally:
        hf_logging.set_verbosity(verbosity)
    print(markdown_report(report))
    if args.output_json:
        path = Path(args.output_json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
