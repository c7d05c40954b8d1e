"""`dabench-ir targets`: list the built-in targets and their key figures."""

from __future__ import annotations

import argparse
import fnmatch
import logging

from dabench_ir.commands.flags import add_node_scaling, add_outputs, node_scaling
from dabench_ir.errors import UserError
from dabench_ir.targets import Target, list_targets

__all__ = ["DESCRIPTION", "HELP", "add_arguments", "run", "target_dict"]

logger = logging.getLogger(__name__)


HELP = "list targets and their key figures"
DESCRIPTION = (
    "List the built-in targets with peak FLOP/s per precision, memories, power and process "
    "node. Figures marked * are estimates (see the target file for the basis)."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_node_scaling(
        p,
        "also show peak GOP/s, GOP/s/W and GOP/s/mm² scaled to this process node (docs/energy.md)",
    )
    p.add_argument("--catalog", action="store_true", help="list published accelerator designs, normalised too")
    p.add_argument(
        "--show", metavar="T", help="every figure and model parameter of target T, each with its basis and source"
    )
    add_outputs(p, json="write the listing as JSON to F ('-': stdout), every figure with its source")


def _si(value: float, unit: str) -> str:
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def _star(estimate: bool) -> str:
    return "*" if estimate else ""


def describe(target: Target) -> list[str]:
    """Lines describing one target's key figures."""
    peaks = ", ".join(f"{k} {_si(q.value, 'FLOP/s')}{_star(q.estimate)}" for k, q in target.peaks.items())
    mems = "; ".join(
        f"{m.name} ({m.level}) {_si(m.capacity_bytes, 'B')}{_star(m.capacity.estimate)} @ "
        f"{_si(m.bandwidth_bytes_per_s, 'B/s')}{_star(m.bandwidth.estimate)}"
        for m in target.memories
    )
    alias = f" (alias {', '.join(target.aliases)})" if target.aliases else ""
    return [
        f"{target.name}{alias} [{target.kind}] {target.description}",
        f"    units    {target.num_units:,} {target.unit_name}s{_star(target.units.estimate)}",
        f"    peak     {peaks}",
        f"    memory   {mems}",
        f"    power    {target.watts:,.0f} W per {target.power_covers}{_star(target.power.estimate)}; "
        f"process {target.node_nm:g} nm{_star(target.process_node.estimate)}; "
        f"parallel {', '.join(target.strategies) or '-'}",
    ]


def target_dict(target: Target) -> dict:
    """A target's key facts and every figure with its source (the ``targets --json`` record)."""
    return {
        "name": target.name,
        "kind": target.kind,
        "description": target.description,
        "aliases": list(target.aliases),
        "extends": target.base or None,
        "units": target.num_units,
        "unit_name": target.unit_name,
        "peak_flops": {k: q.value for k, q in target.peaks.items()},
        "memories": [
            {
                "name": m.name,
                "level": m.level,
                "capacity_bytes": m.capacity_bytes,
                "bandwidth_bytes_per_s": m.bandwidth_bytes_per_s,
            }
            for m in target.memories
        ],
        "watts": target.watts,
        "power_covers": target.power_covers,
        "node_nm": target.node_nm,
        "strategies": list(target.strategies),
        "origin": target.origin,
        "figures": {
            name: {
                "value": q.value,
                "source": q.source,
                "estimate": q.estimate,
                "basis": basis(q),
                "fitted_to": list(q.fitted_to),
            }
            for name, q in target.quantities()
        },
    }


def _write_json(doc: dict, dest: str, inputs: list[str] | tuple[str, ...] = ()) -> None:
    from dabench_ir.report.model import json_text

    text = json_text(doc, indent=1)
    if dest == "-":
        print(text)
        return
    from dabench_ir.fileio import check_output_path, write_output

    path = write_output(check_output_path(dest, "--json", inputs=inputs), text + "\n")
    print(f"wrote {path}")


def basis(q) -> str:
    """How a figure is known: fitted to catalogue points (``fitted_to``), an estimate, or sourced."""
    if q.fitted:
        return "fitted"
    return "estimate" if q.estimate else "sourced"


def fitted_points(target: Target) -> dict[str, list[str]]:
    """Per fitted parameter of ``target``, the bundled catalogue points it was fitted to (its
    ``fitted_to`` patterns expanded; a pattern no bundled point matches is kept as written)."""
    from dabench_ir.validate.catalog import load_catalog

    ids = [p.id for p in load_catalog()]
    out = {}
    for name, q in target.quantities():
        if q.fitted:
            matched = [i for i in ids if q.fitted_on(i)]
            unmatched = [pat for pat in q.fitted_to if not any(fnmatch.fnmatchcase(i, pat) for i in ids)]
            out[name] = matched + unmatched
    return out


def _inherited(target: Target) -> set[str]:
    """The figures a target that extends another takes unchanged from it (none for a file of its own)."""
    if not target.base:
        return set()
    from dabench_ir.targets import load_target

    base = dict(load_target(target.base).quantities())
    return {n for n, q in target.quantities() if n in base and (base[n].value, base[n].source) == (q.value, q.source)}


def render_parameters(target: Target) -> str:
    """Every number the models of ``target`` use: value, basis (sourced / fitted / estimate), source;
    a fitted parameter also names the catalogue points it was fitted to."""
    inherited = _inherited(target)
    rows = [
        (name, f"{q.value:.6g}", basis(q), f"({target.base}) {q.source}" if name in inherited else q.source)
        for name, q in target.quantities()
    ]
    points = fitted_points(target)
    width = [max(len(r[i]) for r in rows) for i in range(3)]
    head = f"{target.name} [{target.kind}] from {target.origin}: {len(rows)} figures, " + ", ".join(
        f"{sum(1 for r in rows if r[2] == b)} {b}" for b in ("sourced", "fitted", "estimate")
    )
    if target.base:
        head += (
            f"; extends {target.base}: {len(rows) - len(inherited)} its own, {len(inherited)} marked ({target.base})"
        )
    lines = [head]
    for n, v, b, src in rows:
        lines.append(f"  {n.ljust(width[0])}  {v.rjust(width[1])}  {b.ljust(width[2])}  {src}")
        if n in points:
            lines.append(
                f"  {'':{width[0]}}  {'':{width[1]}}  {'':{width[2]}}  fitted to {len(points[n])} point(s): "
                + ", ".join(points[n])
            )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    rule = node_scaling(args)
    if args.normalize_to is not None:
        from dabench_ir.energy import check_process_node

        check_process_node(args.normalize_to)
    if args.show and (args.catalog or args.normalize_to is not None):
        flag = "--catalog" if args.catalog else "--normalize-to"
        raise UserError(f"--show prints one target's figures; {flag} applies to the table of every target: drop one")
    if args.show:
        from dabench_ir.targets import load_target, target_files

        target = load_target(args.show)
        if args.json:
            doc = {"schema": "dabench-ir/targets/v1", "targets": [target_dict(target)]}
            _write_json(doc, args.json, target_files(args.show))  # the shown file is an input
        else:
            print(render_parameters(target))
        return 0
    if args.json:
        doc: dict = {"schema": "dabench-ir/targets/v1"}
        if args.catalog:
            doc["catalog"] = catalog_rows()
        else:
            doc["targets"] = [target_dict(t) for t in list_targets()]
            doc["efficiency"] = [target_row(t) for t in list_targets()]
        if args.normalize_to is not None:
            from dabench_ir.energy import normalize

            for row in doc.get("catalog") or doc["efficiency"]:
                row["normalized"] = normalize(
                    row.get("gops"),
                    row.get("gops_per_w"),
                    row["node_nm"],
                    args.normalize_to,
                    gops_per_mm2=row.get("gops_per_mm2"),
                    rule=rule,
                )
            doc["normalized_to_nm"], doc["scaling"] = args.normalize_to, rule
        _write_json(doc, args.json)
        return 0
    if args.catalog:
        print(render_efficiency(catalog_rows(), args.normalize_to, rule, title="published designs"))
        return 0
    targets = list_targets()
    if args.normalize_to is not None:
        print(render_efficiency([target_row(t) for t in targets], args.normalize_to, rule, title="targets"))
        return 0
    for target in targets:
        print("\n".join(describe(target)))
    print("cpu [cpu] the host, measured by `dabench-ir calibrate` (loaded with --target cpu)")
    print("* estimate; every figure's source is in targets/<name>.toml")
    return 0


def target_row(target: Target) -> dict:
    """A target's peak efficiency figures at its own node (16-bit peak, rated power)."""
    from dabench_ir.energy import target_area_mm2

    peak = max(target.peak_flops(d) for d in ("fp16", "bf16")) / 1e9
    area = target_area_mm2(target)
    return {
        "name": target.name,
        "platform": target.kind,
        "node_nm": target.node_nm,
        "gops": peak,
        "gops_per_w": peak / target.watts if target.watts else None,
        "gops_per_mm2": peak / area if area else None,
        "estimate": target.power.estimate or target.process_node.estimate,
    }


def catalog_rows() -> list[dict]:
    from dabench_ir.energy import load_catalog

    return load_catalog()


def render_efficiency(rows: list[dict], to_nm: float | None, rule: str, *, title: str) -> str:
    """GOP/s, GOP/s/W and GOP/s/mm² as given and (with ``to_nm``) normalised to one node."""
    from dabench_ir.energy import normalize

    head = ["name", "platform", "nm", "GOP/s", "GOP/s/W", "GOP/s/mm²"]
    if to_nm is not None:
        head += [f"GOP/s @{to_nm:g}", f"GOP/s/W @{to_nm:g}", f"GOP/s/mm² @{to_nm:g}"]
    body = []
    fmt = lambda x: "-" if x is None else f"{x:,.3g}" if x < 1000 else f"{x:,.0f}"  # noqa: E731
    for r in rows:
        mark = " (unverified)" if not r.get("verified", True) else " *" if r.get("estimate") else ""
        line = [
            r["name"] + mark,
            r["platform"],
            f"{r['node_nm']:g}",
            fmt(r.get("gops")),
            fmt(r.get("gops_per_w")),
            fmt(r.get("gops_per_mm2")),
        ]
        if to_nm is not None:
            n = normalize(
                r.get("gops"), r.get("gops_per_w"), r["node_nm"], to_nm, gops_per_mm2=r.get("gops_per_mm2"), rule=rule
            )
            line += [fmt(n["gops"]), fmt(n["gops_per_w"]), fmt(n["gops_per_mm2"])]
        body.append(line)
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
    out = [f"{title}" + (f", normalised to {to_nm:g} nm ({rule} scaling, docs/energy.md)" if to_nm else "")]
    out.append(
        "  ".join(h.ljust(w) if i < 2 else h.rjust(w) for i, (h, w) in enumerate(zip(head, widths, strict=True)))
    )
    for b in body:
        out.append(
            "  ".join(v.ljust(w) if i < 2 else v.rjust(w) for i, (v, w) in enumerate(zip(b, widths, strict=True)))
        )
    if any(r.get("estimate") for r in rows):
        out.append("* power or process node is an estimate (see the target file)")
    return "\n".join(out)
