"""Decoder-block model families (GPT-2, LLaMA, GPT-J, GPT-NeoX) and their exporters (ONNX, MLIR).

Building a model needs torch; `ModelConfig`, `PRESETS` and the closed-form counts do not.
"""

from __future__ import annotations

from dabench_ir._layout import installed_as

installed_as(__name__, "models")  # the folder is dabench_ir.models; one file, one module

import logging
from typing import TYPE_CHECKING, Any

from dabench_ir.models.config import FAMILIES, ModelConfig
from dabench_ir.models.presets import PRESETS, describe_presets, get_preset

if TYPE_CHECKING:
    from torch import nn

__all__ = [
    "FAMILIES",
    "PRESETS",
    "ModelConfig",
    "build_model",
    "describe_presets",
    "export_model",
    "get_preset",
]

logger = logging.getLogger(__name__)


def build_model(cfg: ModelConfig, *, device: str = "cpu", seed: int | None = 0) -> nn.Module:
    """The torch module for `cfg` in eval mode, on `device` ("meta" builds no weight data).

    With `seed` set, weights are reproducible (torch default init under that seed).
    """
    import torch

    from dabench_ir.models.gpt2 import GPT2Model, torch_dtype
    from dabench_ir.models.gptj import ParallelModel
    from dabench_ir.models.llama import LlamaModel

    cls = {"gpt2": GPT2Model, "llama": LlamaModel}.get(cfg.family, ParallelModel)  # gptj, gpt_neox
    if seed is not None and device != "meta":
        torch.manual_seed(seed)
    with torch.device(device):
        model = cls(cfg)
    return model.to(torch_dtype(cfg.dtype)).eval()


def export_model(cfg: ModelConfig, path: Any, **options: Any) -> Any:
    """Export `cfg` to `path`; see `dabench_ir.models.export.export_model` for options."""
    from dabench_ir.models.export import export_model as _export

    return _export(cfg, path, **options)
