#!/usr/bin/env bash
# Run a command with PyTorch's MKL choosing its kernels by the CPU's instructions on an AMD CPU too.
#
#   bash examples/with_mkl_on_amd.sh python examples/run_digits.py ...
#
# PyTorch's x86-64 Linux wheels link Intel's MKL for float32 matmuls. MKL asks whether the CPU is Intel's and, on an
# AMD CPU, runs them on slower code paths than the CPU's own instructions allow (on 2 cores of an AMD EPYC with
# AVX-512: 140 instead of 215 GFLOP/s for one GEMM of the digits preset, training steps 1.6-2.1x as fast; README,
# "Speed"). This builds a one-line library that answers that question with yes (once, with the C compiler `cc`,
# into ${NI_HF_CACHE:-~/.cache/ni_hf}) and preloads it, so MKL dispatches on the CPU's features as on an Intel CPU.
# Results are the same to float rounding. It changes nothing where torch has no MKL (aarch64, macOS) or the CPU is
# Intel's.
set -euo pipefail
if [ $# -eq 0 ]; then
  echo "usage: bash $0 COMMAND [ARG...]   (runs COMMAND with the library preloaded)" >&2
  exit 2
fi
cache="${NI_HF_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ni_hf}"
lib="$cache/libmkl_intel_cpu_true.so"
if [ ! -f "$lib" ]; then
  cc="${CC:-cc}"
  if ! command -v "$cc" > /dev/null; then
    echo "$0: needs a C compiler to build $lib once ('$cc' not found; set CC)" >&2
    exit 1
  fi
  mkdir -p "$cache"
  printf 'int mkl_serv_intel_cpu_true(void) { return 1; }\n' | "$cc" -x c -shared -fPIC -O2 -o "$lib.tmp$$" -
  mv "$lib.tmp$$" "$lib"
fi
export LD_PRELOAD="$lib${LD_PRELOAD:+:$LD_PRELOAD}"
exec "$@"
