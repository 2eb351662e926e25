#!/usr/bin/env python
"""Which piece of the "sdpa" LOCs inductor compiles wrongly on CUDA: SDPA alone, the attention, or the whole model.

    PYTHONPATH=src python benchmarks/diagnose_sdpa.py [--device cuda] [--skip-model] [--bisect]

benchmarks/diagnose_compile.py found (H200, torch 2.11, 2026-11-27) that the digits model's "sdpa" path compiled
by inductor departs from its float32 reference by O(1) on CUDA, in float32 too, while "eager" attention compiled
and "sdpa" under aot_eager agree. This script compiles the pieces alone, in float32 (TF32 off), at the model's
shapes (B 8, U x H = 5 x 4 heads, N 67, q/k head 128, value head 48 + 1), and prints each one's largest
difference from the same piece run eagerly on the same device, with the pattern-matcher rewrites inductor applied
(by handler name). Then the two-iteration digits model (tau 1.99): the "sdpa" path as built
(`EAGER_ATTENTION_WHEN_COMPILED_ON_ACCELERATOR = False`), as built with inductor's pattern matcher off, as built
with the explicit-matmul attention (the CPU path) on CUDA too, the model as shipped (the "eager" formulation
while compiling on an accelerator), and the "eager" model with the experiments of the benchmark's models (less
memory traffic; none is shipped for compiled GPU runs unless it compiles exactly on CUDA): `LineOfCode.columns_attention`
(Eq. 6 as A @ [C v, C] over the last column in plain ops), `LineOfCode.fused_attention` (Eq. 6 through SDPA's fused
kernels on keys and columns padded to 8, the division in plain ops; ni-fused), and `LineOfCode.bilinear_logits`
(q.k as (h A_uh) . h; ni-bilinear), alone and with the columns formulation (ni-bilinear-columns).

What it showed on the H200 (benchmarks/RESULTS.md, 2026-11-27): every piece alone compiles exactly; the model as
built is off by 1.26-1.66 with the pattern matcher on (also with the explicit-matmul attention, so not SDPA) and
exact with it off. `--bisect` then turns the GPU-only inductor features off one at a time (online softmax,
padding, the pattern rewrites that ran only on CUDA); `--inductor-off` and `--skip-pattern` do so by name.
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from diagnose_compile import build_model  # this folder is on the path when the script runs

import ni_hf.modeling_neural_interpreter as modeling

APPLIED: Counter[str] = Counter()  # pattern-matcher rewrites applied in the current compile, by handler name
SKIPPED: set[str] = set()  # handler names whose rewrites are skipped (`--skip-pattern`)


def _record_pattern_rewrites() -> None:
    """Count each pattern-matcher rewrite by its handler's name, and skip those named in SKIPPED."""
    import torch._inductor.pattern_matcher as pm

    for entry_class in (pm.GraphPatternEntry, pm.ReplacementPatternEntry, pm.LoweringPatternEntry):
        apply = entry_class.apply

        def recorded(self, match, graph, node, _apply=apply):
            handler = getattr(self, "handler", None)
            name = getattr(handler, "__name__", None) or type(self).__name__
            APPLIED[name] += 1
            return None if name in SKIPPED else _apply(self, match, graph, node)

        entry_class.apply = recorded


@contextmanager
def sdpa_as_built() -> Iterator[None]:
    """Compile the "sdpa" path as built, not the "eager" formulation the shipped model compiles on a GPU."""
    modeling.EAGER_ATTENTION_WHEN_COMPILED_ON_ACCELERATOR = False
    try:
        yield
    finally:
        modeling.EAGER_ATTENTION_WHEN_COMPILED_ON_ACCELERATOR = True


def compare(name: str, fn: Callable, *args: torch.Tensor, **inductor_config: object) -> float | None:
    """Print and return max |compiled(fn) - fn| over the outputs, with the pattern rewrites of that compile."""
    torch._dynamo.reset()
    APPLIED.clear()
    # No cached graphs: a cache hit would skip the passes whose rewrites this script records and skips.
    inductor_config = {"fx_graph_cache": False, **inductor_config}
    with torch.no_grad(), torch._functorch.config.patch(enable_autograd_cache=False):
        expected = fn(*args)
        try:
            with torch._inductor.config.patch(inductor_config):
                got = torch.compile(fn, backend="inductor", fullgraph=True)(*args)
        except Exception as error:
            print(
                f"{name:70s} failed: {type(error).__name__}: {str(error).splitlines()[0][:100]}", flush=True
            )
            return None
    diff = (got.float() - expected.float()).abs().max().item()
    print(f"{name:70s} max |diff| {diff:9.5f}  rewrites {dict(APPLIED)}", flush=True)
    return diff


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="Device to test.")
    p.add_argument("--skip-model", action="store_true", help="Only the pieces, not the whole model.")
    p.add_argument(
        "--inductor-off",
        default="",
        help="Comma-separated torch._inductor.config flags to turn off for the model rows, e.g. shape_padding.",
    )
    p.add_argument(
        "--skip-pattern",
        default="",
        help="Comma-separated pattern-matcher handler names (as the rewrites column prints them) to skip.",
    )
    p.add_argument(
        "--bisect",
        action="store_true",
        help="Then the model as built with each GPU-only inductor feature off in turn (about 10 compiles).",
    )
    args = p.parse_args(argv)
    device = torch.device(args.device)
    _record_pattern_rewrites()
    SKIPPED.update(name for name in args.skip_pattern.split(",") if name)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    print(f"torch {torch.__version__}, device {device}", flush=True)

    g = torch.Generator().manual_seed(0)
    b, u, h, n, dqk, dv = 8, 5, 4, 67, 128, 48

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(device)

    q, k, v = rand(b, u * h, n, dqk), rand(b, u * h, n, dqk), rand(b, u * h, n, dv + 1)
    mask = rand(u * h, n, n)
    scale = dqk**-0.5

    def sdpa(q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)

    def sdpa_default_scale(q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    def sdpa_nomask(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, scale=scale)

    def math_attention(q, k, v, mask):
        return torch.softmax(q @ k.transpose(-1, -2) * scale + mask, dim=-1) @ v

    compare("SDPA, 3-D mask, value head 49", sdpa, q, k, v, mask)
    compare("SDPA, 3-D mask, value head 49, pattern matcher off", sdpa, q, k, v, mask, pattern_matcher=False)
    compare("SDPA, 4-D mask materialised", sdpa, q, k, v, mask.expand(b, *mask.shape).contiguous())
    compare("SDPA, 3-D mask, default scale", sdpa_default_scale, q, k, v, mask)
    compare("SDPA, no mask", sdpa_nomask, q, k, v)
    compare("SDPA, 3-D mask, value head 48", sdpa, q, k, v[..., :dv].contiguous(), mask)
    compare("SDPA, 3-D mask, value head 128 (= q/k)", sdpa, q, k, rand(b, u * h, n, dqk), mask)
    compare("softmax(q k^T s + mask) @ v written out", math_attention, q, k, v, mask)
    compare("written out, pattern matcher off", math_attention, q, k, v, mask, pattern_matcher=False)

    q5, k5 = q.unflatten(1, (u, h)), k.unflatten(1, (u, h))
    v5 = rand(b, u, h, n, dv)
    c = torch.rand(u, b, n, generator=g).to(device)
    bias = rand(u, h, n, n)
    c_key = c.transpose(0, 1)[:, :, None, :, None]

    def kernel(q5, k5, v5, c, bias):
        return modeling.modulated_attention_sdpa_kernel(q5, k5, v5, c, bias, scale, 1e-4, 0.0)

    def matmul_attention(q5, k5, v5, c, bias):
        return modeling.modulated_attention_matmul(q5, k5, v5, c, bias, scale, 1e-4, 0.0)

    compare("modulated_attention_sdpa_kernel", kernel, q5, k5, v5, c, bias)
    compare(
        "modulated_attention_sdpa_kernel, pattern matcher off",
        kernel,
        q5,
        k5,
        v5,
        c,
        bias,
        pattern_matcher=False,
    )
    compare("modulated_attention_matmul", matmul_attention, q5, k5, v5, c, bias)
    compare("_compatibility_columns", modeling._compatibility_columns, v5, c_key)

    if args.skip_model:
        return
    flags_off = {flag: False for flag in args.inductor_off.split(",") if flag}
    model = build_model("sdpa").to(device)  # diagnose_compile.py's model
    pixels = rand(8, 3, 32, 32)

    def model_logits(pixels):
        return model(pixel_values=pixels).logits

    kernel_as_built = modeling.modulated_attention_sdpa_kernel
    with sdpa_as_built():
        suffix = f", inductor flags off: {sorted(flags_off)}" if flags_off else ""
        compare("model, sdpa as built" + suffix, model_logits, pixels, **flags_off)
        compare("model, sdpa as built, pattern matcher off", model_logits, pixels, pattern_matcher=False)
        modeling.modulated_attention_sdpa_kernel = modeling.modulated_attention_matmul
        try:
            compare(
                "model, sdpa as built, explicit-matmul attention" + suffix, model_logits, pixels, **flags_off
            )
        finally:
            modeling.modulated_attention_sdpa_kernel = kernel_as_built
    compare("model, sdpa as shipped", model_logits, pixels)
    # Eq. 6 as A @ [C v, C] in plain ops in place of the shipped eager formulation: 6% less memory traffic per
    # training step (memory_traffic.py --attention columns), worth shipping only if it compiles exactly here.
    # (The model is set to "eager" so that the CPU, which compiles "sdpa" as built, runs this row too.)
    model.config._attn_implementation = "eager"
    modeling.set_columns_attention(model)
    try:
        compare("model, eager with the columns formulation", model_logits, pixels)
    finally:
        modeling.set_columns_attention(model, False)
        model.config._attn_implementation = "sdpa"
    # SDPA's fused kernels on padded keys and columns in the eager model (no custom Function around the attention):
    # the N x N weights never reach memory, if it compiles exactly here.
    model.config._attn_implementation = "eager"
    modeling.set_fused_attention(model)
    try:
        compare("model, eager with the fused formulation (SDPA, padded)", model_logits, pixels)
    finally:
        modeling.set_fused_attention(model, False)
        model.config._attn_implementation = "sdpa"
    # The eager model with its logits in the bilinear form (fewer FLOPs and bytes than the q and k projections),
    # alone and with the columns formulation (memory_traffic.py: 10% and 17% fewer bytes than as shipped).
    model.config._attn_implementation = "eager"
    modeling.set_bilinear_logits(model)
    try:
        compare("model, eager with bilinear logits", model_logits, pixels)
        modeling.set_columns_attention(model)
        compare("model, eager with bilinear logits and the columns formulation", model_logits, pixels)
    finally:
        modeling.set_bilinear_logits(model, False)
        modeling.set_columns_attention(model, False)
        model.config._attn_implementation = "sdpa"
    if not args.bisect:
        return
    # The model as built with one GPU-only inductor feature off at a time: the one whose absence makes it exact
    # is the culprit. Config flags first, then single pattern rewrites (seen on the H200, not on the CPU).
    with sdpa_as_built():
        for flag in ("online_softmax", "comprehensive_padding", "shape_padding"):
            compare(f"model, sdpa as built, {flag} off", model_logits, pixels, **{flag: False})
        for pattern in (
            "unfuse_bias_add_to_pointwise",
            "ReplacementPatternEntry",
            "bmm_to_mm",
            "fix_iota_device",
        ):
            SKIPPED.add(pattern)
            compare(f"model, sdpa as built, {pattern} skipped", model_logits, pixels)
            SKIPPED.discard(pattern)


if __name__ == "__main__":
    main()
