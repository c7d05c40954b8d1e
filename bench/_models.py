"""The bench scripts' models: decoders exported once with the CLI and cached under bench/_cache/
(the one place the scripts export, so every script measures the same files)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

__all__ = ["CACHE", "exported", "llama_model", "profile_model"]

CACHE = Path(__file__).resolve().parent / "_cache"


def exported(name: str, *flags: str) -> Path:
    """``bench/_cache/<name>``, exported with ``dabench-ir export <flags>`` when absent."""
    CACHE.mkdir(exist_ok=True)
    model = CACHE / name
    if not model.exists():
        print(f"exporting {model.name} ...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "dabench_ir", "export", *flags, "-o", str(model)], check=True)
    return model


def llama_model(name: str, **flags: object) -> Path:
    """``bench/_cache/<name>``, exported with ``dabench-ir export --family llama --FLAG VALUE ...`` when
    absent (``layers=32`` gives ``--layers 32``)."""
    return exported(name, "--family", "llama", *(str(a) for k, v in flags.items() for a in (f"--{k}", v)))


def profile_model(layers: int, hidden: int) -> Path:
    """The model the whole-process `profile` benchmarks time (profile_speed.py, mlir_speed.py
    --profile-process): a weight-free LLaMA of ``layers`` blocks of width ``hidden``, seq 2048, batch 1."""
    return llama_model(
        f"llama_L{layers}_h{hidden}.onnx", layers=layers, hidden=hidden, seq=2048, batch=1, weights="none"
    )
