"""examples/with_mkl_on_amd.sh and ni_hf.mkl_dispatch: MKL's code path on AMD CPUs, and the hint the scripts log."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ni_hf import mkl_dispatch
from ni_hf.mkl_dispatch import WRAPPER, mkl_code_path, slow_mkl_hint

REPO = Path(__file__).resolve().parents[1]
PRINT_CODE_PATH = (
    "from ni_hf.mkl_dispatch import mkl_code_path, slow_mkl_hint; print(mkl_code_path(), slow_mkl_hint())"
)


def _run(args: list[str], cache: Path, **env: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "NI_HF_CACHE": str(cache), **env}
    return subprocess.run(args, cwd=REPO, env=environment, capture_output=True, text=True, timeout=300)


def test_the_hint_names_the_wrapper_only_for_an_amd_cpu_on_mkls_generic_path(monkeypatch):
    assert WRAPPER in slow_mkl_hint("AuthenticAMD", 0)
    assert slow_mkl_hint("AuthenticAMD", 7) is None  # MKL already chose by the instructions
    assert slow_mkl_hint("GenuineIntel", 0) is None
    monkeypatch.setattr(mkl_dispatch, "mkl_code_path", lambda: None)  # torch without MKL (aarch64, macOS)
    assert slow_mkl_hint("AuthenticAMD") is None
    monkeypatch.setenv("LD_PRELOAD", "/somewhere/libother.so")
    assert "LD_PRELOAD=/somewhere/libother.so did not change that" in slow_mkl_hint("AuthenticAMD", 0)
    assert (REPO / WRAPPER).is_file()


@pytest.mark.skipif(mkl_code_path() is None, reason="torch without MKL")
@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_the_wrapper_makes_mkl_choose_its_kernels_by_the_cpus_instructions(tmp_path):
    plain = _run([sys.executable, "-c", PRINT_CODE_PATH], tmp_path)
    wrapped = _run(["bash", WRAPPER, sys.executable, "-c", PRINT_CODE_PATH], tmp_path)
    assert plain.returncode == 0 and wrapped.returncode == 0, plain.stderr + wrapped.stderr
    assert (tmp_path / "libmkl_intel_cpu_true.so").is_file()  # built once into the cache
    plain_path, plain_hint = plain.stdout.split(" ", 1)
    wrapped_path, wrapped_hint = wrapped.stdout.split(" ", 1)
    # On an Intel CPU both are MKL's instruction-set path; on an AMD one the plain run is 0 (generic).
    assert int(wrapped_path) > 0 and int(wrapped_path) >= int(plain_path)
    assert wrapped_hint.strip() == "None"
    if mkl_dispatch.cpu_vendor() == "AuthenticAMD":
        assert int(plain_path) == 0 and WRAPPER in plain_hint


def test_the_wrapper_says_what_it_needs(tmp_path):
    usage = _run(["bash", WRAPPER], tmp_path)
    assert usage.returncode == 2 and "usage" in usage.stderr
    no_compiler = _run(["bash", WRAPPER, "true"], tmp_path / "empty", CC="no-such-compiler")
    assert no_compiler.returncode == 1 and "needs a C compiler" in no_compiler.stderr
