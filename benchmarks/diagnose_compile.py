#!/usr/bin/env python
"""Which execution departs from the float32 reference: eager or compiled, SDPA or explicit matmuls, bf16 or not.

    PYTHONPATH=src python benchmarks/diagnose_compile.py [--device cuda] [--skip-compile]

Builds the model of tests/test_compile.py (the digits preset with two function iterations and tau = 1.99, so no
(function, token) pair sits near the truncation threshold), computes its logits for 8 fixed random images on the
CPU in float32 (the reference), then in every execution below on --device, and prints each one's largest absolute
difference from the reference. An execution that agrees with the reference to bf16 rounding (about 1e-2 here)
is right; one that is off by O(1) computes another function. On CUDA the "sdpa" rows are repeated with each of
PyTorch's SDPA back ends forced (math, efficient, flash, cudnn; a back end that refuses these shapes says so).
Rows marked "plain autograd" run the LOCs without their memory-lean custom autograd Functions
(`LEAN_CUSTOM_FUNCTIONS = False`: the same function through plain ops), to tell a compiler's handling of those
Functions apart from the rest.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

import ni_hf.modeling_neural_interpreter as modeling
from ni_hf import NeuralInterpreterConfig, NeuralInterpreterForImageClassification


def build_model(attn_implementation: str) -> NeuralInterpreterForImageClassification:
    torch.manual_seed(0)
    config = NeuralInterpreterConfig.from_paper("digits", num_function_iterations=2, truncation_tau=1.99)
    config._attn_implementation = attn_implementation
    return NeuralInterpreterForImageClassification(config).eval()


def logits(runner: Callable, pixel_values: torch.Tensor, bf16: bool) -> torch.Tensor:
    """The logits of `runner` (a model, or a compiled one) as float32 on the CPU, under bf16 autocast if asked."""
    device = pixel_values.device.type
    with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
        return runner(pixel_values=pixel_values).logits.float().cpu()


def main(argv: list[str] | None = None) -> dict[str, float | None]:
    """Print and return each execution's largest absolute logit difference from the reference (None: failed)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="Device to test.")
    p.add_argument("--skip-compile", action="store_true", help="Only the eager executions.")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    pixel_values = torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    reference = logits(build_model("sdpa"), pixel_values, bf16=False)
    print(
        f"torch {torch.__version__}, device {device}; reference: CPU float32, |logits| max {reference.abs().max():.3f}"
    )
    x = pixel_values.to(device)

    results: dict[str, float | None] = {}

    def report(name: str, runner: Callable, bf16: bool, sdpa_backend: str | None = None) -> None:
        results[name] = None
        start = time.perf_counter()
        try:
            if sdpa_backend is None:
                result = logits(runner, x, bf16)
            else:
                from torch.nn.attention import SDPBackend, sdpa_kernel

                with sdpa_kernel([getattr(SDPBackend, sdpa_backend)]):
                    result = logits(runner, x, bf16)
            diff = results[name] = (result - reference).abs().max().item()
            print(f"{name:58s} max |diff| {diff:9.5f}   ({time.perf_counter() - start:5.1f} s)", flush=True)
        except Exception as error:  # a back end that refuses the shapes, or a compile failure: say so, go on
            print(
                f"{name:58s} failed: {type(error).__name__}: {str(error).splitlines()[0][:120]}", flush=True
            )

    # (attention, precision, how: "eager", an SDPA back end or a compiler backend, lean custom Functions or plain)
    runs: list[tuple[str, str, str, bool]] = []
    for attention in ("sdpa", "eager"):
        for precision in ("fp32", "bf16"):
            runs.append((attention, precision, "eager", True))
    if device.type == "cuda":
        for backend in ("MATH", "EFFICIENT_ATTENTION", "FLASH_ATTENTION", "CUDNN_ATTENTION"):
            runs.append(("sdpa", "bf16", backend, True))
    runs.append(("sdpa", "bf16", "eager", False))
    if not args.skip_compile:  # most telling first: a run that hits the time limit loses the least
        runs += [("sdpa", "bf16", "inductor", True), ("sdpa", "bf16", "inductor", False)]
        runs += [("eager", "bf16", "inductor", True), ("sdpa", "bf16", "aot_eager", True)]
        runs.append(("sdpa", "fp32", "inductor", True))
    try:
        for attention, precision, how, lean in runs:
            model = build_model(attention).to(device)
            bf16 = precision == "bf16"
            # lean=False: the LOCs without their memory-lean custom Functions (same function, plain ops)
            modeling.LEAN_CUSTOM_FUNCTIONS = lean
            suffix = "" if lean else ", plain autograd"
            if how in ("inductor", "aot_eager"):
                torch._dynamo.reset()
                compiled = torch.compile(model, backend=how, fullgraph=True)
                report(f"{attention} {precision} torch.compile({how}){suffix}", compiled, bf16)
            elif how == "eager":
                report(f"{attention} {precision} eager{suffix}", model, bf16)
            else:
                report(f"{attention} {precision} eager, SDPA back end {how}", model, bf16, sdpa_backend=how)
    finally:
        modeling.LEAN_CUSTOM_FUNCTIONS = True
    return results


if __name__ == "__main__":
    main()
