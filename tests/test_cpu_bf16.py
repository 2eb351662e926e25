"""ni_hf.cpu_bf16: whether the CPU multiplies bf16 natively, and the hint the digits scripts log for float32 runs."""

from __future__ import annotations

import contextlib

import pytest
import torch

from ni_hf.cpu_bf16 import native_bf16_features, native_bf16_hint


def test_the_hint_names_the_trainer_flags_only_for_a_float32_run_on_a_cpu_with_native_bf16():
    hint = native_bf16_hint(False, ["AVX512_BF16", "AMX"])
    assert "--bf16 true --use_cpu true" in hint and "(AVX512_BF16, AMX)" in hint
    assert native_bf16_hint(True, ["AVX512_BF16"]) is None  # already on
    assert native_bf16_hint(False, []) is None  # no native bf16: autocast would emulate it


@pytest.mark.parametrize(
    ("avx512_bf16", "amx", "expected"),
    [
        (True, False, ["AVX512_BF16"]),
        (False, True, ["AMX"]),
        (True, True, ["AVX512_BF16", "AMX"]),
        (False, False, []),
    ],
)
def test_native_bf16_features_reads_torchs_cpu_checks(monkeypatch, avx512_bf16, amx, expected):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
    assert native_bf16_features() == expected


def test_native_bf16_features_is_empty_where_torch_has_no_such_checks(monkeypatch):
    for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        with contextlib.suppress(AttributeError):
            monkeypatch.delattr(torch.cpu, name)
    assert native_bf16_features() == []
