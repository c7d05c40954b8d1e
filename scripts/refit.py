"""Refit fitted target parameters to their catalogue points, and score the points held out.

    .venv/bin/python scripts/refit.py sn30 arch.pcu_efficiency overheads.device_step_s
    .venv/bin/python scripts/refit.py wse2 arch.ws_layer_pass_s --hold-out wse2-gpt3-2.7b-streaming
    .venv/bin/python scripts/refit.py sn30 arch.pcu_k_half --range arch.pcu_k_half=0:512 --write
    .venv/bin/python scripts/refit.py --cross-validate bow     # leave one source out, recorded

The points a parameter is fitted to are the ones its ``fitted_to`` names in the target file
(the one record of what is in sample), less ``--hold-out`` ones. The fit minimises the sum of
squared log errors, ``log(predicted / measured)``, over every quantity those points compare
(throughput, step time, section counts, PEs: whatever the point measures; of a reference-only
point, measured on another chip generation, only the dimensionless ones), by golden-section
search per parameter, coordinate by coordinate (`dabench_ir.validate.fit`). A point that cannot
run or does not fit at a trial value costs as a 10x error, so the fit stays where the points run.

It prints each parameter's value before and after, then the errors in sample (the fit's points)
and out of sample (every other point of the target: held out here, or held out in the
catalogue), both at the file's values and at the refitted ones. ``--write`` puts the refitted
values into the target file (the ``source`` strings are the author's to update: say which points
the value was fitted to and quote this command).

``--cross-validate TARGET...`` leaves each source of the targets' catalogue points out in turn,
refits every parameter that source informed on the others' points, and records the folds' values
in ``dabench_ir/data/crossval.json`` (`dabench_ir.validate.crossval`); ``dabench-ir validate``
then predicts each source's points at its fold's values and reports the cross-validated error.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import tempfile
import tomllib
from pathlib import Path

from dabench_ir import validate
from dabench_ir.errors import UserError
from dabench_ir.targets import builtin_target_paths, load_target
from dabench_ir.validate import crossval
from dabench_ir.validate.fit import FitError, counts, fit, score, with_values


def _line(label: str, result: validate.Validation) -> str:
    errs = [abs(e) for r in result.results for e in counts(r)]
    if not errs:
        return f"  {label:34s} no compared quantity"
    return f"  {label:34s} {len(errs):3d} compared, median |e| {statistics.median(errs):6.1%}, worst {max(errs):6.1%}"


def _ranges(specs: list[str]) -> dict[str, tuple[float, float]]:
    ranges = {}
    for spec in specs:
        name, _, span = spec.partition("=")
        lo, _, hi = span.partition(":")
        try:
            ranges[name] = (float(lo), float(hi))
        except ValueError:
            raise FitError(f"--range {spec!r}: give PARAM=LO:HI with two numbers (arch.pcu_k_half=0:512)") from None
        if not ranges[name][0] < ranges[name][1]:
            raise FitError(f"--range {spec!r}: LO must be below HI")
    return ranges


def _builtin(name: str):
    try:
        target = load_target(name)
    except UserError as exc:
        raise FitError(str(exc)) from None
    path = builtin_target_paths().get(target.name)
    if path is None or Path(name).suffix:
        raise FitError(f"{name}: refit fits a built-in target by name ({', '.join(builtin_target_paths())})")
    return target, path


def _refit(args: argparse.Namespace) -> int:
    target, path = _builtin(args.target)
    text = path.read_text()
    quantities = dict(target.quantities())
    for p in args.params:
        if p not in quantities or not quantities[p].fitted:
            raise FitError(f"{target.name} has no fitted parameter {p} (one with fitted_to)")
    ranges = _ranges(args.range)
    mine = [p for p in validate.load_catalog() if p.kind != "host" and load_target(p.target).name == target.name]
    held = set(args.hold_out)
    unknown = held - {p.id for p in mine}
    if unknown:
        raise FitError(f"no {target.name} catalogue point {sorted(unknown)[0]}")
    fit_points = [p for p in mine if p.id not in held and any(quantities[q].fitted_on(p.id) for q in args.params)]
    rest = [p for p in mine if p not in fit_points]
    print(
        f"{target.name}: fitting {', '.join(args.params)} to {len(fit_points)} point(s); {len(rest)} scored out of sample"
    )
    start = {p: quantities[p].value for p in args.params}
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        values = fit(fit_points, text, start, scratch, ranges=ranges, steps=args.steps, rounds=args.rounds)
        new_text = with_values(text, values)
        before, after = score(fit_points, text, scratch)[1], score(fit_points, new_text, scratch)[1]
        rest_before = score(rest, text, scratch)[1] if rest else None
        rest_after = score(rest, new_text, scratch)[1] if rest else None
    for p, v in values.items():
        print(f"  {p:34s} {quantities[p].value:.6g} -> {v:.6g}")
    print(f"in sample ({', '.join(sorted(x.id for x in fit_points)) or 'none'}):")
    print(_line("file values", before))
    print(_line("refitted", after))
    if rest:
        print(f"out of sample ({', '.join(sorted(x.id for x in rest))}):")
        print(_line("file values", rest_before))
        print(_line("refitted", rest_after))
    if args.write:
        path.write_text(new_text)
        tomllib.loads(new_text)
        print(f"wrote {path} (update each source: the points fitted to, the held-out ones, this command)")
    return 0


def _cross_validate(args: argparse.Namespace) -> int:
    catalogue = validate.load_catalog()
    names = [_builtin(t)[0].name for t in [args.target, *args.params]]
    for name in names:
        folds = crossval.fit_folds(
            name,
            catalogue,
            steps=args.steps,
            rounds=args.rounds,
            progress=lambda m: print(f"  {m}", file=sys.stderr, flush=True),
        )
        quantities = dict(load_target(name).quantities())
        for fold in folds:
            if fold.alone:
                print(f"{name}: {fold.source}: not cross-validatable, only it informs {', '.join(fold.alone)}")
            elif not fold.informed:
                print(
                    f"{name}: {fold.source}: informs no parameter ({len(fold.points)} point(s) out of sample as they are)"
                )
            else:
                moves = ", ".join(f"{p} {quantities[p].value:.4g} -> {v:.4g}" for p, v in fold.values.items())
                print(f"{name}: without {fold.source} (refitted to {len(fold.fit_points)} point(s)): {moves}")
        date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
        command = f"scripts/refit.py --cross-validate {name} --steps {args.steps} --rounds {args.rounds}"
        path = crossval.save_record(name, folds, crossval.inputs_key(name, catalogue), command, date)
        print(f"{name}: recorded in {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("target", help="a built-in target name (sn30, wse2, bow, ...)")
    ap.add_argument(
        "params",
        nargs="*",
        help="fitted parameters, section.key (arch.pcu_efficiency); with --cross-validate: more targets",
    )
    ap.add_argument(
        "--cross-validate",
        action="store_true",
        help="leave each source out in turn, refit what it informed, record the folds",
    )
    ap.add_argument("--hold-out", nargs="*", default=[], metavar="ID", help="points to leave out of the fit")
    ap.add_argument(
        "--range",
        action="append",
        default=[],
        metavar="P=LO:HI",
        help="search range of a parameter (default: a quarter to four times its value)",
    )
    ap.add_argument("--steps", type=int, default=14, help="golden-section steps per parameter and round")
    ap.add_argument("--rounds", type=int, default=2, help="coordinate-descent rounds (several parameters)")
    ap.add_argument("--write", action="store_true", help="write the refitted values into the target file")
    args = ap.parse_args(argv)
    try:
        if args.cross_validate:
            if args.hold_out or args.range or args.write:
                raise FitError(
                    "--cross-validate chooses its own held-out points and writes only its record: "
                    "drop --hold-out, --range and --write"
                )
            return _cross_validate(args)
        if not args.params:
            raise FitError("name the fitted parameters to refit (section.key), or give --cross-validate")
        return _refit(args)
    except FitError as exc:
        print(f"refit: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
