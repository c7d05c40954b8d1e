"""Refit fitted target parameters to their catalogue points, and score the points held out.

    .venv/bin/python scripts/refit.py sn30 arch.pcu_efficiency_o3 arch.pcu_efficiency_o0
    .venv/bin/python scripts/refit.py wse2 arch.ws_layer_pass_s --hold-out wse2-gpt3-2.7b-streaming
    .venv/bin/python scripts/refit.py sn30 arch.pcu_k_half --range arch.pcu_k_half=0:512 --write

The points a parameter is fitted to are the ones its ``fitted_to`` names in the target file
(the one record of what is in sample), less ``--hold-out`` ones. The fit minimises the sum of
squared log errors, ``log(predicted / measured)``, over every quantity those points compare
(throughput, step time, section counts, PEs: whatever the point measures; of a reference-only
point, measured on another chip generation, only the dimensionless ones), by golden-section
search per parameter, coordinate by coordinate. A point that cannot run or does not fit at a
trial value costs as a 10x error, so the fit stays where the points run.

It prints each parameter's value before and after, then the errors in sample (the fit's points)
and out of sample (every other point of the target: held out here, or held out in the
catalogue), both at the file's values and at the refitted ones. ``--write`` puts the refitted
values into the target file (the ``source`` strings are the author's to update: say which points
the value was fitted to and quote this command).
"""

from __future__ import annotations

import argparse
import itertools
import math
import re
import statistics
import sys
import tempfile
import tomllib
from dataclasses import replace
from pathlib import Path

from dabench_ir import validate
from dabench_ir.targets import builtin_target_paths, load_target

_MISS = math.log(10.0) ** 2  # a point that cannot run or does not fit: as a 10x error
_GOLDEN = (math.sqrt(5) - 1) / 2
_COUNTER = itertools.count()


def _locate(text: str, param: str) -> re.Match:
    """The ``value = NUM`` of ``param`` (``section.key``, e.g. ``arch.pcu_efficiency_o3``) in TOML ``text``."""
    section, _, key = param.rpartition(".")
    head = re.search(rf"^\[{re.escape(section)}\]\s*$", text, re.M)
    if not head:
        raise SystemExit(f"refit: no [{section}] table in the target file (parameter {param})")
    nxt = re.search(r"^\[", text[head.end():], re.M)
    end = head.end() + (nxt.start() if nxt else len(text) - head.end())
    m = re.compile(rf"^{re.escape(key)}\s*=\s*\{{\s*value\s*=\s*([-+0-9.eE_]+)", re.M).search(text, head.end(), end)
    if not m:
        raise SystemExit(f"refit: no {key} = {{ value = ... }} in [{section}] (parameter {param})")
    return m


def _with_values(text: str, values: dict[str, float]) -> str:
    for param, value in values.items():
        m = _locate(text, param)
        text = text[: m.start(1)] + f"{value:.6g}" + text[m.end(1):]
    return text


def _counts(point, quantity: str) -> bool:
    """Whether a quantity enters the fit: all of a point's, but of a reference-only point (another
    chip generation) only the dimensionless ones (fraction of peak, ratios): its absolute figures
    measure that chip's clock, not this target's efficiency."""
    return not point.reference_only or "fraction" in quantity or "ratio" in quantity


def _score(points, text: str, tmp: Path) -> tuple[float, validate.Validation]:
    """Sum of squared log errors of ``points`` under target file ``text``, and the validation."""
    path = tmp / f"trial{next(_COUNTER)}.toml"
    path.write_text(text)
    result = validate.run_validation([replace(p, target=str(path)) for p in points])
    loss = 0.0
    for r in result.results:
        errs = [q for q in r.quantities if q.error is not None and _counts(r.point, q.name)]
        if r.status != "ok" or (not errs and r.fit_verdict != "right"):
            loss += _MISS
        loss += sum(math.log(q.predicted / q.measured) ** 2 for q in errs if q.predicted > 0)
        loss += sum(_MISS for q in errs if q.predicted <= 0)
    return loss, result


def _golden(f, lo: float, hi: float, log: bool, steps: int) -> float:
    """The minimiser of ``f`` on [lo, hi] by golden-section search (on log scale when ``log``)."""
    to = (lambda x: math.log(x)) if log else (lambda x: x)
    back = (lambda y: math.exp(y)) if log else (lambda y: y)
    a, b = to(lo), to(hi)
    c, d = b - _GOLDEN * (b - a), a + _GOLDEN * (b - a)
    fc, fd = f(back(c)), f(back(d))
    for _ in range(steps):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - _GOLDEN * (b - a)
            fc = f(back(c))
        else:
            a, c, fc = c, d, fd
            d = a + _GOLDEN * (b - a)
            fd = f(back(d))
    return back((a + b) / 2)


def _errors(result: validate.Validation) -> tuple[int, float | None, float | None]:
    errs = [abs(q.error) for r in result.results for q in r.quantities if q.error is not None and _counts(r.point, q.name)]
    if not errs:
        return 0, None, None
    return len(errs), statistics.median(errs), max(errs)


def _line(label: str, result: validate.Validation) -> str:
    n, med, worst = _errors(result)
    if not n:
        return f"  {label:34s} no compared quantity"
    return f"  {label:34s} {n:3d} compared, median |e| {med:6.1%}, worst {worst:6.1%}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("target", help="a built-in target name (sn30, wse2, bow, ...)")
    ap.add_argument("params", nargs="+", help="fitted parameters, section.key (arch.pcu_efficiency_o3)")
    ap.add_argument("--hold-out", nargs="*", default=[], metavar="ID", help="points to leave out of the fit")
    ap.add_argument("--range", action="append", default=[], metavar="P=LO:HI",
                    help="search range of a parameter (default: a quarter to four times its value)")
    ap.add_argument("--steps", type=int, default=14, help="golden-section steps per parameter and round")
    ap.add_argument("--rounds", type=int, default=2, help="coordinate-descent rounds (several parameters)")
    ap.add_argument("--write", action="store_true", help="write the refitted values into the target file")
    args = ap.parse_args(argv)

    target = load_target(args.target)
    path = builtin_target_paths()[target.name]
    text = path.read_text()
    quantities = dict(target.quantities())
    for p in args.params:
        if p not in quantities or not quantities[p].fitted:
            raise SystemExit(f"refit: {target.name} has no fitted parameter {p} (one with fitted_to)")
    ranges = {}
    for spec in args.range:
        name, _, span = spec.partition("=")
        lo, _, hi = span.partition(":")
        ranges[name] = (float(lo), float(hi))
    mine = [p for p in validate.load_catalog() if p.kind != "host" and load_target(p.target).name == target.name]
    held = set(args.hold_out)
    unknown = held - {p.id for p in mine}
    if unknown:
        raise SystemExit(f"refit: no {target.name} catalogue point {sorted(unknown)[0]}")
    fit = [p for p in mine if p.id not in held and any(quantities[q].fitted_on(p.id) for q in args.params)]
    rest = [p for p in mine if p not in fit]
    print(f"{target.name}: fitting {', '.join(args.params)} to {len(fit)} point(s); {len(rest)} scored out of sample")
    values = {p: quantities[p].value for p in args.params}
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        before_fit = _score(fit, text, tmp_path)
        for _ in range(args.rounds if len(values) > 1 else 1):
            for p in args.params:
                v = values[p]
                lo, hi = ranges.get(p, (v / 4, v * 4))
                if lo <= 0 < hi and p not in ranges:
                    raise SystemExit(f"refit: {p} is 0; give its range with --range {p}=LO:HI")
                log = lo > 0

                def loss(x: float, p: str = p) -> float:
                    return _score(fit, _with_values(text, {**values, p: x}), tmp_path)[0]

                values[p] = _golden(loss, lo, hi, log, args.steps)
        new_text = _with_values(text, values)
        after_fit = _score(fit, new_text, tmp_path)
        rest_before = _score(rest, text, tmp_path)[1] if rest else None
        rest_after = _score(rest, new_text, tmp_path)[1] if rest else None
    for p, v in values.items():
        print(f"  {p:34s} {quantities[p].value:.6g} -> {v:.6g}")
    print(f"in sample ({', '.join(sorted(x.id for x in fit)) or 'none'}):")
    print(_line("file values", before_fit[1]))
    print(_line("refitted", after_fit[1]))
    if rest:
        print(f"out of sample ({', '.join(sorted(x.id for x in rest))}):")
        print(_line("file values", rest_before))
        print(_line("refitted", rest_after))
    if args.write:
        path.write_text(new_text)
        tomllib.loads(new_text)
        print(f"wrote {path} (update each source: the points fitted to, the held-out ones, this command)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
