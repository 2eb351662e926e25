#!/usr/bin/env python
"""Which execution departs from the float32 reference: eager or compiled, SDPA or explicit matmuls, bf16 or not.

    PYTHONPATH=src python benchmarks/diagnose_compile.py [--device cuda] [--skip-compile]

Builds the model of tests/test_compile.py (the digits preset with two function iterations and tau = 1.99, so no
(function, token) pair sits near the truncation threshold), computes its logits for 8 fixed random images on the
CPU in float32 (the reference), then in every execution below on --device, and prints each one's largest absolute
difference from the reference. An execution that agrees with the reference to bf16 rounding (about 1e-2 here)
is right; one that is off by O(1) computes another function. On CUDA the "sdpa" rows are repeated with each of
PyTorch's SDPA back ends forced (math, efficient, flash, cudnn; a back end that refuses these shapes says so).
The "sdpa" rows compile that path as built (`EAGER_ATTENTION_WHEN_COMPILED_ON_ACCELERATOR = False`); the rows
"as shipped" compile the model as users get it, which on an accelerator runs the "eager" formulation instead.
Rows marked "plain autograd" run the LOCs without their memory-lean custom autograd Functions
(`LEAN_CUSTOM_FUNCTIONS = False`: the same function through plain ops), to tell a compiler's handling of those
Functions apart from the rest. On CUDA the last rows call SDPA in two other layouts that compute the same
function (`SDPA_CALLS`): the positional bias materialised per sample (no stride-0 batch dimension), and the key
length (67) and value head (48 + 1) padded to multiples of 8, the padded keys masked with -inf. Both are candidate
workarounds: CUDA's fused SDPA back ends and inductor's lowering treat unaligned or broadcast operands specially
(inductor pads the bias of the efficient kernel to alignment on CUDA only). `--runs` picks executions by name.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F

import ni_hf.modeling_neural_interpreter as modeling
from ni_hf import NeuralInterpreterConfig, NeuralInterpreterForImageClassification

_SDPA = F.scaled_dot_product_attention


def sdpa_mask_materialised(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    **kwargs: object,
) -> torch.Tensor:
    """SDPA with the bias expanded to (B, heads, N, N) and made contiguous: no stride-0 batch dimension."""
    if attn_mask is not None:
        attn_mask = attn_mask.expand(query.shape[0], *attn_mask.shape[-3:]).contiguous()
    return _SDPA(query, key, value, attn_mask=attn_mask, **kwargs)


def sdpa_padded_to_8(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    **kwargs: object,
) -> torch.Tensor:
    """SDPA with the key length and the value head padded to multiples of 8; padded keys get -inf, columns are cut."""
    n, dv = key.shape[-2], value.shape[-1]
    pad_keys, pad_columns = -n % 8, -dv % 8
    key = F.pad(key, (0, 0, 0, pad_keys))
    value = F.pad(value, (0, pad_columns, 0, pad_keys))
    if attn_mask is None:
        attn_mask = query.new_zeros(query.shape[-2], n)
    attn_mask = F.pad(attn_mask, (0, pad_keys), value=float("-inf"))
    return _SDPA(query, key, value, attn_mask=attn_mask, **kwargs)[..., :dv]


SDPA_CALLS: dict[str, Callable | None] = {
    "as built": None,
    "mask materialised": sdpa_mask_materialised,
    "padded to multiples of 8": sdpa_padded_to_8,
}


@contextmanager
def sdpa_call(name: str) -> Iterator[None]:
    """Route every F.scaled_dot_product_attention call (the model's included) through SDPA_CALLS[name]."""
    replacement = SDPA_CALLS[name]
    if replacement is not None:
        F.scaled_dot_product_attention = replacement
    try:
        yield
    finally:
        F.scaled_dot_product_attention = _SDPA


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
    p.add_argument(
        "--runs",
        default="",
        help="Comma-separated name fragments: run only the executions whose name has one.",
    )
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
            print(f"{name:82s} max |diff| {diff:9.5f}   ({time.perf_counter() - start:5.1f} s)", flush=True)
        except Exception as error:  # a back end that refuses the shapes, or a compile failure: say so, go on
            print(
                f"{name:82s} failed: {type(error).__name__}: {str(error).splitlines()[0][:120]}", flush=True
            )

    # (attention, precision, how: "eager", an SDPA back end or a compiler backend, lean custom Functions or plain,
    # the SDPA call of SDPA_CALLS)
    runs: list[tuple[str, str, str, bool, str]] = []
    for attention in ("sdpa", "eager"):
        for precision in ("fp32", "bf16"):
            runs.append((attention, precision, "eager", True, "as built"))
    if device.type == "cuda":
        for backend in ("MATH", "EFFICIENT_ATTENTION", "FLASH_ATTENTION", "CUDNN_ATTENTION"):
            runs.append(("sdpa", "bf16", backend, True, "as built"))
    runs.append(("sdpa", "bf16", "eager", False, "as built"))
    if not args.skip_compile:  # most telling first: a run that hits the time limit loses the least
        runs += [
            ("sdpa", "bf16", "inductor", True, "as built"),
            ("sdpa", "bf16", "inductor", False, "as built"),
        ]
        runs += [
            ("eager", "bf16", "inductor", True, "as built"),
            ("sdpa", "bf16", "aot_eager", True, "as built"),
        ]
        runs.append(("sdpa", "fp32", "inductor", True, "as built"))
    if device.type == "cuda":  # the candidate workarounds (on the CPU "sdpa" does not call SDPA)
        for call in list(SDPA_CALLS)[1:]:
            runs.append(("sdpa", "bf16", "eager", True, call))
            runs.append(("sdpa", "bf16", "EFFICIENT_ATTENTION", True, call))
            if not args.skip_compile:
                runs.append(("sdpa", "bf16", "inductor", True, call))
    wanted = [fragment for fragment in args.runs.split(",") if fragment]
    # The rows above compile the "sdpa" path as built; the model as shipped runs "eager" there (see below).
    modeling.EAGER_ATTENTION_WHEN_COMPILED_ON_ACCELERATOR = False
    try:
        for attention, precision, how, lean, call in runs:
            if how in ("inductor", "aot_eager"):
                name = f"{attention} {precision} torch.compile({how})"
            elif how == "eager":
                name = f"{attention} {precision} eager"
            else:
                name = f"{attention} {precision} eager, SDPA back end {how}"
            name += ("" if lean else ", plain autograd") + ("" if call == "as built" else f", SDPA {call}")
            if wanted and not any(fragment in name for fragment in wanted):
                continue
            model = build_model(attention).to(device)
            # lean=False: the LOCs without their memory-lean custom Functions (same function, plain ops)
            modeling.LEAN_CUSTOM_FUNCTIONS = lean
            with sdpa_call(call):
                if how in ("inductor", "aot_eager"):
                    torch._dynamo.reset()
                    report(name, torch.compile(model, backend=how, fullgraph=True), precision == "bf16")
                elif how == "eager":
                    report(name, model, precision == "bf16")
                else:
                    report(name, model, precision == "bf16", sdpa_backend=how)
        # As shipped: on an accelerator, "sdpa" compiled runs the "eager" formulation of Eq. 6.
        modeling.EAGER_ATTENTION_WHEN_COMPILED_ON_ACCELERATOR = True
        for precision in ("bf16", "fp32"):
            name = f"sdpa {precision} torch.compile(inductor), as shipped"
            if args.skip_compile or (wanted and not any(fragment in name for fragment in wanted)):
                continue
            torch._dynamo.reset()
            compiled = torch.compile(build_model("sdpa").to(device), backend="inductor", fullgraph=True)
            report(name, compiled, precision == "bf16")
    finally:
        modeling.LEAN_CUSTOM_FUNCTIONS = True
        modeling.EAGER_ATTENTION_WHEN_COMPILED_ON_ACCELERATOR = True
    return results


if __name__ == "__main__":
    main()
