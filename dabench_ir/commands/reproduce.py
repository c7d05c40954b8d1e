"""`dabench-ir reproduce STUDY`: a published study's experiments run and its findings checked, in one command."""

from __future__ import annotations

import argparse
import os
import sys

from dabench_ir.commands.flags import add_quiet, wrap

__all__ = ["DESCRIPTION", "HELP", "add_arguments", "run"]


HELP = "run a published study's experiments and check its findings one by one (paper vs tool)"
DESCRIPTION = wrap(
    "Run every experiment of a study (a TOML file, or a bundled study by name: see --list) "
    "as one resumable sweep into OUT, evaluate each of its findings and print paper vs tool, reproduced or "
    "not, and the mechanism in the tool behind it. Writes OUT/findings.csv, .json, .md, the results tables "
    "and the study's plots. Findings not reproduced are results: the exit code is 0 when the run completes. "
    "docs/reproduce.md describes the study format."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from dabench_ir.commands.sweep import add_grid_arguments

    p.formatter_class = argparse.RawDescriptionHelpFormatter  # DESCRIPTION as `wrap` filled it, at any width
    p.add_argument("study", nargs="?", metavar="STUDY", help="a study .toml file or a bundled study name (dabench)")
    p.add_argument("-o", "--output", metavar="OUT", help="output folder (default: out/reproduce-NAME)")
    p.add_argument("--list", action="store_true", help="list the bundled studies and exit")
    p.add_argument("--dry-run", action="store_true", help="print the experiments and their point counts and exit")
    p.add_argument("--only", metavar="ID,...", help="only these findings (and the experiments they need)")
    add_grid_arguments(p)
    p.add_argument("--force", action="store_true", help="allow an experiment above the sweep's size limits")
    add_quiet(p, "no progress bar")


def _unicode(stream: object) -> bool:
    """True when ``stream`` can print the check marks."""
    encoding = getattr(stream, "encoding", None) or "ascii"
    try:
        "✓✗".encode(encoding)
    except (UnicodeEncodeError, LookupError):
        return False
    return True


def _list() -> int:
    from dabench_ir.reproduce import bundled_studies, load_study

    for name, path in bundled_studies().items():
        study = load_study(path)
        print(f"{name:10s} {len(study.findings):3d} findings {len(study.points()):5d} points  {study.title}")
    return 0


def _dry_run(study: object) -> int:
    from dabench_ir.reproduce import Study
    from dabench_ir.reproduce.counterfactual import needed_points

    assert isinstance(study, Study)
    print(f"{study.name}: {study.title}")
    width = max(len(n) for n in study.experiments)
    for name, spec in study.experiments.items():
        used = sum(1 for f in study.findings if f.experiment == name)
        print(f"  {name:{width}s} {len(spec.points):5d} points  {used:2d} findings  {spec.description}".rstrip())
    total = sum(len(s.points) for s in study.experiments.values())
    print(
        f"{len(study.points())} distinct points ({total} over the experiments), {len(study.findings)} findings, "
        f"{len(study.plots)} plots"
    )
    tested = [f for f in study.findings if f.counterfactual is not None]
    reads = sum(len(needed_points(f, study.experiments[f.experiment])) for f in tested)
    print(
        f"counterfactuals: {len(tested)} of {len(study.findings)} findings name one ({reads} points read, some shared "
        "with the study's); the rest are not a test"
    )
    return 0


def run(args: argparse.Namespace) -> int:
    from dabench_ir.commands.sweep import grid_options, lost_points, run_grid
    from dabench_ir.errors import UserError
    from dabench_ir.reproduce import load_study, run_study
    from dabench_ir.reproduce.render import findings_table

    if args.list:
        return _list()
    if not args.study:
        raise UserError("reproduce: give a STUDY (.toml file or bundled name) or --list")
    study = load_study(args.study, force=args.force)
    if args.only is not None:
        study = study.restrict(i.strip() for i in args.only.split(",") if i.strip())
    if args.dry_run:
        return _dry_run(study)
    out = args.output or os.path.join("out", f"reproduce-{study.name}")
    grid = grid_options(args, out)
    from dabench_ir.fileio import plan_outputs

    # findings.*, results tables, experiments/, counterfactuals/ and plots are written into OUT:
    # the study file and its target files may not lie there (`reproduce findings.md -o .`)
    plan_outputs(study.input_files(), [], folders=[(out, "-o")])
    result = run_grid(args, run_study, study, out, grid)
    print(findings_table(result.outcomes, unicode=_unicode(sys.stdout)))
    sweep, cf = result.sweep, result.counterfactual_sweep
    if not args.quiet and sweep is not None:
        print(
            f"{sweep.total} points: {sweep.skipped} done before, {sweep.ran} run now ({sweep.failed} failed); "
            f"{sweep.seconds:.1f}s; findings: {os.path.join(out, 'findings.md')}"
        )
        if cf is not None:
            print(
                f"counterfactuals: {cf.total} points: {cf.skipped} done before, {cf.ran} run now ({cf.failed} "
                f"failed); {cf.seconds:.1f}s"
            )
    return lost_points(sum(s.lost for s in (sweep, cf) if s is not None))
