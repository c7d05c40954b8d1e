"""`dabench-ir scale MODEL --target T --chips 1,2,4 --strategy dp|tp|pp`: Level-2 scaling."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dabench_ir.errors import UserError

__all__ = ["parse_int_list", "register", "run"]


def parse_int_list(text: str, flag: str) -> list[int]:
    """``"1,2,4"`` -> ``[1, 2, 4]``, or one clear error naming the flag."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UserError(f"{flag} {text!r}: expected comma-separated positive integers, e.g. {flag} 1,2,4") from None
    if not values or any(v < 1 for v in values):
        raise UserError(f"{flag} {text!r}: expected comma-separated positive integers, e.g. {flag} 1,2,4")
    return values


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "scale",
        help="throughput over 1..n chips with data, tensor or pipeline parallelism",
        description="Scale MODEL over several chips of a target (DABench Level 2): throughput, speedup, "
        "scaling efficiency, communication share, per-chip allocation and load balance, fit.",
    )
    p.add_argument("model", metavar="MODEL")
    p.add_argument("--target", "-t", required=True)
    p.add_argument("--chips", default="1,2,4,8", help="chip counts, e.g. 1,2,4,8")
    p.add_argument("--strategy", choices=["dp", "tp", "pp"], required=True)
    p.add_argument("--batch", help="batch size(s), e.g. 1,8,32 (needs a symbolic batch dim for more than one)")
    p.add_argument("--dim", action="append", metavar="NAME=VALUE")
    p.add_argument("--precision", choices=["fp32", "fp16", "bf16", "mixed"])
    p.add_argument("--mode", choices=["inference", "train"], default="inference")
    p.add_argument("--recompute", action="store_true")
    p.add_argument("--micro-batches", type=int, help="pipeline micro-batches per step (pp)")
    p.add_argument("--opt-level", choices=["O0", "O1", "O3"], default="O1")
    p.add_argument("--json", metavar="F", help="write dabench-ir/scale/v1 JSON")
    p.add_argument("--plot", metavar="F", help="write throughput and efficiency vs chips (PNG or SVG)")
    p.add_argument("--quiet", "-q", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dabench_ir.commands.profile import parse_dims
    from dabench_ir.pipeline import ProfileOptions, prepare_graph
    from dabench_ir.progress import Progress
    from dabench_ir.scaling import ScaleResult, scale
    from dabench_ir.targets import load_target

    chips = parse_int_list(args.chips, "--chips")
    batches: list[int | None] = parse_int_list(args.batch, "--batch") if args.batch else [None]
    dims = parse_dims(args.dim)
    target = load_target(args.target)
    progress = Progress(quiet=args.quiet)
    merged: ScaleResult | None = None
    for batch in batches:
        progress(f"preparing the graph (batch {batch or 'as exported'})")
        opts = ProfileOptions(dims=dims, batch=batch, precision=args.precision, mode=args.mode, recompute=args.recompute,
                              opt_level=args.opt_level)
        graph = prepare_graph(args.model, opts)
        progress(f"scaling over {args.chips} chips ({args.strategy})")
        result = scale(graph, target, chips, args.strategy, opts, micro_batches=args.micro_batches)
        result.model = {"path": str(args.model), "name": graph.name, "nodes": len(graph.nodes), "layers": len(graph.layers)}
        if merged is None:
            merged = result
        else:
            merged.points.extend(result.points)
    progress.done()
    assert merged is not None
    if args.json:
        Path(args.json).write_text(json.dumps(merged.to_dict(), indent=1))
    if args.plot:
        from dabench_ir.report.plots import save_figure, scale_figure

        rows = [
            {
                "chips": p.chips,
                "throughput": p.throughput_samples_per_s,
                "efficiency": p.scaling_efficiency,
                "label": f"{merged.target} {merged.strategy}" + (f" batch {p.batch}" if len(batches) > 1 else ""),
            }
            for p in merged.points
        ]
        fig = scale_figure(rows)
        if fig is not None:
            save_figure(fig, args.plot)
    if not args.quiet:
        print(render_scale(merged))
    return 0


def render_scale(result) -> str:
    from dabench_ir.report.table import human, seconds

    head = f"{result.target}, strategy {result.strategy}, {result.mode}, link {result.link or '-'}"
    cols = ["chips", "batch", "step", "samples/s", "speedup", "efficiency", "comm", "bubble", "alloc", "LI", "bound", "fits"]
    rows = []
    for p in result.points:
        rows.append(
            [
                str(p.chips),
                str(p.batch),
                seconds(p.time_s),
                human(p.throughput_samples_per_s),
                "-" if p.speedup is None else f"{p.speedup:.2f}x",
                "-" if p.scaling_efficiency is None else f"{100 * p.scaling_efficiency:.0f}%",
                f"{100 * p.comm_share:.1f}%",
                f"{100 * p.bubble_fraction:.0f}%",
                "-" if p.allocation_ratio is None else f"{100 * p.allocation_ratio:.1f}%",
                "-" if p.load_imbalance is None else f"{p.load_imbalance:.2f}",
                p.dominant_bound or "-",
                "yes" if p.fits else "NO",
            ]
        )
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
    lines = [head, "  ".join(c.rjust(w) for c, w in zip(cols, widths, strict=True))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)) for r in rows]
    for p in result.points:
        if p.failure:
            lines.append(f"  {p.chips} chips: {p.failure['reason']}")
    return "\n".join(lines)
