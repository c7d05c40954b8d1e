"""`dabench-ir export`: build a GPT-2 or LLaMA decoder stack and write it as ONNX or MLIR.

torch is imported inside `run`, never at import time: the CLI imports every command
module to build its help, and `dabench-ir profile` must not pay for torch.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

from dabench_ir.errors import UserError
from dabench_ir.options import DEFAULT_MAX_WEIGHT_BYTES, MAX_LAYERS

__all__ = ["DESCRIPTION", "HELP", "add_arguments", "run", "weight_cap"]

logger = logging.getLogger(__name__)


def _byte_size(text: str) -> int:
    """`options.byte_size`, as argparse wants a type's error."""
    from dabench_ir.options import byte_size

    try:
        return byte_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


_SUFFIXES = {"onnx": ".onnx", "mlir-torch": ".mlir", "mlir-linalg": ".mlir"}
"""What each --format writes: the output file's suffix."""


def _format(fmt: str | None, output: str) -> str:
    """The format to write: --format, checked against -o's suffix (or onnx when -o is not an .mlir file)."""
    from pathlib import Path

    suffix = Path(output).suffix.lower()
    if fmt is None:
        if suffix == ".mlir":
            raise UserError(f"-o {output}: an .mlir file; give --format mlir-torch or --format mlir-linalg")
        return "onnx"
    if fmt != "onnx" and output != "-" and suffix != _SUFFIXES[fmt]:  # profile reads a file by its suffix
        raise UserError(
            f"-o {output}: --format {fmt} writes a {_SUFFIXES[fmt]} file, which profile reads by its suffix; name it "
            f"{Path(output).with_suffix(_SUFFIXES[fmt]).name}"
        )
    if suffix in _SUFFIXES.values() and suffix != _SUFFIXES[fmt]:
        raise UserError(
            f"-o {output}: --format {fmt} writes a {_SUFFIXES[fmt]} file, not {suffix}; name it "
            f"{Path(output).with_suffix(_SUFFIXES[fmt]).name} or change --format"
        )
    return fmt


_SIZES = {
    "layers": ("L", "decoder blocks"),
    "hidden": ("H", "model width"),
    "heads": ("N", "attention heads (default hidden/64)"),
    "kv_heads": ("K", "K/V heads, < heads for GQA (default heads)"),
    "ffn": ("F", "MLP width (default 4h GPT-2, ~8h/3 LLaMA)"),
    "seq": ("S", "sequence length (default 128)"),
    "batch": ("B", "batch size (default 1)"),
    "vocab": ("V", "add token embedding and LM head of this vocab"),
}
"""The model's sizes export takes, each a `ModelConfig` field: its metavar and help."""

HELP = "export a GPT-2 / LLaMA decoder stack to ONNX or MLIR"
DESCRIPTION = (
    "Build a decoder-block model (GPT-2: LayerNorm, MHA, GELU; LLaMA: RMSNorm, RoPE, GQA, "
    "SwiGLU) and write it as ONNX (torch dynamo exporter, one block exported and stamped "
    "L times) or MLIR (torch-mlir fx importer). Weight-free by default above 256 MiB."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from dabench_ir.models.config import DTYPES, FAMILIES, LOGITS, PHASES, ModelConfig  # the config owns its choices

    p.add_argument("--list-presets", action="store_true", help="list the named presets and exit")
    p.add_argument("--preset", metavar="NAME", help="start from a named shape (see --list-presets)")
    p.add_argument("--family", choices=FAMILIES, help="model family (default: the preset's)")
    for name, (metavar, help) in _SIZES.items():
        p.add_argument(f"--{name.replace('_', '-')}", type=int, metavar=metavar, help=help)
    p.add_argument("--dtype", choices=DTYPES, help=f"parameter dtype (default {ModelConfig.dtype})")
    p.add_argument(
        "--phase",
        choices=PHASES,
        default=PHASES[0],
        help="prefill: one pass over --seq tokens; decode: --chunk new tokens against a KV cache of "
        "--context past tokens (cache inputs and new K/V outputs per layer)",
    )
    p.add_argument(
        "--logits",
        choices=LOGITS,
        help="positions the LM head projects: all (default: a plain forward, training) or last (each "
        "sequence's last, as a serving engine's prefill samples the next token)",
    )
    p.add_argument("--context", type=int, metavar="N", help="decode: past tokens in the KV cache")
    p.add_argument("--chunk", type=int, metavar="K", help="decode: new tokens per step (default 1)")
    p.add_argument(
        "--weights",
        choices=("none", "random"),
        default="auto",
        help="none: shape-only weight inputs; random: seeded weights in the file "
        "(default: random up to 256 MiB of weights, none above)",
    )
    p.add_argument(
        "--max-weight-bytes",
        type=_byte_size,
        metavar="N",
        help=f"refuse --weights random above this many bytes (default {DEFAULT_MAX_WEIGHT_BYTES >> 30}GiB)",
    )
    p.add_argument("--seed", type=int, help="seed for --weights random (default 0)")
    p.add_argument(
        "--format",
        choices=tuple(_SUFFIXES),
        help="onnx (default; -o NAME.onnx), or MLIR text (-o NAME.mlir): mlir-torch (the torch dialect) or "
        "mlir-linalg (lowered to linalg on tensors)",
    )
    p.add_argument("--dynamic", action="store_true", help="make batch and seq symbolic dims `batch`, `seq`")
    p.add_argument(
        "--no-stamp",
        action="store_true",
        help="ONNX: export all L blocks with the plain exporter instead of stamping one (slow for big L)",
    )
    p.add_argument("-o", "--output", metavar="PATH", help="output file")


def _config(args: argparse.Namespace):
    from dabench_ir.models import ModelConfig, get_preset
    from dabench_ir.models.export import DYNAMIC_TRACE_LENGTH

    for flag in (*_SIZES, "context", "chunk"):
        value = getattr(args, flag)
        if value is not None and not 0 < value <= 2**31 - 1:
            raise UserError(f"--{flag.replace('_', '-')} {value}: expected a positive integer below 2**31")
    if args.layers is not None and args.layers > MAX_LAYERS:
        raise UserError(f"--layers {args.layers:,}: at most {MAX_LAYERS:,} decoder blocks")

    given = {
        "family": args.family,
        **{name: getattr(args, name) for name in _SIZES},
        "dtype": args.dtype,
        "logits": args.logits,
    }
    if args.seed is not None and not 0 <= args.seed < 2**32:
        raise UserError(f"--seed {args.seed}: expected an integer from 0 to 2**32 - 1")
    if args.dynamic:
        bound = [f"--{name}" for name in ("batch", "seq", "context") if getattr(args, name) is not None]
        if bound:
            raise UserError(
                f"--dynamic makes batch, seq and the cache length symbolic, so {bound[0]} has no effect: drop one "
                "of them (profile binds the dims: --batch, --seq, --past)"
            )
    if args.phase == "decode":
        if args.context is None and not args.dynamic:
            raise UserError("--phase decode needs --context N (past tokens in the KV cache), or --dynamic")
        if args.seq is not None:
            raise UserError("--phase decode takes --chunk K (new tokens per step), not --seq")
        # --dynamic: the cache length is symbolic, traced at the shortest length torch keeps dynamic
        given.update(phase="decode", context=args.context or DYNAMIC_TRACE_LENGTH, seq=args.chunk or 1)
    elif args.context is not None or args.chunk is not None:
        raise UserError("--context and --chunk apply to --phase decode; add --phase decode")
    if args.preset:
        return get_preset(args.preset, **given)
    missing = [f"--{k}" for k in ("family", "layers", "hidden") if given[k] is None]
    if missing:
        raise UserError(f"export needs {', '.join(missing)} (or --preset NAME; see --list-presets)")
    if given["heads"] is None:
        from dabench_ir.models.config import default_heads

        given["heads"] = default_heads(given["hidden"], hint="pass --heads")
    given.setdefault("seq", None)
    params = {k: v for k, v in given.items() if v is not None}
    params.setdefault("seq", 128)
    return ModelConfig(**params)


def weight_cap(args: argparse.Namespace) -> int:
    """``--max-weight-bytes``, or its default (`options.DEFAULT_MAX_WEIGHT_BYTES`, profile's too)."""
    return DEFAULT_MAX_WEIGHT_BYTES if args.max_weight_bytes is None else args.max_weight_bytes


def _refuse_ignored(args: argparse.Namespace, weights: str) -> None:
    """No flag accepted and ignored: --seed draws random weights, --max-weight-bytes caps them when
    --weights chooses (auto) or draws them, --no-stamp is how ONNX exports its blocks."""
    from dabench_ir.models.export import AUTO_NONE_THRESHOLD_BYTES

    if args.seed is not None and weights != "random":
        raise UserError(f"--seed seeds random weights; this export has none (--weights {args.weights}): drop --seed")
    if args.max_weight_bytes is not None and args.weights == "none":
        raise UserError("--max-weight-bytes caps random weights; --weights none writes none: drop one of them")
    if (
        args.max_weight_bytes is not None
        and args.weights == "auto"
        and args.max_weight_bytes >= AUTO_NONE_THRESHOLD_BYTES
    ):
        raise UserError(
            f"--max-weight-bytes {args.max_weight_bytes:,}: the default --weights auto draws random weights up to "
            f"{AUTO_NONE_THRESHOLD_BYTES >> 20} MiB only, so a larger cap has no effect: add --weights random"
        )
    if args.no_stamp and args.format != "onnx":
        raise UserError(f"--no-stamp applies to ONNX exports, not --format {args.format}: drop it")


def _status(message: str) -> None:
    print(f"dabench-ir export: {message}", file=sys.stderr, flush=True)


def _given(args: argparse.Namespace) -> list[str]:
    """The export flags ``args`` sets: those whose value differs from a bare command line's."""
    bare = argparse.ArgumentParser()
    add_arguments(bare)
    defaults = vars(bare.parse_args([]))
    return [f"--{name.replace('_', '-')}" for name, value in defaults.items() if getattr(args, name) != value]


def run(args: argparse.Namespace) -> int:
    if args.list_presets:
        from dabench_ir.models import describe_presets

        others = [flag for flag in _given(args) if flag != "--list-presets"]
        if others:
            raise UserError(f"--list-presets lists the presets and exports nothing: drop {others[0]} or --list-presets")
        print("\n".join(describe_presets()))
        return 0
    cfg = _config(args)
    if not args.output:
        raise UserError("export needs -o PATH")
    if cfg.phase == "decode" and args.format not in (None, "onnx"):
        raise UserError("--phase decode exports ONNX only; drop --format or use --format onnx")
    args.format = _format(args.format, args.output)
    from dabench_ir.fileio import check_output_path

    check_output_path(args.output, "-o")  # before minutes of exporting, not after
    from dabench_ir.models.export import export_model, require_exporter, resolve_weights

    cap = weight_cap(args)
    weights = resolve_weights(cfg, args.weights, cap, format=args.format)  # refuse early, before importing torch
    _refuse_ignored(args, weights)
    require_exporter("export")
    start = time.perf_counter()
    result = export_model(
        cfg,
        args.output,
        format=args.format,
        weights=args.weights,
        max_weight_bytes=cap,
        dynamic=args.dynamic,
        stamp=not args.no_stamp,
        seed=args.seed or 0,
        progress=_status,
    )
    nodes = f"{result.nodes} nodes, " if result.nodes else ""
    cache = "a symbolic" if args.dynamic else f"a {cfg.context}-token"
    phase = f"decode {cfg.seq} token(s) on {cache} cache, " if cfg.phase == "decode" else ""
    preset = (
        ""
        if not args.preset
        else f"preset {cfg.preset}, "
        if cfg.preset == args.preset
        else f"preset {args.preset} = {cfg.preset}, "
    )
    print(
        f"wrote {result.path} ({result.format}, {preset}{cfg.family}, L={cfg.layers} h={cfg.hidden}, {phase}{nodes}"
        f"{cfg.param_count() / 1e6:.1f} M params, weights {result.weights}, "
        f"{time.perf_counter() - start:.1f} s)",
        file=sys.stderr if args.output == "-" else sys.stdout,  # stdout holds the model itself
    )
    return 0
