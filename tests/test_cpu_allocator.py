"""Tests of ni_hf.cpu_allocator: with glibc told to keep freed memory, repeated large allocations stop faulting."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ni_hf import cpu_allocator

REPO = Path(__file__).resolve().parents[1]

# Allocate and free tensors above glibc's largest mmap threshold (32 MiB) six times, as a training step does with
# its activations, and count the minor page faults of each round (ten rounds). Run in a fresh process: the setting is global.
PROBE = """
import json, resource, sys, torch
from ni_hf.cpu_allocator import keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "keep" else None
faults = []
for _ in range(10):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    a, b = torch.ones(16 * 2**20), torch.ones(9 * 2**20)
    c = a[: 9 * 2**20] + b
    del a, b, c
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"applied": applied, "faults": faults}))
"""


def _probe(mode: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "src"), env.get("PYTHONPATH", "")) if p)
    for name in ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES"):
        env.pop(name, None)
    result = subprocess.run(
        [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, env=env, check=False, cwd=REPO
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(cpu_allocator._glibc() is None, reason="needs glibc on Linux")
def test_kept_freed_memory_is_reused_without_page_faults():
    """Default glibc maps the 136 MiB of each round afresh (~34,800 pages); once told to keep freed memory, the
    process reuses it: after a few rounds of settling (a round may still fault one 36 MiB block), little or none."""
    default, kept = _probe("default"), _probe("keep")
    assert kept["applied"] is True
    assert min(default["faults"][2:]) > 20_000
    assert sum(kept["faults"][4:]) < 0.25 * sum(default["faults"][4:])
    assert kept["faults"][4:].count(0) >= 3


def test_keep_freed_memory_does_nothing_without_glibc(monkeypatch):
    monkeypatch.setattr(cpu_allocator, "_glibc", lambda: None)
    assert cpu_allocator.keep_freed_memory() is False
