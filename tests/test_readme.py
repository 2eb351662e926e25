"""The README's Quickstart code runs as printed (offline, in a fresh directory and process)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks(section: str) -> list[str]:
    """The ```python blocks of one `## section` of the README."""
    text = README.read_text()
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return [block.split("```", 1)[0] for block in body.split("```python\n")[1:]]


def test_readme_quickstart_code_runs_as_printed(tmp_path: Path) -> None:
    (code,) = python_blocks("Quickstart")
    check = (
        "\nassert out.logits.shape == (2, 10) and torch.isfinite(out.loss)"
        "\nprint('QUICKSTART_OK', [round(p['score'], 4) >= 0 for p in"
        " pipeline('image-classification', model='ckpt', trust_remote_code=True)(images[0])])"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules")}
    proc = subprocess.run(
        [sys.executable, "-c", code + check],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "QUICKSTART_OK" in proc.stdout
    assert (tmp_path / "ckpt" / "model.safetensors").is_file()
    assert (tmp_path / "ckpt" / "modeling_neural_interpreter.py").is_file()
