"""Files that several models' checkpoints copy: one original in models/neural_interpreter/, real copies elsewhere.

A checkpoint's code must sit flat in one folder (transformers copies a modeling file and the files it imports
relatively), so every model folder holds its own copy of the shared files, as transformers' "Copied from" copies:
the first line names the original, and every byte below it is the original's. After editing an original, run
`python tests/test_model_copies.py --fix` to rewrite the copies.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

MODELS = Path(__file__).resolve().parents[1] / "src" / "ni_hf" / "models"
ORIGINALS = MODELS / "neural_interpreter"
COPIES = {
    "multitask_vit": ("configuration_checks", "modeling_checks", "panel_embedding", "task_heads"),
    "context_blind": ("configuration_checks", "modeling_checks", "panel_embedding", "task_heads"),
}


def marker(name: str) -> str:
    return f"# Copied from ni_hf.models.neural_interpreter.{name}: edit the original, not this copy\n"


def expected_copy(name: str) -> str:
    return marker(name) + (ORIGINALS / f"{name}.py").read_text()


@pytest.mark.parametrize(
    "folder, name", [(folder, name) for folder, names in COPIES.items() for name in names]
)
def test_every_copy_is_the_original_below_its_marker(folder, name):
    copy = MODELS / folder / f"{name}.py"
    assert copy.is_file() and not copy.is_symlink(), f"{copy} must be a real file (a copy), not a link"
    assert copy.read_text() == expected_copy(name), (
        f"{copy} differs from the original {ORIGINALS / name}.py: edit the original and run "
        "`python tests/test_model_copies.py --fix`"
    )


def test_no_other_file_claims_to_be_a_copy_and_no_original_is_one():
    listed = {MODELS / folder / f"{name}.py" for folder, names in COPIES.items() for name in names}
    claimed = {path for path in MODELS.rglob("*.py") if path.read_text().startswith("# Copied from")}
    assert claimed == listed
    for name in {name for names in COPIES.values() for name in names}:
        assert not (ORIGINALS / f"{name}.py").read_text().startswith("# Copied from")


def test_the_package_holds_no_symbolic_links():
    """Links break on Windows checkouts, and a linked module loads as two different classes."""
    root = MODELS.parents[2]
    listed = subprocess.run(
        ["git", "ls-files", "-s", "src"], cwd=root, capture_output=True, text=True, check=True
    ).stdout
    assert [line for line in listed.splitlines() if line.startswith("120000")] == []
    assert [path for path in (root / "src").rglob("*") if path.is_symlink()] == []


if __name__ == "__main__" and sys.argv[1:] == ["--fix"]:
    for folder, names in COPIES.items():
        for name in names:
            path = MODELS / folder / f"{name}.py"
            if path.is_symlink():
                path.unlink()
            path.write_text(expected_copy(name))
            print("wrote", path)
