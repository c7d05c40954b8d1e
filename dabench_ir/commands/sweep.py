"""`dabench-ir sweep SPEC -o DIR`: run a study grid (resumable, parallel, optionally on Ray)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dabench_ir.commands.flags import add_quiet, wrap
from dabench_ir.options import SWEEP, add_knob_arguments, knob_values

__all__ = [
    "DESCRIPTION",
    "HELP",
    "add_arguments",
    "add_grid_arguments",
    "grid_options",
    "lost_points",
    "run",
    "run_grid",
]


def _bundled_epilog() -> str:
    """The bundled grids by name, with their descriptions (read from the spec files, no points built)."""
    import tomllib
    from importlib import resources

    folder = resources.files("dabench_ir") / "data" / "sweeps"  # read directly: no sweep import at CLI start
    lines = ["bundled grids (give the name as SPEC):"]
    specs = sorted((p for p in folder.iterdir() if p.name.endswith(".toml")), key=lambda p: p.name)
    for path in specs:
        name = path.name.removesuffix(".toml")
        try:
            description = tomllib.loads(path.read_text(encoding="utf-8")).get("description", "")
        except (OSError, tomllib.TOMLDecodeError):
            description = ""
        lines.append(f"  {name:10s} {description}")
    return "\n".join(lines)


HELP = "run a grid of models x targets x options and tabulate it"
DESCRIPTION = wrap(
    "Run every point of a sweep spec (a TOML file, or a bundled spec by name: see --list), "
    "writing DIR/results.csv, DIR/results.parquet, per-point JSON reports and plots. "
    "A rerun skips points already done."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = _bundled_epilog()
    # the epilog one grid a line, and DESCRIPTION as `wrap` filled it
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("spec", nargs="?", metavar="SPEC", help="a spec .toml file or a bundled spec name (listed below)")
    p.add_argument("-o", "--output", metavar="DIR", help="output folder")
    p.add_argument("--list", action="store_true", help="list the bundled specs and exit")
    add_grid_arguments(p)
    p.add_argument(
        "--no-node-detail",
        action="store_true",
        help="keep per-point reports without their per-node rows (much smaller on disk)",
    )
    p.add_argument("--dry-run", action="store_true", help="print the points and exit")
    p.add_argument(
        "--force", action="store_true", help="run a grid above 100,000 points or a point above 10,000 layers"
    )
    add_quiet(p, "no progress bar, no summary")
    add_knob_arguments(p, SWEEP)  # each knob flag sets that parameter in the spec's [defaults]


CACHE_DIR_HELP = (
    "where exported 1-layer base models are cached (default: models/ in $DABENCH_IR_CACHE or "
    "~/.cache/dabench-ir, shared by sweep, reproduce and validate)"
)


def add_grid_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of a command that runs a grid of points through `run_sweep` (sweep, reproduce):
    where and how many workers, the model cache, failed points, plots."""
    p.add_argument("--jobs", "-j", type=int, help="worker processes (default: number of cores)")
    p.add_argument("--executor", choices=["local", "ray"], default="local", help="where points run")
    p.add_argument("--address", metavar="ADDR", help="Ray cluster address (default: start a local Ray)")
    p.add_argument("--cache-dir", metavar="DIR", help=CACHE_DIR_HELP)
    p.add_argument("--retry-failed", action="store_true", help="run points that failed before again")
    p.add_argument("--no-plots", action="store_true", help="write no PNG plots")


def check_grid_flags(args: argparse.Namespace) -> None:
    """The grid flags' values, before any work (a dry run's too: a flag is never accepted unread)."""
    from dabench_ir.errors import UserError

    if args.jobs is not None and args.jobs < 1:
        raise UserError(f"--jobs {args.jobs}: expected a positive number")
    if args.address is not None and args.executor != "ray":
        raise UserError("--address is for --executor ray")


def grid_options(args: argparse.Namespace, out: str) -> dict[str, Any]:
    """How a grid command's points run, from its grid flags (`add_grid_arguments`): `run_sweep`'s
    keywords (`run_study` takes them too), after checking its folders and its executor (one line
    each, before any work: a Ray address no head answers is refused before the results table is begun)."""
    from dabench_ir.fileio import check_output_dir
    from dabench_ir.sweep.executors import check_ray_address

    check_grid_flags(args)
    if args.executor == "ray" and args.address is not None:
        check_ray_address(args.address)
    check_output_dir(out, "-o")
    if args.cache_dir is not None:
        check_output_dir(args.cache_dir, "--cache-dir")
    return {
        "jobs": args.jobs or os.cpu_count() or 1,
        "executor": args.executor,
        "address": args.address,
        "cache_dir": args.cache_dir,
        "retry_failed": args.retry_failed,
        "plots": not args.no_plots,
    }


def run_grid(
    args: argparse.Namespace, run: Callable[..., Any], what: Any, out: str, grid: dict[str, Any], **more: Any
) -> Any:
    """``run(what, out, ...)``, `run_sweep` of a spec or `run_study` of a study, as ``grid``
    (`grid_options`) says, with a progress bar labelled with ``what``'s name (none with --quiet)."""
    from dabench_ir.progress import Progress

    progress = Progress(quiet=args.quiet)
    try:
        return run(
            what,
            out,
            bar=lambda done, total, **kw: progress.bar(done, total, label=f"{what.name} ", **kw),
            **grid,
            **more,
        )
    finally:
        progress.done()


def lost_points(lost: int, missing: list[str] | None = None) -> int:
    """The exit code of a grid run that ended with points without a record (1, naming them:
    ``missing``, their labels; ``lost``, how many went with a dead worker) or 0."""
    if not lost and not missing:
        return 0
    import sys

    count = len(missing) if missing else lost
    which = f" ({'; '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})" if missing else ""
    why = f", {lost} lost to a dead worker" if lost else ""
    print(
        f"dabench-ir: error: {count} point(s) have no result{which}{why}; run the same command again to finish them",
        file=sys.stderr,
    )
    return 1


def _check_inputs_outside(source: str, spec: Any, out: str) -> None:
    """Refuse an output folder that holds the spec file or a target file its points name: the run
    writes its files there (a spec named results.csv in it was written over)."""
    from dabench_ir.fileio import plan_outputs
    from dabench_ir.targets import is_target_path

    targets = {str(p.params["target"]) for p in spec.points if is_target_path(str(p.params["target"]))}
    inputs = ([Path(source)] if os.path.lexists(source) else []) + [Path(t) for t in sorted(targets)]
    plan_outputs(inputs, [], folders=[(out, "-o")])


def run(args: argparse.Namespace) -> int:
    from dabench_ir.errors import UserError
    from dabench_ir.sweep import bundled_specs, load_spec, run_sweep
    from dabench_ir.sweep.runner import configurations

    if args.list:
        for name, path in bundled_specs().items():
            spec = load_spec(path)
            print(f"{name:10s} {len(spec.points):5d} points  {spec.description}")
        return 0
    if not args.spec:
        raise UserError("sweep: give a SPEC (.toml file or bundled name) or --list")
    spec = load_spec(args.spec, defaults=knob_values(args, SWEEP), force=args.force)
    if args.dry_run:
        check_grid_flags(args)  # a real run checks them with its folders (`grid_options`)
        points = configurations(spec)
        for point in points.values():
            print(point.label())
        print(f"{len(points)} points")
        return 0
    if not args.output:
        raise UserError("sweep: give the output folder with -o DIR")
    grid = grid_options(args, args.output)
    _check_inputs_outside(args.spec, spec, args.output)
    result = run_grid(args, run_sweep, spec, args.output, grid, node_detail=not args.no_node_detail)
    if not args.quiet:
        ok = sum(1 for r in result.rows if r.get("status") == "ok")
        print(
            f"{spec.name}: {result.total} points, {result.skipped} done before, {result.ran} run now "
            f"({result.failed} failed), {ok} ok in the table; {result.exports} model export(s); "
            f"{result.seconds:.1f}s"
        )
        if result.elsewhere:
            print(f"{result.elsewhere} point(s) left to another sweep running into the same folder")
        print(f"results: {os.path.join(args.output, 'results.csv')}")
    return lost_points(result.lost, result.missing)
