"""The demo's model when it is given none: README command 1's run, `examples/run_digits.py --preset quickstart`.

    OMP_NUM_THREADS=1 python examples/run_digits.py --preset quickstart --output_dir runs/quickstart

The preset (`ni_hf.training.presets.DIGITS_PRESETS["quickstart"]`) is the whole recipe: a 78k-parameter Neural
Interpreter (4 functions, 3 function iterations, no dropout) on scikit-learn's 8x8 digits, 30 epochs with RAdam and
RandAugment; a few minutes on 2 CPU cores. Used by the demo and by examples/make_readme_figure.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUN_DIGITS = ROOT / "examples" / "run_digits.py"
QUICKSTART_OUTPUT_DIR = ROOT / "runs" / "quickstart"  # README command 1's --output_dir


def quickstart_command(output_dir: str | Path, extra_args: Sequence[str] = ()) -> list[str]:
    """README command 1 with ``output_dir`` (and ``extra_args`` after it, which win over the preset)."""
    return [
        sys.executable,
        str(RUN_DIGITS),
        "--preset",
        "quickstart",
        "--output_dir",
        str(output_dir),
        *extra_args,
    ]


def train_quickstart_model(output_dir: str | Path, extra_args: Sequence[str] = ()) -> dict[str, float]:
    """Run README command 1 into ``output_dir``, its log on this terminal; return test accuracy and training time."""
    if not RUN_DIGITS.is_file():
        raise FileNotFoundError(
            f"{RUN_DIGITS} is not here (a copy of demo/ alone, as in a Space), and it trains the demo's model: pass "
            "a trained checkpoint with --model or NI_DEMO_MODEL."
        )
    env = {"OMP_NUM_THREADS": "1", **os.environ}  # README command 1's setting, unless the caller chose one
    src = str(ROOT / "src")  # a checkout without `pip install -e .`
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))
    command = quickstart_command(Path(output_dir).absolute(), extra_args)
    completed = subprocess.run(command, env=env)
    if completed.returncode != 0:
        raise RuntimeError(
            f"Training the quickstart model failed (exit status {completed.returncode}): {command}"
        )
    results = json.loads((Path(output_dir) / "all_results.json").read_text())
    return {"test_accuracy": results["eval_accuracy"], "train_seconds": results["train_runtime"]}


if __name__ == "__main__":
    train_quickstart_model(sys.argv[1] if len(sys.argv) > 1 else QUICKSTART_OUTPUT_DIR)
