"""The package list, discovered rather than listed, so a new package cannot be left out: every folder
under dabench_ir/, and under each top-level folder that pyproject.toml's package-dir maps to
``dabench_ir.<folder>``. All other metadata is pyproject.toml's."""

import tomllib
from pathlib import Path

from setuptools import find_namespace_packages, setup

_ROOT = Path(__file__).parent
_PACKAGE_DIR = tomllib.loads((_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]


def _packages() -> list[str]:
    found = []
    for name, folder in {"dabench_ir": "dabench_ir", **_PACKAGE_DIR}.items():
        subpackages = find_namespace_packages(where=str(_ROOT / folder), exclude=["*__pycache__*"])
        found += [name, *(f"{name}.{sub}" for sub in subpackages)]
    return sorted(found)


setup(packages=_packages())
