"""Probe the emulated WSE-2, SN30 and Bow IPU on configurations like a held-out catalogue's.

Writes bench/heldout_probe.toml (the probe catalogue, in the measurement format, with no measured
values: these are not measurements) and prints one row of predictions per point, so that
trends (layers, hidden, opt level, batch, precision, chips, depth, fit limits) can be read off.

    .venv/bin/python bench/heldout_probe.py [--only sn30|wse2|bow] [--write-only]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TOML = HERE / "heldout_probe.toml"

_SN30_SHAPES = [
    ("tiny", 480, 8, 12),
    ("small", 768, 12, 12),
    ("medium", 1024, 16, 24),
    ("large", 1280, 20, 36),
    ("xl", 1600, 25, 42),
]
"""The DABench-LLM SN30 model list: name, hidden, heads, layers."""
_CGPT = [
    ("111m", 768, 12, 10),
    ("256m", 1088, 17, 14),
    ("590m", 1536, 12, 18),
    ("1.3b", 2048, 16, 24),
    ("2.7b", 2560, 32, 32),
    ("6.7b", 4096, 32, 32),
    ("13b", 5120, 40, 40),
]
"""Cerebras-GPT's sizes, as `_SN30_SHAPES`: name, hidden, heads, layers."""


def _point(pid: str, target: str, model: str, run: str) -> str:
    return (
        f'[[points]]\nid = "{pid}"\nkind = "model"\ntarget = "{target}"\nsource = "probe (not a measurement)"\n'
        f"model = {{ {model} }}\nrun = {{ {run} }}\nexpect = {{ fits = true }}\n"
    )


def _gpt2(L: int, h: int, n: int, s: int, b: int) -> str:
    """A GPT-2 decoder's model table: ``L`` layers, hidden ``h``, ``n`` heads, seq ``s``, batch ``b``."""
    return f'family = "gpt2", layers = {L}, hidden = {h}, heads = {n}, seq = {s}, vocab = 50257, batch = {b}'


def _sn30(prec: str, opt: str) -> str:
    return f'mode = "train", precision = "{prec}", opt_level = "{opt}", tiles = 4, resource_scaling = [0.8, 0.8, 0.8]'


def _wse(mode: str) -> str:
    return f'mode = "train", precision = "mixed", wse_mode = "{mode}"'


def _bow(p: int, mb: int, ga: int, lpi: str = "") -> str:
    return (
        f'mode = "train", precision = "mixed", ipus = {p}, micro_batch = {mb}, gradient_accumulation = {ga}, '
        f'recompute = true, matmul_proportion = 0.15, optimizer_state = "offchip"{lpi}'
    )


def points() -> list[str]:
    """The probe points, as TOML tables."""
    out = []
    # SN30: the DABench-LLM model list at O0/O3; a depth sweep at 768; batch; precision
    out += [
        _point(f"sn30-{name}-L{L}-{opt}", "sn30", _gpt2(L, h, n, 1024, 16), _sn30("mixed", opt))
        for name, h, n, L in _SN30_SHAPES
        for opt in ("O3", "O0")
    ]
    out += [
        _point(f"sn30-small-L{L}-O3", "sn30", _gpt2(L, 768, 12, 1024, 16), _sn30("mixed", "O3")) for L in (1, 6, 24, 48)
    ]
    out += [
        _point(f"sn30-small-L12-{opt}-b{b}", "sn30", _gpt2(12, 768, 12, 1024, b), _sn30("mixed", opt))
        for b in (4, 8, 32, 64)
        for opt in ("O3", "O0")
    ]
    out += [
        _point(f"sn30-{name}-L{L}-O3-{prec}", "sn30", _gpt2(L, h, n, 1024, 16), _sn30(prec, "O3"))
        for name, h, n, L in _SN30_SHAPES[1:3]
        for prec in ("fp32", "bf16")
    ]
    # WSE-2: pipelined GPT-2 compiles (depth sweep at 768; medium, large), Cerebras-GPT streaming and auto
    out += [
        _point(f"wse-gpt2-small-L{L}-pipe", "wse2", _gpt2(L, 768, 12, 1024, 1), _wse("pipelined"))
        for L in (1, 2, 4, 6, 12, 24, 36, 48)
    ]
    out += [
        _point(f"wse-gpt2-{name}-L{L}-{m}", "wse2", _gpt2(L, h, n, 1024, 1), _wse(m))
        for name, h, n, L in (("medium", 1024, 16, 24), ("large", 1280, 20, 36), ("xl", 1600, 25, 48))
        for m in ("pipelined", "auto")
    ]
    out += [
        _point(f"wse-cgpt-{name}-b128-{m}", "wse2", _gpt2(L, h, n, 2048, 128), _wse(m))
        for name, h, n, L in _CGPT
        for m in ("streaming", "auto")
    ]
    out += [
        _point(f"wse-cgpt-{name}-b{b}-streaming", "wse2", _gpt2(L, h, n, 2048, b), _wse("streaming"))
        for name, h, n, L in (_CGPT[1], _CGPT[3], _CGPT[6])
        for b in (32, 64, 256, 512)
    ]
    out += [
        _point(f"wse-13b-depth{L}-b128-streaming", "wse2", _gpt2(L, 5120, 40, 2048, 128), _wse("streaming"))
        for L in (40, 80, 160, 320, 640)
    ]
    # Bow IPU: GPT-2 small/medium training, micro-batch 1..4, gradient accumulation 16..2048, 4/8/16 IPUs
    small, medium = ", layers_per_ipu = [0, 4, 4, 4]", ", layers_per_ipu = [0, 3, 3, 3, 3, 4, 4, 4]"
    out += [
        _point(f"bow-small-4ipu-mb1-ga{ga}", "bow", _gpt2(12, 768, 12, 1024, ga), _bow(4, 1, ga, small))
        for ga in (16, 64, 256, 1024, 2048)
    ]
    out += [
        _point(f"bow-small-4ipu-mb{mb}-ga256", "bow", _gpt2(12, 768, 12, 1024, 256 * mb), _bow(4, mb, 256, small))
        for mb in (2, 4)
    ]
    out += [
        _point(f"bow-medium-8ipu-mb1-ga{ga}", "bow", _gpt2(24, 1024, 16, 1024, ga), _bow(8, 1, ga, medium))
        for ga in (16, 256, 2048)
    ]
    # capacity: layers per IPU count (fit only), small width, seq 1024, micro-batch 1
    out += [
        _point(f"bow-fit-h768-{p}ipu-L{L}", "bow", _gpt2(L, 768, 12, 1024, 64), _bow(p, 1, 64))
        for p in (1, 2, 4, 8, 16)
        for L in (2, 4, 6, 8, 12, 16, 24, 36, 48, 64)
        if p - 1 <= L
    ]
    return out


def write() -> Path:
    TOML.write_text(
        "# Probe configurations (NOT measurements): bench/heldout_probe.py writes this file.\n"
        'format = "dabench-ir/measurements/v1"\n\n' + "\n".join(points())
    )
    return TOML


def _row(p, res, report, plan) -> dict:
    from dabench_ir.validate.predict import device_s, host_s, max_pcu, sections_of

    row = {
        "id": p.id,
        "fits": None,
        "sps": None,
        "step": None,
        "host": None,
        "dev": None,
        "sec": None,
        "pcu": None,
        "alloc": None,
        "li": None,
        "eff": None,
        "mode": "",
    }
    if report is None:
        row["fits"] = bool(plan.fits)
        if not plan.fits and plan.failure is not None:
            row["mode"] = plan.failure.reason[:60]
        return row
    row["fits"] = bool(report.fits)
    if not report.fits:
        row["mode"] = (report.failure or {}).get("reason", "")[:60]
        return row
    m = report.metrics
    row.update(
        sps=report.totals.get("throughput_samples_per_s"),
        step=report.totals.get("time_s"),
        host=host_s(report),
        dev=device_s(report),
        sec=sections_of(report),
        pcu=max_pcu(report),
        alloc=m.get("allocation_ratio"),
        li=m.get("load_imbalance", m.get("li")),
        eff=m.get("compute_efficiency"),
    )
    kinds = sorted({str(u.get("kind", "")).split(":")[0] for u in report.units})
    row["mode"] = ",".join(k for k in kinds if k)[:40]
    return row


def run(only: str | None) -> list[dict]:
    from dabench_ir.lowering import lower
    from dabench_ir.run import execute, lowering_options, prepare, resolve
    from dabench_ir.sweep.graphs import default_cache
    from dabench_ir.targets import load_target
    from dabench_ir.validate import PointResult, load_catalog
    from dabench_ir.validate.cache import GraphCache
    from dabench_ir.validate.runner import options_of_point, per_replica_model

    graphs = GraphCache(default_cache(), lambda m: print("  ", m, file=sys.stderr))
    rows = []
    for p in load_catalog(TOML):
        if only and not (p.target.startswith(only) or p.id.startswith(only)):
            continue
        target = load_target(p.target)
        res = PointResult(p)
        try:
            opts = options_of_point(p, target.kind, res)
            graph = graphs.graph(per_replica_model(p, opts))
            run = resolve(graph, target, opts)  # the run validate asks, through the one orchestration
            if p.id.startswith("bow-fit"):
                rows.append(_row(p, res, None, lower(prepare(run, graph), target, lowering_options(run))))
            else:
                rows.append(_row(p, res, execute(run, graph), None))
        except Exception as exc:  # a probe reports, it does not stop
            rows.append({"id": p.id, "fits": None, "mode": f"ERROR {type(exc).__name__}: {exc}"[:90]})
        r = rows[-1]
        print(_fmt(r), flush=True)
    return rows


def _f(v, nd=3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and (math.isnan(v) or v <= 0):
        return f"!{v}"
    return f"{v:.{nd}g}"


def _fmt(r: dict) -> str:
    return (
        f"{r['id']:34s} {r.get('fits')!s:5s} sps={_f(r.get('sps'), 4):>7s} step={_f(r.get('step'))} "
        f"host={_f(r.get('host'))} dev={_f(r.get('dev'))} sec={_f(r.get('sec'), 4)} pcu={_f(r.get('pcu'))} "
        f"alloc={_f(r.get('alloc'))} li={_f(r.get('li'))} eff={_f(r.get('eff'))} {r.get('mode', '')}"
    )


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--only")
    ap.add_argument("--write-only", action="store_true")
    a = ap.parse_args()
    write()
    if not a.write_only:
        run(a.only)
