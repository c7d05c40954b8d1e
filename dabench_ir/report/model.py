"""`Report`: everything the renderers need, and its JSON form (schema dabench-ir/report/v1)."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from dabench_ir.errors import UserError
from dabench_ir.fileio import write_output, write_with
from dabench_ir.ir import Cost

__all__ = [
    "COST_FIELDS",
    "SCHEMA",
    "NodeRecord",
    "Report",
    "check_report_dict",
    "csv_cell",
    "json_bytes",
    "json_safe",
    "json_text",
]

SCHEMA = "dabench-ir/report/v1"


@dataclass(slots=True)
class NodeRecord:
    """One graph node's row: its cost, and where and how long it ran (when known)."""

    name: str
    op_type: str
    layer: int | None
    scope: str
    op_class: str | None
    cost: Cost | None  # None: unattributed
    intensity: float | None = None
    time_s: float | None = None
    start_s: float | None = None
    bound: str | None = None
    unit: str | None = None
    measured_time_s: float | None = None
    measured_spread: float | None = None  # IQR / median of the node's measured runs
    predicted_time_s: float | None = None
    energy_j: float | None = None
    precision: str | None = None
    note: str | None = None
    role: str | None = None  # module role across layers (report.roles)
    feed_bytes: float | None = None  # bytes at its feed level, as its roofline point counts them (metrics)

    @property
    def flops(self) -> int | None:
        c = self.cost
        return None if c is None else c.flops

    @property
    def bytes(self) -> int | None:
        c = self.cost
        return None if c is None else c.bytes

    def to_dict(self) -> dict[str, Any]:
        c = self.cost if self.cost is not None else _NO_COST  # one test, not one per cost column
        x = self.intensity
        return {
            "name": self.name,
            "op_type": self.op_type,
            "layer": self.layer,
            "scope": self.scope,
            "op_class": self.op_class,
            "flops": c.flops,
            "bytes": c.bytes,
            "intensity": x if x is None or math.isfinite(x) else None,
            "time_s": self.time_s,
            "bound": self.bound,
            "unit": self.unit,
            "measured_time_s": self.measured_time_s,
            "measured_spread_rel": self.measured_spread,
            "predicted_time_s": self.predicted_time_s,
            "start_s": self.start_s,
            "energy_j": self.energy_j,
            "precision": self.precision,
            "contraction_flops": c.contraction_flops,
            "vector_flops": c.vector_flops,
            "special_ops": c.special_ops,
            "weight_bytes": c.weight_bytes,
            "act_bytes_in": c.act_bytes_in,
            "act_bytes_out": c.act_bytes_out,
            "note": self.note,
            "role": self.role,
            "feed_bytes": self.feed_bytes,
        }


COST_FIELDS = tuple(f.name for f in fields(Cost))
"""A node's cost columns, in `Cost`'s field order (``flops`` and ``bytes`` are their sums)."""
_NO_COST = SimpleNamespace(flops=None, bytes=None, **dict.fromkeys(COST_FIELDS))
"""An unattributed node's cost columns in `NodeRecord.to_dict`: every one None."""


CSV_COLUMNS = list(NodeRecord(name="", op_type="", layer=None, scope="", op_class=None, cost=None).to_dict())


@dataclass(slots=True)
class Report:
    """A profile's result. ``to_dict()`` is the public JSON contract; add fields, never rename."""

    model: dict[str, Any]
    target: dict[str, Any] | None
    config: dict[str, Any]
    nodes: list[NodeRecord]
    unattributed: list[dict[str, Any]]
    totals: dict[str, Any]
    metrics: dict[str, Any] = field(default_factory=dict)
    units: list[dict[str, Any]] = field(default_factory=list)
    fits: bool | None = True
    failure: dict[str, Any] | None = None
    flop_convention: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    graph: Any = field(default=None, repr=False)  # the annotated Graph, for renderers
    timeline: Any = field(default=None, repr=False)
    target_obj: Any = field(default=None, repr=False)
    plan: Any = field(default=None, repr=False)  # the lowering's Plan (units for the trace, the why lines)
    options: Any = field(default=None, repr=False)  # the ProfileOptions the report was made with
    run: Any = field(default=None, repr=False)  # the dabench_ir.run.ResolvedRun the report answers
    measured_timeline: Any = field(default=None, repr=False)  # the host's measured Timeline, beside a prediction
    why: list[dict[str, Any]] = field(default_factory=list)  # report.why.explain: the top roles in words
    advice: Any = field(default=None, repr=False)  # dabench_ir.advice.Advice: the variant runs the why lines read
    scaling: Any = field(default=None, repr=False)  # dabench_ir.scaling.ScaleResult of a multi-chip run
    saved_roles: list[dict[str, Any]] | None = field(default=None, repr=False)  # the roles of a report read back
    _tables: tuple[list[dict[str, Any]], list[dict[str, Any]]] | None = field(
        default=None, init=False, repr=False, compare=False
    )  # share_tables, once

    # -- views ----------------------------------------------------------------------
    def node(self, name: str) -> NodeRecord:
        for record in self.nodes:
            if record.name == name:
                return record
        raise KeyError(name)

    @property
    def attributed(self) -> list[NodeRecord]:
        return [n for n in self.nodes if n.cost is not None]

    @property
    def has_times(self) -> bool:
        return any(n.time_s is not None for n in self.nodes)

    def by_layer(self) -> dict[int | None, Cost]:
        out: dict[int | None, Cost] = {}
        for n in self.attributed:
            out[n.layer] = out.get(n.layer, Cost()) + n.cost
        return out

    def group_time(self, key: str) -> dict[Any, float]:
        """Total node time grouped by a NodeRecord attribute (op_type, layer, bound, unit, ...)."""
        out: dict[Any, float] = {}
        for n in self.nodes:
            if n.time_s is not None:
                k = getattr(n, key)
                out[k] = out.get(k, 0.0) + n.time_s
        return out

    # -- serialisation --------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "model": self.model,
            "target": self.target,
            "config": self.config,
            "fits": self.fits,
            "failure": self.failure,
            "flop_convention": self.flop_convention,
            "totals": self.totals,
            "metrics": self.metrics,
            "units": self.units,
            "nodes": [n.to_dict() for n in self.nodes],
            "unattributed": self.unattributed,
            **({"extra": self.extra} if self.extra else {}),
            **self._grouped(),
        }

    def share_tables(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The role rows and the representative layer (`attribution.role_rows`, `representative_layer`)
        of the finished report, worked out once: the physics verifier checks the very rows `to_dict`
        writes (each was built twice a run: ~4 % of a sweep point). Read-only; `to_dict` copies them."""
        if self._tables is None:
            from dabench_ir.report import attribution

            self._tables = (attribution.role_rows(self), attribution.representative_layer(self))
        return self._tables

    def _grouped(self) -> dict[str, Any]:
        """The grouped views (added keys): roles, overheads, representative layer, collapsed layers, why."""
        from dabench_ir.report.attribution import layer_runs, overhead_rows

        roles, representative = self.share_tables()
        return {
            "roles": [dict(r) for r in roles],
            "overheads": {r["role"].split(": ", 1)[1]: r["time_s"] for r in overhead_rows(self)},
            "representative_layer": [dict(r) for r in representative],
            "layer_runs": layer_runs(self),
            "why": list(self.why),
        }

    def to_json(self, indent: int | None = 1) -> str:
        """The JSON text (`json_text`); ``indent=None`` is compact (and several times faster to write)."""
        return json_text(self.to_dict(), indent=indent)

    def _output(self, path: str | Path) -> Path:
        """``path`` checked as an output of this report: never the model file it was made from (an
        `ApiError` otherwise, as every bad argument of the Python API)."""
        from dabench_ir.api import ApiError
        from dabench_ir.fileio import check_output_path

        model = (self.model or {}).get("path")
        try:
            return check_output_path(path, "path", inputs=[model] if model else [])
        except UserError as exc:
            raise ApiError(str(exc)) from None

    def write_json(self, path: str | Path) -> Path:
        """Indented for small reports; compact past a few hundred nodes (`json_bytes`), where indentation
        would force json's pure-Python encoder and dominate the whole profile's time."""
        small = len(self.nodes) <= 300
        return write_output(self._output(path), self.to_json(indent=1) if small else json_bytes(self.to_dict()))

    def write_csv(self, path: str | Path) -> Path:
        """One row per node, then one per step cost no node owns, so that the ``time_s`` column
        sums to the step (``totals.time_s``); columns `CSV_FILE_COLUMNS`. ``kind`` labels a row:
        ``node``; ``overhead`` (host time, reconfiguration, memory stalls, fill/drain,
        collectives: ``name`` is its role, ``overhead: section_reconfig``); ``overlap`` (negative:
        the busy time concurrent nodes share, on a target that runs them at once, WSE or IPU);
        ``remainder`` (step time neither nodes nor overheads account for; or energy no row holds);
        ``idle`` (the static energy drawn while no node runs and no overhead row is counted).
        The ``energy_j`` column sums to the step's (``totals.energy_j``) the same way: node rows,
        overhead rows (``totals.overhead_energy_j``), the idle row, a remainder (a multi-chip
        step's other chips and links). Text cells a spreadsheet would read as a formula are neutralised."""
        head = {"model": _csv_model_name(self), "target": (self.target or {}).get("name")}

        def write(fh) -> None:
            writer = csv.DictWriter(fh, fieldnames=CSV_FILE_COLUMNS)
            writer.writeheader()
            for row in [*({**head, "kind": "node", **n.to_dict()} for n in self.nodes), *_step_rows(self, head)]:
                writer.writerow({k: csv_cell(row.get(k)) for k in CSV_FILE_COLUMNS})

        return write_with(self._output(path), write)

    def write_roles_csv(self, path: str | Path) -> Path:
        """One row per module role and per overhead (columns: ``model``, ``target``, then
        `attribution.ROLE_COLUMNS`); the ``time_s`` column sums to the summed time
        (`attribution.TIME_BASIS`)."""
        from dabench_ir.report.attribution import ROLE_COLUMNS, role_rows

        head = {"model": _csv_model_name(self), "target": (self.target or {}).get("name")}
        columns = [*head, *ROLE_COLUMNS]

        def write(fh) -> None:
            writer = csv.DictWriter(fh, fieldnames=columns)
            writer.writeheader()
            for row in role_rows(self):
                writer.writerow({k: csv_cell({**head, **row}[k]) for k in columns})

        return write_with(self._output(path), write)

    def to_pandas(self, by: str = "node"):
        """A DataFrame of the nodes (``by="node"``: the CSV's columns, one row per node) or of the module
        roles and overheads (``by="role"``: the roles CSV's columns). Needs the ``pandas`` extra."""
        from dabench_ir.report.attribution import ROLE_COLUMNS, role_rows

        if by not in ("node", "role"):
            raise ValueError(f"to_pandas(by={by!r}): expected 'node' or 'role'")
        try:
            import pandas as pd
        except ImportError:
            raise ImportError("Report.to_pandas() needs pandas: pip install 'dabench-ir[pandas]'") from None
        if by == "node":
            return pd.DataFrame([n.to_dict() for n in self.nodes], columns=CSV_COLUMNS)
        rows = self.saved_roles if self.saved_roles is not None else role_rows(self)
        return pd.DataFrame([{k: r.get(k) for k in ROLE_COLUMNS} for r in rows], columns=list(ROLE_COLUMNS))

    @classmethod
    def from_json(cls, path: str | Path) -> Report:
        """A report written by ``profile --json`` (or `write_json`), read back: its tables as written,
        nodes as NodeRecords; no graph, timeline or plan (renderers that need them say so). A file
        that is no report (not JSON, another schema, a field missing or of the wrong type) is an
        `ApiError` naming what is wrong: this is the Python API's reader."""
        from dabench_ir.api import ApiError
        from dabench_ir.fileio import read_text_file

        where = str(path)
        try:
            data = json.loads(read_text_file(path))
            if not isinstance(data, dict) or data.get("schema") != SCHEMA:
                raise UserError(
                    f"{where}: not a dabench-ir report (schema {SCHEMA}); give a file written by profile --json"
                )
            check_report_dict(data, where)
        except (json.JSONDecodeError, RecursionError) as exc:
            what = f"{exc.msg} at line {exc.lineno}" if isinstance(exc, json.JSONDecodeError) else "nested too deeply"
            raise ApiError(f"{where}: not JSON ({what})") from None
        except UserError as exc:
            raise ApiError(str(exc)) from None
        return cls(
            model=data.get("model") or {},
            target=data.get("target"),
            config=data.get("config") or {},
            nodes=[_node_from_dict(n) for n in data.get("nodes") or []],
            unattributed=data.get("unattributed") or [],
            totals=data.get("totals") or {},
            metrics=data.get("metrics") or {},
            units=data.get("units") or [],
            fits=data.get("fits"),
            failure=data.get("failure"),
            flop_convention=data.get("flop_convention", ""),
            extra=data.get("extra") or {},
            why=data.get("why") or [],
            saved_roles=data.get("roles"),
        )


CSV_FILE_COLUMNS = ["model", "target", "kind", *CSV_COLUMNS]
"""The per-node CSV's columns (`Report.write_csv`): which model and target, the row's kind, then
a node's `NodeRecord.to_dict` keys."""


def _csv_model_name(report: Report) -> str:
    from dabench_ir.report.compare import model_name

    return model_name({"model": report.model})


def _step_rows(report: Report, head: dict[str, Any]) -> list[dict[str, Any]]:
    """The CSV rows after the nodes: the overheads, then the overlap or remainder that makes the
    ``time_s`` column sum to the step exactly (``math.fsum``); none for a report without a step. A
    measured run's own rows no node owns (onnxruntime's session time between its kernels) carry their
    ``measured_time_s``, so that column sums to the measured step too."""
    from dabench_ir.plan import row_bound
    from dabench_ir.report.attribution import overhead_rows
    from dabench_ir.report.roles import overhead_role

    step = report.totals.get("time_s")
    if step is None:
        return []
    rows = [
        {
            **head,
            "kind": "overhead",
            "name": r["role"],
            "op_type": "overhead",
            "bound": r["bound"],
            "time_s": r["time_s"],
            "energy_j": r["energy_j"],
        }
        for r in overhead_rows(report)
    ]
    measured = (report.extra.get("measurement") or {}).get("overheads_s") or {}
    by_name = {row["name"]: row for row in rows}
    for name, seconds in measured.items():
        role = overhead_role(name)
        if role not in by_name:
            by_name[role] = {**head, "kind": "overhead", "name": role, "op_type": "overhead", "bound": row_bound(name)}
            rows.append(by_name[role])
        by_name[role]["measured_time_s"] = seconds
    times = [n.time_s for n in report.nodes if n.time_s is not None] + [r["time_s"] for r in rows if "time_s" in r]
    rest = float(step) - math.fsum(times)
    if abs(rest) > 1e-12 * abs(step):
        rest = _summing_to(float(step), times, rest)  # the column sums to the step exactly
        kind = "overlap" if rest < 0 else "remainder"
        name = (
            "overlap: busy time of nodes that run concurrently"
            if rest < 0
            else "remainder: step time no node or overhead accounts for"
        )
        rows.append({**head, "kind": kind, "name": name, "op_type": kind, "time_s": rest})
    return rows + _energy_rows(report, head, rows)


def _energy_rows(report: Report, head: dict[str, Any], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The CSV rows that make the ``energy_j`` column sum to the step's (``totals.energy_j``) after the
    node and overhead rows (``rows``): ``idle`` (the static power drawn while no node runs and no
    overhead row is counted: ``totals.idle_energy_j``), then a ``remainder`` for what no row holds
    (a multi-chip step: every other chip's, its links'; the node rows are one chip's). No time."""
    step = report.totals.get("energy_j")
    if step is None:
        return []
    out = []
    idle = report.totals.get("idle_energy_j")
    if idle:
        name = "idle: static energy while no node runs and no overhead row is counted"
        out.append({**head, "kind": "idle", "name": name, "op_type": "idle", "energy_j": idle})
    joules = [n.energy_j for n in report.nodes if n.energy_j is not None]
    joules += [r["energy_j"] for r in (*rows, *out) if r.get("energy_j") is not None]
    rest = float(step) - math.fsum(joules)
    if abs(rest) > 1e-12 * abs(step):
        rest = _summing_to(step, joules, rest)
        chips = "per_chip" in report.extra  # the node rows are one chip's share
        name = "remainder: energy no row holds" + (" (the other chips', the links')" if chips else "")
        out.append({**head, "kind": "remainder", "name": name, "op_type": "remainder", "energy_j": rest})
    return out


def _summing_to(total: float, parts: list[float], rest: float) -> float:
    """``rest`` nudged by the rounding of the subtraction that made it, until ``parts`` and it sum
    (``math.fsum``) to ``total`` exactly."""
    for _ in range(8):
        got = math.fsum([*parts, rest])
        if got == total:
            break
        rest = math.nextafter(rest, math.inf if got < total else -math.inf)
    return rest


_COLUMN_OF = {"measured_spread": "measured_spread_rel"}
"""NodeRecord fields whose `NodeRecord.to_dict` column has another name."""
_PLAIN_FIELDS = tuple(f.name for f in fields(NodeRecord) if f.name not in ("name", "op_type", "scope", "cost"))
"""NodeRecord fields read back from their column as written (None where it is missing)."""


def _node_from_dict(row: dict[str, Any]) -> NodeRecord:
    """A NodeRecord from its `NodeRecord.to_dict` row."""
    cost = None if row.get("flops") is None else Cost(**{k: row.get(k) or 0 for k in COST_FIELDS})
    return NodeRecord(
        name=row["name"],
        op_type=row.get("op_type", ""),
        scope=row.get("scope") or "",
        cost=cost,
        **{f: row.get(_COLUMN_OF.get(f, f)) for f in _PLAIN_FIELDS},
    )


_LEAVES = frozenset({str, int, bool, type(None)})  # returned as they are: no call per leaf


def json_safe(obj: Any) -> Any:
    """JSON has no NaN or infinity: those become null (tuples become lists)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: v if type(v) in _LEAVES else json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [v if type(v) in _LEAVES else json_safe(v) for v in obj]
    return obj


def json_text(data: Any, *, indent: int | None = None) -> str:
    """``data`` as JSON, NaN and infinity as null (JSON has neither): every report, trace and sweep
    record is written through here or `json_bytes`. Compact text is `json_bytes`'s, decoded. Indented text (small reports, for
    people) comes from json; its C encoder refuses a NaN, and only a report holding one pays for the
    walk that nulls them (`json_safe`)."""
    if indent is None:
        return json_bytes(data).decode()
    return _json_dumps(data, indent=indent, separators=(",", ": "))


def json_bytes(data: Any) -> bytes:
    """``data`` as compact JSON bytes (UTF-8), NaN and infinity as null: what a file is written from,
    without the text copy `json_text` makes (a 10,000-layer report is 250 MB).

    orjson writes it in one pass (~10x json's C encoder on a report's float-heavy node rows), with
    json as the fallback for what orjson refuses (an integer past 64 bits). orjson is asked for
    string keys first: its option for other keys (an int or None key, written as its text) doubles
    its time on every dict (a Level-1 record 6.6 -> 3.3 ms), and the text of string keys is the same
    either way; only data with such a key is encoded a second time."""
    import orjson

    for option in (None, orjson.OPT_NON_STR_KEYS):
        try:
            return orjson.dumps(data, default=_json_default, option=option)
        except TypeError:  # orjson.JSONEncodeError is one: a key that is not a string, an int past 64 bits
            continue
    return _json_dumps(data, indent=None, separators=(",", ":")).encode()


def _json_dumps(data: Any, *, indent: int | None, separators: tuple[str, str]) -> str:
    dump = dict(indent=indent, separators=separators, default=_json_default, allow_nan=False)
    try:
        return json.dumps(data, **dump)
    except ValueError:
        return json.dumps(json_safe(data), **dump)


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "as_dict"):
        return obj.as_dict()
    if isinstance(obj, float):  # a float subclass (numpy's float64): the number, as json writes it
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    return str(obj)


_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: Any) -> Any:
    """A value for a CSV cell: None as empty, and text that a spreadsheet would evaluate as a
    formula (leading ``= + - @``, tab or carriage return) prefixed with ``'`` so it stays text.
    Numbers are written as they are (a negative number is not a formula)."""
    if value is None:
        return ""
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value
    return value


REQUIRED_FIELDS = ("model", "target", "totals", "nodes")
"""The fields every report JSON has (`Report.to_dict` writes them all): one without them is no report."""
_REPORT_TABLES = {
    "model": dict,
    "totals": dict,
    "metrics": (dict, type(None)),
    "target": (dict, type(None)),
    "config": (dict, type(None)),
    "failure": (dict, type(None)),
    "units": (list, type(None)),
    "unattributed": (list, type(None)),
    "nodes": list,
    "fits": (bool, type(None)),
}
_REPORT_NUMBERS = frozenset(
    {
        "time_s",
        "throughput_samples_per_s",
        "achieved_flops_per_s",
        "measured_time_s",
        "allocation_ratio",
        "load_imbalance",
        "compute_efficiency",
        "target_power_w",
        "flops",
        "bytes",
        "energy_j",
    }
)
_NODE_NUMBERS = (
    "flops",
    "bytes",
    "intensity",
    "time_s",
    "start_s",
    "measured_time_s",
    "predicted_time_s",
    "energy_j",
    *COST_FIELDS,
)
_NODE_TEXT = ("name", "op_type", "scope", "op_class", "bound", "unit", "precision", "note")


def _is_number(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def check_report_dict(data: dict[str, Any], where: str = "report") -> dict[str, Any]:
    """Check a report read back from JSON (``compare``, `Report.from_json`): the `REQUIRED_FIELDS`
    are there, every table has its type, every node is an object whose numbers are numbers and whose
    texts are texts. A UserError names the first fault. The one schema of the report JSON."""
    from dabench_ir.errors import UserError

    def bad(what: str) -> UserError:
        return UserError(f"{where}: {what}; give a report written by profile --json")

    missing = [k for k in REQUIRED_FIELDS if k not in data]
    if missing:
        others = f" (nor {', '.join(map(repr, missing[1:]))})" if len(missing) > 1 else ""
        raise bad(f"report has no {missing[0]!r} field{others}")
    for key, kind in _REPORT_TABLES.items():
        if key in data and not isinstance(data[key], kind):
            raise bad(f"field {key!r} is a {type(data[key]).__name__}, not the expected type")
    for table in ("totals", "metrics", "extra"):
        section = data.get(table) or {}
        if not isinstance(section, dict):
            raise bad(f"field {table!r} is not an object")
        for name, value in section.items():
            if name in _REPORT_NUMBERS and (
                not _is_number(value) or (isinstance(value, float) and not math.isfinite(value))
            ):
                raise bad(f"{table} {name!r} = {value!r} is not a number")
    for table, keys in (("target", ("name", "kind")), ("model", ("name", "preset", "path"))):
        for key in keys:
            value = (data.get(table) or {}).get(key)
            if value is not None and not isinstance(value, str):
                raise bad(f"{table} {key!r} is not text")
    numeric = _NODE_NUMBERS
    for i, node in enumerate(data.get("nodes") or []):
        if not isinstance(node, dict):
            raise bad(f"node #{i} is a {type(node).__name__}, not an object")
        for key in numeric:
            value = node.get(key)
            if not _is_number(value) or (isinstance(value, float) and not math.isfinite(value)):
                raise bad(f"node #{i} field {key!r} = {value!r} is not a number")
        layer = node.get("layer")
        if layer is not None and (not isinstance(layer, int) or isinstance(layer, bool)):
            raise bad(f"node #{i} layer = {layer!r} is not an integer")
        for key in _NODE_TEXT:
            if node.get(key) is not None and not isinstance(node.get(key), str):
                raise bad(f"node #{i} field {key!r} is not text")
    for i, unit in enumerate(data.get("units") or []):
        if not isinstance(unit, dict):
            raise bad(f"unit #{i} is a {type(unit).__name__}, not an object")
    return data
