"""Whether this CPU multiplies bfloat16 natively, and the hint the digits scripts log when a float32 run could use it.

CPUs with AVX512_BF16 (AMD Zen 4 and later, Intel Cooper Lake) or AMX (Intel Sapphire Rapids and later) run bf16
matmuls through oneDNN at about twice the float32 rate. Under bf16 autocast (`--bf16 true --use_cpu true` in the
Trainer scripts; weights, gradients and the optimizer stay float32) a training step of the digits preset at batch 128
was 2.3-2.6x as fast on 2 cores of an AMD EPYC with AVX512_BF16 (2026-11-28, benchmarks/RESULTS.md, "bf16 autocast
on CPUs that multiply bf16 natively"), the ViT baseline's 1.3x.
"""

from __future__ import annotations

import torch

# What the hint measured; README, Speed, and RESULTS.md give the runs.
BF16_HINT = (
    "This CPU multiplies bfloat16 natively ({features}): `--bf16 true --use_cpu true` (autocast; weights, gradients "
    "and optimizer stay float32) trained the digits preset 2.4x as fast through the Trainer on 2 cores of an AMD "
    "EPYC with AVX512_BF16 (README, Speed)."
)


def native_bf16_features() -> list[str]:
    """The instruction sets of this CPU that multiply bf16 natively, as torch detects them (empty where none)."""
    checks = {"AVX512_BF16": "_is_avx512_bf16_supported", "AMX": "_is_amx_tile_supported"}
    found = []
    for name, check in checks.items():
        try:
            if getattr(torch.cpu, check)():
                found.append(name)
        except (AttributeError, RuntimeError):  # older torch, or another architecture
            continue
    return found


def native_bf16_hint(bf16: bool, features: list[str] | None = None) -> str | None:
    """The hint to train with bf16 autocast, for a float32 CPU run on a CPU with native bf16; else None."""
    features = native_bf16_features() if features is None else features
    if bf16 or not features:
        return None
    return BF16_HINT.format(features=", ".join(features))
