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

_SN30_RUN = 'mode = "train", precision = "{prec}", opt_level = "{opt}", tiles = 4, resource_scaling = [0.8, 0.8, 0.8]'
_SN30_SHAPES = [
    ("tiny", 480, 8, 12),
    ("small", 768, 12, 12),
    ("medium", 1024, 16, 24),
    ("large", 1280, 20, 36),
    ("xl", 1600, 25, 42),
]
_CGPT = [
    ("111m", 10, 768, 12),
    ("256m", 14, 1088, 17),
    ("590m", 18, 1536, 12),
    ("1.3b", 24, 2048, 16),
    ("2.7b", 32, 2560, 32),
    ("6.7b", 32, 4096, 32),
    ("13b", 40, 5120, 40),
]


def _point(pid: str, target: str, model: str, run: str) -> str:
    return (
        f'[[points]]\nid = "{pid}"\nkind = "model"\ntarget = "{target}"\nsource = "probe (not a measurement)"\n'
        f"model = {{ {model} }}\nrun = {{ {run} }}\nexpect = {{ fits = true }}\n"
    )


def points() -> list[str]:
    """The probe points, as TOML tables."""
    out = []
    gpt2 = 'family = "gpt2", layers = {L}, hidden = {h}, heads = {n}, seq = {s}, vocab = 50257, batch = {b}'
    # SN30: the DABench-LLM model list at O0/O3; a depth sweep at 768; batch; precision
    for name, h, n, L in _SN30_SHAPES:
        for opt in ("O3", "O0"):
            out.append(
                _point(
                    f"sn30-{name}-L{L}-{opt}",
                    "sn30",
                    gpt2.format(L=L, h=h, n=n, s=1024, b=16),
                    _SN30_RUN.format(prec="mixed", opt=opt),
                )
            )
    for L in (1, 6, 24, 48):
        out.append(
            _point(
                f"sn30-small-L{L}-O3",
                "sn30",
                gpt2.format(L=L, h=768, n=12, s=1024, b=16),
                _SN30_RUN.format(prec="mixed", opt="O3"),
            )
        )
    for b in (4, 8, 32, 64):
        for opt in ("O3", "O0"):
            out.append(
                _point(
                    f"sn30-small-L12-{opt}-b{b}",
                    "sn30",
                    gpt2.format(L=12, h=768, n=12, s=1024, b=b),
                    _SN30_RUN.format(prec="mixed", opt=opt),
                )
            )
    for name, h, n, L in _SN30_SHAPES[1:3]:
        out.append(
            _point(
                f"sn30-{name}-L{L}-O3-fp32",
                "sn30",
                gpt2.format(L=L, h=h, n=n, s=1024, b=16),
                _SN30_RUN.format(prec="fp32", opt="O3"),
            )
        )
        out.append(
            _point(
                f"sn30-{name}-L{L}-O3-bf16",
                "sn30",
                gpt2.format(L=L, h=h, n=n, s=1024, b=16),
                _SN30_RUN.format(prec="bf16", opt="O3"),
            )
        )
    # WSE-2: pipelined GPT-2 compiles (depth sweep at 768; medium, large), Cerebras-GPT streaming and auto
    pipe = 'mode = "train", precision = "mixed", wse_mode = "{m}"'
    for L in (1, 2, 4, 6, 12, 24, 36, 48):
        out.append(
            _point(
                f"wse-gpt2-small-L{L}-pipe",
                "wse2",
                gpt2.format(L=L, h=768, n=12, s=1024, b=1),
                pipe.format(m="pipelined"),
            )
        )
    for name, h, n, L in (("medium", 1024, 16, 24), ("large", 1280, 20, 36), ("xl", 1600, 25, 48)):
        for m in ("pipelined", "auto"):
            out.append(
                _point(f"wse-gpt2-{name}-L{L}-{m}", "wse2", gpt2.format(L=L, h=h, n=n, s=1024, b=1), pipe.format(m=m))
            )
    for name, L, h, n in _CGPT:
        for m in ("streaming", "auto"):
            out.append(
                _point(f"wse-cgpt-{name}-b128-{m}", "wse2", gpt2.format(L=L, h=h, n=n, s=2048, b=128), pipe.format(m=m))
            )
    for name, L, h, n in (_CGPT[1], _CGPT[3], _CGPT[6]):
        for b in (32, 64, 256, 512):
            out.append(
                _point(
                    f"wse-cgpt-{name}-b{b}-streaming",
                    "wse2",
                    gpt2.format(L=L, h=h, n=n, s=2048, b=b),
                    pipe.format(m="streaming"),
                )
            )
    for L in (40, 80, 160, 320, 640):
        out.append(
            _point(
                f"wse-13b-depth{L}-b128-streaming",
                "wse2",
                gpt2.format(L=L, h=5120, n=40, s=2048, b=128),
                pipe.format(m="streaming"),
            )
        )
    # Bow IPU: GPT-2 small/medium training, micro-batch 1..4, gradient accumulation 16..2048, 4/8/16 IPUs
    ipu = (
        'mode = "train", precision = "mixed", ipus = {p}, micro_batch = {mb}, gradient_accumulation = {ga}, '
        'recompute = true, matmul_proportion = 0.15, optimizer_state = "offchip"{lpi}'
    )
    for ga in (16, 64, 256, 1024, 2048):
        out.append(
            _point(
                f"bow-small-4ipu-mb1-ga{ga}",
                "bow",
                gpt2.format(L=12, h=768, n=12, s=1024, b=ga),
                ipu.format(p=4, mb=1, ga=ga, lpi=", layers_per_ipu = [0, 4, 4, 4]"),
            )
        )
    for mb in (2, 4):
        out.append(
            _point(
                f"bow-small-4ipu-mb{mb}-ga256",
                "bow",
                gpt2.format(L=12, h=768, n=12, s=1024, b=256 * mb),
                ipu.format(p=4, mb=mb, ga=256, lpi=", layers_per_ipu = [0, 4, 4, 4]"),
            )
        )
    for ga in (16, 256, 2048):
        out.append(
            _point(
                f"bow-medium-8ipu-mb1-ga{ga}",
                "bow",
                gpt2.format(L=24, h=1024, n=16, s=1024, b=ga),
                ipu.format(p=8, mb=1, ga=ga, lpi=", layers_per_ipu = [0, 3, 3, 3, 3, 4, 4, 4]"),
            )
        )
    # capacity: layers per IPU count (fit only), small width, seq 1024, micro-batch 1
    for p in (1, 2, 4, 8, 16):
        for L in (2, 4, 6, 8, 12, 16, 24, 36, 48, 64):
            if p - 1 > L:
                continue
            out.append(
                _point(
                    f"bow-fit-h768-{p}ipu-L{L}",
                    "bow",
                    gpt2.format(L=L, h=768, n=12, s=1024, b=64),
                    ipu.format(p=p, mb=1, ga=64, lpi=""),
                )
            )
    return out


def write() -> Path:
    TOML.write_text(
        "# Probe configurations (NOT measurements): bench/heldout_probe.py writes this file.\n"
        'format = "dabench-ir/measurements/v1"\n\n' + "\n".join(points())
    )
    return TOML


def _row(p, res, report, plan) -> dict:
    from dabench_ir.validate.predict import _device_s, _host_s, _max_pcu, _sections

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
        host=_host_s(report),
        dev=_device_s(report),
        sec=_sections(report),
        pcu=_max_pcu(report),
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
    from dabench_ir.targets import load_target
    from dabench_ir.validate import PointResult, load_catalog
    from dabench_ir.validate.cache import _default_cache, _GraphCache
    from dabench_ir.validate.runner import _options, _per_replica_model

    graphs = _GraphCache(_default_cache(), lambda m: print("  ", m, file=sys.stderr))
    rows = []
    for p in load_catalog(TOML):
        if only and not (p.target.startswith(only) or p.id.startswith(only)):
            continue
        target = load_target(p.target)
        res = PointResult(p)
        try:
            opts = _options(p, target.kind, res)
            graph = graphs.graph(_per_replica_model(p, opts))
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
