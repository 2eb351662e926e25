"""Import a script of examples/ or benchmarks/ (neither is a package) as a module, for the tests."""

from __future__ import annotations

import importlib.util
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import pytest


def load_script(path: Path, name: str) -> ModuleType:
    """The script at ``path`` as module ``name``, registered in sys.modules (dataclasses look their module up
    while the file executes); a module already registered under ``name`` is returned as it is."""
    if name in sys.modules:
        return sys.modules[name]
    if str(path.parent) not in sys.path:  # a script imports its neighbours as a script would
        sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def torchrun_command(script: Path, *args: str, nproc: int = 2) -> list[str]:
    """``python -m torch.distributed.run`` of ``script`` with ``args`` on ``nproc`` local processes, on a free port."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc)]
    return [*launcher, "--master_addr", "127.0.0.1", "--master_port", str(port), str(script), *args]


def run_with_forkserver(script: Path, args: list[str], tmp_path: Path) -> str:
    """Run ``script`` in a Python whose processes start others by forkserver, Python 3.14's default on Linux
    (macOS and Windows spawn; a sitecustomize sets it); assert it ran so and succeeded, return its output."""
    site = tmp_path / "forkserver_site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import multiprocessing, sys\n"
        "multiprocessing.set_start_method('forkserver', force=True)\n"
        "print('start method:', multiprocessing.get_start_method(), file=sys.stderr)\n"
    )
    src = Path(__file__).resolve().parents[1] / "src"
    path = os.pathsep.join([str(site), str(src), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf_home")}
    command = [sys.executable, str(script), *args]
    proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    log = proc.stdout + proc.stderr
    assert "start method: forkserver" in proc.stderr, log[-4000:]
    assert proc.returncode == 0, log[-4000:]
    return log


@contextmanager
def refused(match: str) -> Iterator[None]:
    """A script's refusal of its command line or data: its ValueError (raised, or the cause of argparse's exit with
    status 2), whose message matches ``match``."""
    with pytest.raises((ValueError, SystemExit)) as raised:
        yield
    error = raised.value
    if isinstance(error, SystemExit):
        assert error.code == 2, f"exit status {error.code}"
        error = error.__cause__
    assert isinstance(error, ValueError), repr(error)
    assert re.search(match, str(error)), f"{match!r} not in {error}"


@contextmanager
def one_thread() -> Iterator[None]:
    """Tiny models run fastest on one thread, and a shared machine makes two threads very slow."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
