"""MLIR export of decoder models through torch-mlir's fx importer.

`torch_mlir.fx.export_and_import(module, *args, output_type="torch" | "linalg-on-tensors")`
imports the whole stack (no stamping: the fx trace of a meta module is cheap enough).
With `weights="none"` the module's parameters are passed as function arguments (one
`%arg` per weight, shape-only), so the file holds no weight data; with "random" they are
frozen into the module as dense resources. The file starts with `// dabench.*:` comment
lines carrying the same metadata as the ONNX export (family, preset, params, weights).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from dabench_ir.models.config import ModelConfig

if TYPE_CHECKING:
    import torch
    from torch import nn

    from dabench_ir.models.export import ExportOptions

__all__ = ["export_mlir", "mlir_text"]

logger = logging.getLogger(__name__)

_OUTPUT_TYPES = {"torch": "torch", "linalg": "linalg-on-tensors"}


def _params_as_inputs(model: nn.Module) -> tuple[nn.Module, list[str], list[torch.Tensor]]:
    """A wrapper whose forward takes (x, *weights) and a list of the weight names and tensors.

    Parameters are removed from their modules and set back as plain tensor attributes at the
    start of each call, so a trace sees them as user inputs (tied weights stay tied).
    """
    from torch import nn

    slots: dict[str, list[tuple[nn.Module, str]]] = {}
    tensors: dict[str, torch.Tensor] = {}
    canonical: dict[int, str] = {}
    for mod_name, module in model.named_modules():
        for pname, param in list(module._parameters.items()):
            if param is None:
                continue
            full = f"{mod_name}.{pname}" if mod_name else pname
            key = canonical.setdefault(id(param), full)
            slots.setdefault(key, []).append((module, pname))
            tensors.setdefault(key, param.detach())
    for places in slots.values():
        for module, pname in places:
            del module._parameters[pname]
    names = list(slots)

    class _Wrapper(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, x: torch.Tensor, *weights: torch.Tensor) -> torch.Tensor:
            for name, value in zip(names, weights, strict=True):
                for module, pname in slots[name]:
                    setattr(module, pname, value)
            return self.inner(x)

    return _Wrapper(), names, [tensors[n] for n in names]


def mlir_text(cfg: ModelConfig, *, dialect: str = "torch", dynamic: bool = False) -> tuple[str, list[str]]:
    """The MLIR module text for `cfg` and the names of its weights, the entry function's last arguments."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch_mlir import fx

    from dabench_ir.models import build_model
    from dabench_ir.models.export import example_input, quiet_torch

    if dialect not in _OUTPUT_TYPES:
        raise ValueError(f"dialect must be one of {sorted(_OUTPUT_TYPES)}")
    # Meta weights as fake CPU tensors: a trace sees shapes only, and ops made inside
    # forward (causal mask) stay on the CPU device, which linalg lowering needs.

    model, names, meta_weights = _params_as_inputs(build_model(cfg, device="meta"))
    with FakeTensorMode(allow_non_fake_inputs=True):
        fakes = [torch.empty(t.shape, dtype=t.dtype) for t in meta_weights]
        args: tuple[torch.Tensor, ...] = (example_input(cfg, dynamic, "cpu"), *fakes)
    dynamic_shapes = None
    if dynamic:
        seq_max = cfg.max_positions if cfg.positional == "learned" else None
        seq = torch.export.Dim("seq", min=2, max=seq_max) if seq_max else torch.export.Dim("seq", min=2)
        dims = {0: torch.export.Dim("batch", min=2), 1: seq}
        dynamic_shapes = {"x": dims, "weights": tuple(None for _ in names)}
    with quiet_torch(), torch.no_grad():
        module = fx.export_and_import(
            model, *args, output_type=_OUTPUT_TYPES[dialect], dynamic_shapes=dynamic_shapes, func_name="main"
        )
    # keep locations: the MLIR frontend attributes each op to its source through them
    return module.operation.get_asm(enable_debug_info=True), names


def export_mlir(
    cfg: ModelConfig,
    path: str | Path,
    options: ExportOptions | None = None,
    *,
    dialect: str = "torch",
    progress: Callable[[str], None] | None = None,
    **overrides,
) -> list[str]:
    """Write `cfg` as MLIR (torch or linalg-on-tensors dialect) to `path`; returns weight names.

    ``options`` (or keyword ``overrides``) are the ONNX exporter's (`models.export.ExportOptions`:
    one set, one rule for ``weights``, `resolve_weights`); ``stamp`` does not apply."""
    from dabench_ir.models.export import export_options, resolve_weights

    o = export_options(options, overrides)
    if progress:
        progress(f"importing {cfg.layers} blocks with torch-mlir (fx importer, {dialect})")
    mode = resolve_weights(cfg, o.weights, o.max_weight_bytes, format=f"mlir-{dialect}")
    text, names = mlir_text(cfg, dialect=dialect, dynamic=o.dynamic)
    header = [
        f"// dabench.family: {cfg.family}",
        f"// dabench.preset: {cfg.preset or ''}",
        f"// dabench.params: {json.dumps({**cfg.to_dict(), 'dynamic': o.dynamic}, sort_keys=True)}",
        f"// dabench.weights: {json.dumps(names)}",
        f"// dabench.weights_mode: {mode}",
    ]
    from dabench_ir.fileio import write_output

    write_output(path, "\n".join(header) + "\n" + text)
    return names
