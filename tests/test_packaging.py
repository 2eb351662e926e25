"""pyproject.toml's promises against what is installed: the Python versions it admits."""

from __future__ import annotations

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
