"""pyproject.toml's promises against what is installed: the Python versions it admits."""

from __future__ import annotations

import os
import tomllib
from importlib.metadata import PackageNotFoundError, metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

PYPROJECT = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())


def oldest_admitted_python(requires_python: str) -> str:
    """The lowest version a `>=X.Y` requires-python admits."""
    floors = [spec.version for spec in SpecifierSet(requires_python) if spec.operator == ">="]
    assert floors, f"requires-python {requires_python!r} names no lower bound"
    return max(floors, key=lambda v: tuple(int(x) for x in v.split(".")))


def test_requires_python_admits_no_python_that_an_installed_dependency_refuses() -> None:
    """On the oldest Python we admit, pip must find every dependency: otherwise the install fails with an error
    about the dependency, not about Python (as it did on 3.10 with transformers 5.21, which needs 3.11).

    Checked for the dependencies we give a lower bound (unbounded ones, numpy or pillow, pip can take older releases
    of on an older Python). A failure asks: does the lowest release we accept still run on our oldest Python?
    If not, raise requires-python or that bound."""
    oldest = oldest_admitted_python(PYPROJECT["project"]["requires-python"])
    refused = {}
    for line in PYPROJECT["project"]["dependencies"]:
        requirement = Requirement(line)
        if not any(spec.operator == ">=" for spec in requirement.specifier):
            continue
        try:
            theirs = metadata(requirement.name).get("Requires-Python")
        except PackageNotFoundError:
            continue
        if theirs and oldest not in SpecifierSet(theirs):
            refused[requirement.name] = theirs
    assert not refused, (
        f"requires-python admits Python {oldest}, which these installed dependencies refuse: {refused}"
    )


def test_the_built_wheel_holds_everything_the_package_reads_at_run_time(tmp_path: Path) -> None:
    """Build the wheel, install it alone into a folder, and run the README's quickstart code and a model card from
    there, in a process that cannot see the repository: the model files of every folder, the ViT's shared input
    checks, the card templates and the metric module must all be in the wheel."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    wheels, site = tmp_path / "wheels", tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", wheels, repo],
        check=True,
        capture_output=True,
    )
    (wheel,) = wheels.glob("ni_hf-*.whl")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", site, wheel],
        check=True,
        capture_output=True,
    )
    readme = (repo / "README.md").read_text()
    quickstart = readme.split("\n## Quickstart\n", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    check = """
import ni_hf.training.model_cards as cards
from ni_hf import MultiTaskViTConfig, MultiTaskViTForImageClassification
from ni_hf.training.evaluation import load_multitask_accuracy
assert ni_hf.__file__.startswith(SITE), ni_hf.__file__
assert cards.DEFAULT_DIGITS_TEMPLATE.is_file() and cards.DEFAULT_FUZZY_BOOLEAN_TEMPLATE.is_file()
task = cards.digits_task_info("sklearn_digits", "sklearn", None, 1437, 360, {"eval_sklearn_digits/accuracy": 0.9})
card = cards.build_digits_model_card(model_name="wheel-test", tasks=[task], config=config, config_summary={}, hyperparameters={})
assert "# wheel-test" in str(card) and "1437" in str(card), str(card)[:2000]
vit = MultiTaskViTForImageClassification(MultiTaskViTConfig(hidden_size=8, num_hidden_layers=1,
    num_attention_heads=2, intermediate_size=8, image_size=8, patch_size=4))
vit.save_pretrained("vit")
import os; assert all(os.path.isfile(f"vit/{name}.py") and not os.path.islink(f"vit/{name}.py") for name in ("configuration_checks", "modeling_checks", "panel_embedding", "task_heads"))
load_multitask_accuracy()
print("WHEEL_OK")
"""
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(site),
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "hf"),
        "HF_MODULES_CACHE": str(tmp_path / "modules"),
    }
    proc = subprocess.run(
        [sys.executable, "-c", f"SITE = {str(site)!r}\n" + quickstart + check],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "WHEEL_OK" in proc.stdout
