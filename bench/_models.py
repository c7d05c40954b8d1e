"""The bench scripts' models: decoders exported once with the CLI and cached under bench/_cache/
(the one place the scripts export, so every script measures the same files)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

__all__ = ["CACHE", "exported", "llama_model"]

CACHE = Path(__file__).resolve().parent / "_cache"


def exported(name: str, *flags: str) -> Path:
    """``bench/_cache/<name>``, exported with ``dabench-ir export <flags>`` when absent."""
    CACHE.mkdir(exist_ok=True)
    model = CACHE / name
    if not model.exists():
        print(f"exporting {model.name} ...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "dabench_ir", "export", *flags, "-o", str(model)], check=True)
    return model


def llama_model(name: str, *flags: str) -> Path:
    """``bench/_cache/<name>``, exported with ``dabench-ir export --family llama <flags>`` when absent."""
    return exported(name, "--family", "llama", *flags)
