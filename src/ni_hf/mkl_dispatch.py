"""Whether PyTorch's MKL takes its slower code paths on this CPU (an AMD one), and what to run instead.

PyTorch's x86-64 Linux wheels link Intel's MKL for float32 matmuls. MKL picks its kernels by the CPU's instructions
only on Intel CPUs; on an AMD CPU it runs slower ones (2 cores of an AMD EPYC with AVX-512, 2026-11-28: 140 instead
of 215 GFLOP/s for one GEMM of the digits preset, and training steps of the model 1.6-2.1x and of the ViT baseline
1.8-2.0x as fast with `examples/with_mkl_on_amd.sh`, which preloads a library that answers MKL's vendor check with
yes; benchmarks/RESULTS.md). The example scripts log `slow_mkl_hint()` when it applies.
"""

from __future__ import annotations

import ctypes
import os
import platform
from pathlib import Path

import torch

WRAPPER = "examples/with_mkl_on_amd.sh"


def cpu_vendor() -> str | None:
    """The CPU's vendor id from /proc/cpuinfo ("AuthenticAMD", "GenuineIntel", ...), None where unknown."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def mkl_code_path() -> int | None:
    """MKL's code path for this CPU as torch's MKL reports it (`mkl_serv_cpu_detect`): 0 where it runs its generic
    kernels (what it does on AMD CPUs), higher for its instruction-set specific ones; None without MKL."""
    if platform.system() != "Linux" or not torch.backends.mkl.is_available():
        return None
    library = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    try:
        detect = ctypes.CDLL(str(library)).mkl_serv_cpu_detect
    except (OSError, AttributeError):
        return None
    detect.restype = ctypes.c_int
    return int(detect())


def slow_mkl_hint(vendor: str | None = None, code_path: int | None = None) -> str | None:
    """A hint to run under `examples/with_mkl_on_amd.sh` where MKL takes its generic path on an AMD CPU, else None."""
    vendor = cpu_vendor() if vendor is None else vendor
    if vendor != "AuthenticAMD":
        return None
    code_path = mkl_code_path() if code_path is None else code_path
    if code_path != 0:
        return None
    preloaded = os.environ.get("LD_PRELOAD", "")
    return (
        "PyTorch's MKL runs its generic float32 matmul kernels on this AMD CPU"
        + (f" (LD_PRELOAD={preloaded} did not change that)" if preloaded else "")
        + f". `bash {WRAPPER} python ...` makes it choose by the CPU's instructions: training steps were 1.6-2.1x as "
        "fast with it on an AMD EPYC with AVX-512, outputs the same to float rounding (README, Speed)."
    )
