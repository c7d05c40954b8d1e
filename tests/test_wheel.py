"""The built wheel holds the whole package: every module, subpackage and data file of the source
tree (an editable install never shows one left out: ``dabench_ir.study`` once was), and the build
says no warning. Builds sdist and wheel (the wheel from the sdist, as `python -m build` does);
installing and running it is scripts/wheel_smoke.sh's job in CI."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # the development lane (-m "not slow") leaves it out

ROOT = Path(__file__).resolve().parents[1]


def _source_files() -> dict[str, Path]:
    """What the wheel must hold: each file of the package folders, by its path in the wheel."""
    mapped = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    folders = {"dabench_ir": "dabench_ir", **mapped}
    files = {}
    for name, folder in folders.items():
        for path in (ROOT / folder).rglob("*"):
            rel = path.relative_to(ROOT / folder)
            if path.is_file() and "__pycache__" not in rel.parts and path.suffix != ".pyc":
                files["/".join((*name.split("."), *rel.parts))] = path
    return files


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, str]:
    pytest.importorskip("build", reason="the `build` package (in the test extra) builds the wheel")
    # a copy without the checkout's build state: a stale *.egg-info/SOURCES.txt would add files the
    # configuration leaves out
    tree = tmp_path_factory.mktemp("tree") / "src"
    shutil.copytree(
        ROOT,
        tree,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", "*.egg-info", "build", "dist", "__pycache__", "*_cache", "dabench-report"
        ),
    )
    out = tmp_path_factory.mktemp("dist")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}  # else distutils says so
    done = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(tree)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (wheel,) = out.glob("*.whl")
    return wheel, done.stdout + done.stderr


def test_the_wheel_holds_every_package_and_data_file(built):
    wheel, _ = built
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(set(_source_files()) - names)
    assert not missing, f"{wheel.name} leaves out {len(missing)} file(s), first: {missing[:8]}"
    assert {
        "dabench_ir/study/__init__.py",
        "dabench_ir/lowering/wse/__init__.py",
        "dabench_ir/data/sweeps/smoke.toml",
        "dabench_ir/targets/h100.toml",
    } <= names
    assert not any(n.split("/")[0] in {"passes", "lowering", "targets", "models", "tests"} for n in names)


def test_the_build_is_warning_free(built):
    _, log = built
    warnings = [line for line in log.splitlines() if re.search(r"warn", line, re.IGNORECASE)]
    assert not warnings, "the build warns:\n" + "\n".join(warnings[:10])
