"""`dabench-ir scale MODEL --target T --chips 1,2,4 --strategy dp|tp|pp`: Level-2 scaling."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from dabench_ir.commands.flags import add_outputs, add_quiet
from dabench_ir.options import SCALE, add_deprecated, add_knob_arguments, knob_values

__all__ = ["DESCRIPTION", "HELP", "add_arguments", "render_scale", "run"]


_CHIPS = (1, 2, 4, 8)
"""Chip counts `scale` tries when --chips is not given."""


HELP = "throughput over 1..n chips with data, tensor or pipeline parallelism"
DESCRIPTION = (
    "Scale MODEL over several chips of a target (DABench Level 2): throughput, speedup, "
    "scaling efficiency, communication share, per-chip allocation and load balance, fit."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL", help="an .onnx or .mlir file, or a preset name (as profile takes)")
    p.add_argument("--target", "-t", required=True, help="the target whose chips are counted (name, alias or file)")
    add_knob_arguments(p, SCALE, defaults={"chips": _CHIPS})  # --batch and --chips take lists: 1,8,32
    add_outputs(
        p,
        json="write dabench-ir/scale/v1 JSON",
        plots="write the throughput and efficiency vs chips plot into DIR as PNG and SVG (as profile --plots does)",
    )
    add_deprecated(p, "--plot", use="--plots DIR", metavar="F")  # the same plot to one file F (.png or .svg)
    add_quiet(p, "no progress, no table")


def run(args: argparse.Namespace) -> int:
    from dabench_ir.api import scale_model
    from dabench_ir.fileio import check_input_file, check_output_path, plan_outputs, write_output
    from dabench_ir.models.presets import names_preset
    from dabench_ir.progress import Progress

    inputs = [] if not os.path.lexists(args.model) and names_preset(args.model) else [args.model]  # a preset: exported
    for model in inputs:
        check_input_file(model, "MODEL")
    if args.plot is not None:
        check_output_path(args.plot, "--plot", inputs=inputs, suffixes=(".png", ".svg"))
    from dabench_ir.targets import target_files

    inputs += target_files(args.target)  # a target file is an input too
    plan_outputs(inputs, [(p, f) for p, f in ((args.json, "--json"), (args.plot, "--plot")) if p is not None])
    if getattr(args, "plots", None) is not None:
        from dabench_ir.fileio import check_output_dir

        check_output_dir(args.plots, "--plots")
    values = knob_values(args, SCALE)
    chips: list[int] = values.pop("chips", list(_CHIPS))
    batches: list[int | None] = values.pop("batch", [None])
    progress = Progress(quiet=args.quiet)
    merged = scale_model(args.model, args.target, chips, batches, values, progress=progress)
    progress.done()
    if args.json:
        write_output(args.json, json.dumps(merged.to_dict(), indent=1, default=str))
    if args.plot or args.plots:
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
        if fig is not None and args.plot:
            save_figure(fig, args.plot)
        if fig is not None and args.plots:
            folder = Path(args.plots)
            folder.mkdir(parents=True, exist_ok=True)
            for fmt in ("png", "svg"):
                save_figure(fig, folder / f"{Path(args.model).stem}-scaling.{fmt}")
    if not args.quiet:
        print(render_scale(merged))
    return 0


def render_scale(result) -> str:
    from dabench_ir.report.table import human, percent, seconds, times

    head = f"{result.target}, strategy {result.strategy}, {result.mode}, {result.precision}, link {result.link or '-'}"
    per_node = result.chips_per_node or result.devices_per_node
    if per_node:
        head += f", {per_node} per node"
    cols = [
        "chips",
        "nodes",
        "batch",
        "step",
        "samples/s",
        "speedup",
        "efficiency",
        "comm",
        "bubble",
        "alloc/chip",
        "LI/chip",
        "bound",
        "fits",
        "mem/device",
        "J/sample",
    ]
    rows = []
    for p in result.points:
        rows.append(
            [
                str(p.chips),
                str(p.nodes) + ("*" if p.crosses_nodes else ""),
                str(p.batch),
                seconds(p.time_s),
                "does not fit" if p.throughput_samples_per_s is None else human(p.throughput_samples_per_s),
                times(p.speedup),
                percent(p.scaling_efficiency),
                percent(p.comm_share),
                percent(p.bubble_fraction),
                percent(p.allocation_ratio),
                "-" if p.load_imbalance is None else f"{p.load_imbalance:.2f}",
                p.dominant_bound or "-",
                "yes" if p.fits else "NO",
                "-" if p.device_bytes is None else human(p.device_bytes, "B"),
                "-" if p.energy is None or not p.batch else human(p.energy.total_j / p.batch, "J"),
            ]
        )
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
    lines = [head, "  ".join(c.rjust(w) for c, w in zip(cols, widths, strict=True))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)) for r in rows]
    lines.append(
        "  alloc/chip, LI/chip: one chip's placement; mem/device: what the most loaded device holds; "
        "J/sample: every device's energy and the links', over the step's samples; the rest: the whole step"
    )
    crossing = [p.chips for p in result.points if p.crosses_nodes]
    if crossing and per_node:
        lines.append(
            f"  * crosses the node boundary ({per_node} devices per node): collectives are "
            "hierarchical, the inter-node link carries each device's shard"
        )
    from dabench_ir.scaling import NODE_CROSSING

    said = dict.fromkeys(n for p in result.points for n in p.notes if not n.startswith(NODE_CROSSING))
    lines += [f"  note: {note}" for note in said]  # what the points assumed, once each (JSON: each point's)
    for p in result.points:
        if p.failure:
            lines.append(f"  {p.chips} chips: {p.failure['reason']}")
        if p.superlinear and p.speedup is not None and p.speedup > p.chips:
            lines.append(f"  {p.chips} chips: {times(p.speedup)}, above linear: {p.superlinear}")
    return "\n".join(lines)
