"""Import a script of examples/ or benchmarks/ (neither is a package) as a module, for the tests."""

from __future__ import annotations

import importlib.util
import socket
import sys
from pathlib import Path
from types import ModuleType


def load_script(path: Path, name: str) -> ModuleType:
    """The script at ``path`` as module ``name``, registered in sys.modules (dataclasses look their module up
    while the file executes); a module already registered under ``name`` is returned as it is."""
    if name in sys.modules:
        return sys.modules[name]
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
