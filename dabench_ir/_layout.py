"""The installed layout: the top-level folders passes/, lowering/, targets/ and models/ are the
subpackages ``dabench_ir.<folder>`` (pyproject.toml's package-dir), never bare packages."""

from __future__ import annotations

__all__ = ["installed_as"]


def installed_as(name: str, folder: str) -> None:
    """Refuse the folder ``folder`` imported as the bare top-level package ``name``: one file, one module."""
    if name != f"dabench_ir.{folder}":
        raise ImportError(f"import dabench_ir.{folder} instead of the bare top-level {name!r} package")
