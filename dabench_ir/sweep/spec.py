"""Sweep specs: a TOML file naming axes (lists) and/or listed points, expanded to `Point`s.

A spec has optional ``name`` and ``description``, a ``[defaults]`` table, an ``[axes]``
table whose keys are parameter names and whose values are lists (the sweep runs their
cross product), and ``[[point]]`` tables (listed points, merged over the defaults). An axis
value may be a table that sets several parameters together, e.g. ``target = ["wse",
{target = "rdu", opt_level = "O0"}]``: that is how "rdu at O0, O1 and O3, and wse once" is
said without a full cross product.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import json
import logging
import math
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from dabench_ir import options
from dabench_ir.errors import UserError

__all__ = [
    "MODEL_PARAMS",
    "Point",
    "SweepSpec",
    "bundled_specs",
    "load_spec",
    "make_point",
    "parse_spec",
    "point_count",
    "spec_params",
    "target_kind",
]

logger = logging.getLogger(__name__)


def _model_params() -> tuple[str, ...]:
    from dabench_ir.models.config import ModelConfig

    return tuple(f.name for f in dataclasses.fields(ModelConfig))


MODEL_PARAMS: tuple[str, ...] = _model_params()
"""Parameters that change the exported graph: the fields of `ModelConfig` (precision and target do not)."""


def spec_params() -> tuple[str, ...]:
    """Every parameter a point may set, in results-table order: the model (`MODEL_PARAMS`,
    preset second), the run knobs, the target, the scaling knobs, then the target knobs —
    every knob ``sweep`` offers (`dabench_ir.options.KNOBS`, read at call time)."""
    knobs = options.knobs_for(options.SWEEP)
    by_group = {g: [n for n, k in knobs.items() if k.group == g] for g in ("run", "scale", "target")}
    others = [n for n, k in knobs.items() if k.group not in by_group]
    model = ("family", "preset", *(m for m in MODEL_PARAMS if m not in ("family", "preset")))
    ordered = (*model, *by_group["run"], "target", *by_group["scale"], *by_group["target"], *others)
    return tuple(dict.fromkeys(ordered))


DECODE = "decode"
"""The ``phase`` of a decode-step graph: the only model with a KV cache, so ``kv_precision`` applies to it alone."""


DEFAULTS: dict[str, Any] = {
    "family": "gpt2",
    "layers": 2,
    "hidden": 768,
    "seq": 1024,
    "batch": 1,
    "mode": "inference",
    "target": "rdu",
    "chips": 1,
    "opt_level": "O1",  # dropped where the target does not read it (see `_normalise`)
}
"""What a point gets when neither the spec's defaults nor its axes set a parameter. The precision
is not among them: a point that sets none runs at its target's ``[defaults]``, as ``profile`` does."""


@dataclass(frozen=True)
class Point:
    """One configuration of the sweep: a flat, JSON-able mapping of parameter -> value."""

    params: dict[str, Any]

    def __getitem__(self, name: str) -> Any:
        return self.params.get(name)

    def canonical(self) -> str:
        return json.dumps(self.params, sort_keys=True, separators=(",", ":"))

    def label(self) -> str:
        """A short human name, e.g. ``gpt2 L12 h768 rdu O1`` or ``gpt2 L1 h64 ipu ipus=2``: every run
        option the point sets away from its default is in it, so two points that run differently never
        share a label (a dry run lists them)."""
        p = self.params
        parts = [str(p.get("preset") or p.get("family")), f"L{p.get('layers')}", f"h{p.get('hidden')}"]
        parts += [str(p.get("target"))] + [str(p[k]) for k in ("opt_level", "wse_mode") if p.get(k)]
        if p.get("chips", 1) != 1:
            parts.append(f"{p['chips']}x{p.get('strategy')}")
        if p.get("chips_per_node"):
            parts.append(f"{p['chips_per_node']}/node")
        if p.get("batch", 1) != 1:
            parts.append(f"b{p['batch']}")
        if p.get("precision"):
            parts.append(str(p["precision"]))
        shown = {"batch", "chips", "strategy", "chips_per_node", "opt_level", "wse_mode", "precision"}
        for name, knob in options.knobs_for(options.SWEEP).items():
            value = p.get(name)
            if name not in shown and value is not None and json.dumps(value) != json.dumps(knob.default):
                parts.append(f"{name}={_label_value(value)}")
        return " ".join(parts)


def _label_value(value: Any) -> str:
    """A parameter's value as a label shows it: a list comma-separated, true/false as TOML says them."""
    if isinstance(value, (list, tuple)):
        return ",".join(map(_label_value, value))
    return str(value).lower() if isinstance(value, bool) else str(value)


@dataclass
class SweepSpec:
    """A parsed spec: its name, where it came from and its points (expanded, deduplicated)."""

    name: str
    points: list[Point]
    description: str = ""
    origin: str = "<spec>"
    axes: dict[str, list[Any]] = field(default_factory=dict)

    def varied(self) -> set[str]:
        """Parameters that take more than one value across the points."""
        keys = {k for p in self.points for k in p.params}
        return {k for k in keys if len({json.dumps(p[k]) for p in self.points}) > 1}

    def digest(self) -> str:
        text = "\n".join(p.canonical() for p in self.points)
        return hashlib.sha256(text.encode()).hexdigest()[:12]


# -- validation -------------------------------------------------------------------------------
def _check_model_value(name: str, value: Any, where: str) -> Any:
    """A `ModelConfig` field's value, checked against the field's declared type."""
    from dabench_ir.models.config import DTYPES, FAMILIES, ModelConfig

    kinds = {t.strip() for t in str(ModelConfig.__dataclass_fields__[name].type).split("|")} - {"None"}
    if "int" in kinds and not (isinstance(value, int) and not isinstance(value, bool) and value > 0):
        raise UserError(f"{where}: {name} must be a positive integer, got {value!r}")
    if "float" in kinds and not (isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0):
        raise UserError(f"{where}: {name} must be a positive number, got {value!r}")
    if "str" in kinds and not isinstance(value, str):
        raise UserError(f"{where}: {name} must be a string, got {value!r}")
    if "bool" in kinds and not isinstance(value, bool):
        raise UserError(f"{where}: {name} must be true or false, got {value!r}")
    choices = {"family": FAMILIES, "dtype": DTYPES}.get(name)
    if choices and value not in choices:
        raise UserError(f"{where}: {name} = {value!r}; expected one of {', '.join(choices)}")
    return value


MAX_POINTS = 100_000
"""The most points a sweep runs without ``--force`` (counted from the axes before expanding them)."""


_MAX_INT = 2**31 - 1
"""No parameter is an integer beyond this (dims, counts): a larger value is a typo, refused always."""


def _check_value(name: str, value: Any, where: str) -> Any:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > _MAX_INT:
        raise UserError(f"{where}: {name} = {value} is beyond any sensible size (at most {_MAX_INT:,})")
    if isinstance(value, float) and not math.isfinite(value):
        raise UserError(f"{where}: {name} = {value!r} is not a finite number")
    knobs = options.knobs_for(options.SWEEP)
    if name in knobs:
        try:
            return knobs[name].validate(value)
        except ValueError as exc:
            raise UserError(f"{where}: {name} = {value!r}: {exc}") from None
    if name in MODEL_PARAMS:
        return _check_model_value(name, value, where)
    if name == "target":
        if not isinstance(value, str):
            raise UserError(f"{where}: target must be a target name or path, got {value!r}")
        return value
    raise UserError(f"{where}: unknown parameter {name!r}; known: {', '.join(spec_params())}")


@functools.lru_cache(maxsize=64)
def target_kind(name: str) -> str:
    """The kind of a target, by loading it (an unknown name fails here, naming the known ones).

    The host target is calibrated on first load; its kind is known without that.
    """
    from dabench_ir.targets import TargetError, is_host, load_target

    if is_host(name):
        return "cpu"  # the host's kind (its name is `targets.HOST`)
    try:
        return load_target(name).kind
    except TargetError as exc:
        raise UserError(str(exc)) from None


def _check_table(table: Any, where: str) -> dict[str, Any]:
    if not isinstance(table, dict):
        raise UserError(f"{where}: expected a table of parameter = value, got {table!r}")
    return {k: _check_value(k, v, where) for k, v in table.items()}


def _normalise(params: dict[str, Any]) -> dict[str, Any]:
    """Fill defaults and derived values so equal configurations get equal keys."""
    p = {**DEFAULTS, **params}
    if p.get("preset"):
        from dabench_ir.models import PRESETS

        if p["preset"] not in PRESETS:
            raise UserError(f"preset {p['preset']!r} is unknown; known: {', '.join(PRESETS)}")
        base = PRESETS[p["preset"]]
        for key in ("family", "layers", "hidden", "heads", "kv_heads", "ffn", "seq", "vocab", "positional"):
            if key not in params and key in base and base[key] is not None:
                p[key] = base[key]
    elif "heads" not in p:
        from dabench_ir.models.config import default_heads

        p["heads"] = default_heads(p["hidden"])
    if p["chips"] == 1:
        p.pop("strategy", None)  # one chip: no strategy to choose, no node to spread over
        p.pop("chips_per_node", None)
    elif not p.get("strategy"):
        raise UserError(f"chips = {p['chips']} needs a strategy (dp, tp or pp)")
    kind = target_kind(str(p["target"]))
    for name, k in options.KNOBS.items():
        if k.targets is not None and kind not in k.targets:
            p.pop(name, None)  # a knob the target's lowering does not read: equal points get equal keys
    if p.get("mode") != "train":
        p.pop("recompute", None)
    if p.get("phase") != DECODE:
        p.pop("kv_precision", None)  # only a decode graph has a KV cache (`load_spec` refuses the flag for none)
    return {k: v for k, v in sorted(p.items()) if v is not None}


def make_point(params: dict[str, Any], where: str) -> Point:
    """One point from its parameters, checked and normalised as a spec's points are."""
    return Point(_normalise(_check_table(params, where)))


def parse_spec(
    data: dict[str, Any],
    *,
    origin: str = "<spec>",
    name: str | None = None,
    force: bool = False,
    folder: str | Path | None = None,
    user_target: str | None = None,
) -> SweepSpec:
    """Expand a spec (TOML already parsed) into its points; bad names or values raise UserError.

    ``folder``: the spec file's folder; a target file the spec names is found inside it
    (`fileio.resolve_inside`), never outside; ``user_target`` (the command line's ``--target``,
    a path the user gave) is taken as it is.

    The points are counted from the axes before they are expanded: above `MAX_POINTS`, or a
    point above `options.MAX_LAYERS` layers, is refused unless ``force``.
    """
    allowed = {"name", "description", "defaults", "axes", "point"}
    for key in data:
        if key not in allowed:
            raise UserError(f"{origin}: unknown top-level key {key!r}; expected {', '.join(sorted(allowed))}")
    defaults = _check_table(data.get("defaults", {}), f"{origin} [defaults]")
    axes_raw = data.get("axes", {})
    if not isinstance(axes_raw, dict):
        raise UserError(f"{origin}: [axes] must be a table of parameter = [values]")
    axes: dict[str, list[dict[str, Any]]] = {}
    for axis, values in axes_raw.items():
        where = f"{origin} axis {axis!r}"
        if axis not in spec_params():
            raise UserError(f"{where}: unknown axis name; known: {', '.join(spec_params())}")
        if not isinstance(values, list) or not values:
            raise UserError(f"{where}: expected a non-empty list of values")
        expanded = []
        for value in values:
            if isinstance(value, dict):
                table = _check_table(value, where)
                if axis not in table:
                    raise UserError(f"{where}: a table value must set {axis} itself, got {value!r}")
                expanded.append(table)
            else:
                expanded.append({axis: _check_value(axis, value, where)})
        axes[axis] = expanded
    listed = data.get("point", [])
    if not isinstance(listed, list):
        raise UserError(f"{origin}: points are [[point]] tables")
    count = point_count(data)
    if count > MAX_POINTS and not force:
        raise UserError(
            f"{origin}: {count:,} points, more than {MAX_POINTS:,}; narrow the axes, or pass --force to run them all"
        )
    layers = [v["layers"] for vals in axes.values() for v in vals if isinstance(v.get("layers"), int)]
    layers += [t.get("layers") for t in listed if isinstance(t, dict) and isinstance(t.get("layers"), int)]
    if isinstance(defaults.get("layers"), int):
        layers.append(defaults["layers"])
    if layers and max(layers) > options.MAX_LAYERS and not force:
        raise UserError(
            f"{origin}: layers = {max(layers):,} is more than {options.MAX_LAYERS:,}; pass --force if you mean it"
        )
    raw_points: list[dict[str, Any]] = []
    if axes:
        for combo in itertools.product(*axes.values()):
            params = dict(defaults)
            for part in combo:
                params.update(part)
            raw_points.append(params)
    for i, table in enumerate(listed):
        raw_points.append({**defaults, **_check_table(table, f"{origin} [[point]] #{i + 1}")})
    if not raw_points:
        raise UserError(f"{origin}: no points; give [axes] lists or [[point]] tables")
    if folder is not None:
        _targets_inside(raw_points, folder, origin, user_target)
    points: dict[str, Point] = {}
    for params in raw_points:
        point = Point(_normalise(params))
        points.setdefault(point.canonical(), point)
    if len(points) < len(raw_points):
        logger.info("%s: %d duplicate point(s) dropped", origin, len(raw_points) - len(points))
    spec_name = name or str(data.get("name") or Path(origin).stem)
    axis_values = {a: [v[a] for v in vals] for a, vals in axes.items()}
    return SweepSpec(
        name=spec_name,
        points=list(points.values()),
        description=str(data.get("description", "")),
        origin=origin,
        axes=axis_values,
    )


def point_count(data: Mapping[str, Any]) -> int:
    """The points a spec's table (TOML already parsed) gives, counted from its axes and listed
    points before anything is expanded (duplicates included): what `MAX_POINTS` limits, for one
    spec or (summed) for a whole study. A malformed axis or list counts nothing here: the
    parser refuses it by name."""
    axes = data.get("axes", {})
    lists = [v for v in axes.values() if isinstance(v, list)] if isinstance(axes, Mapping) else []
    listed = data.get("point", [])
    return (math.prod(len(v) for v in lists) if lists else 0) + (len(listed) if isinstance(listed, list) else 0)


def _targets_inside(raw_points: list[dict[str, Any]], folder: str | Path, origin: str, user_target: str | None) -> None:
    """Each point's target file, resolved inside the spec's folder (in place); ``user_target`` stays."""
    from dabench_ir.fileio import resolve_inside
    from dabench_ir.targets import is_target_path

    for params in raw_points:
        target = params.get("target")
        if isinstance(target, str) and target != user_target and is_target_path(target):
            params["target"] = str(resolve_inside(folder, target, f"{origin}: target"))


# -- files and bundled specs -----------------------------------------------------------------
def bundled_tomls(folder: str) -> dict[str, Path]:
    """Name -> TOML file of the package's ``data/<folder>`` (bundled sweep specs, studies)."""
    path = Path(str(resources.files("dabench_ir") / "data" / folder))
    return {p.stem: p for p in sorted(path.glob("*.toml"))} if path.is_dir() else {}


def read_named_toml(source: str | Path, folder: str, what: str, flag: str) -> tuple[Path, dict[str, Any]]:
    """A TOML file given as a path, or a bundled one by name (``data/<folder>``), parsed: its path
    and table. ``what`` names the kind of file in errors (``spec``, ``study``), ``flag`` the argument."""
    from dabench_ir.fileio import read_text_file

    text = str(source)
    path = Path(text)
    if not os.path.lexists(path):  # a folder or FIFO is refused below, by what it is
        bundled = bundled_tomls(folder)
        if text in bundled:
            path = bundled[text]
        elif text.endswith(".toml") or "/" in text:
            raise UserError(f"{what} file {text} does not exist")
        else:
            names = ", ".join(bundled) or "none"
            raise UserError(f"no {what} file or bundled {what} named {text!r}; bundled: {names}")
    body = read_text_file(path, flag)  # a FIFO, folder or binary file is refused here
    try:
        return path, tomllib.loads(body)
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{path}: not valid TOML ({' '.join(str(exc).split())})") from None


def bundled_specs() -> dict[str, Path]:
    """Bundled spec name -> its TOML file."""
    return bundled_tomls("sweeps")


def load_spec(source: str | Path, *, defaults: dict[str, Any] | None = None, force: bool = False) -> SweepSpec:
    """A spec from a TOML path, or a bundled spec by name (``level1``).

    ``defaults`` (the ``sweep`` command's knob flags) go over the spec's ``[defaults]``;
    its axes and points still set their own values.
    """
    path, data = read_named_toml(source, "sweeps", "spec", "spec")
    if defaults:
        table = data.get("defaults", {})
        data["defaults"] = {**(table if isinstance(table, dict) else {}), **defaults}
    user_target = (defaults or {}).get("target")
    spec = parse_spec(
        data,
        origin=path.name,
        name=data.get("name") or path.stem,
        force=force,
        folder=path.parent,
        user_target=user_target if isinstance(user_target, str) else None,
    )
    for name, value in (defaults or {}).items():  # a flag no point keeps would be accepted and ignored
        if name in options.KNOBS and spec.points and not any(name in p.params for p in spec.points):
            targets = ", ".join(sorted({str(p.params["target"]) for p in spec.points}))
            modes = ", ".join(sorted({str(p.params.get("mode")) for p in spec.points}))
            why = f"targets {targets}; {modes}"
            if name == "kv_precision":
                why = f'none is a decode graph, phase = "{DECODE}", the only one with a KV cache'
            raise UserError(
                f"{options.KNOBS[name].flag} {value}: applies to none of the {len(spec.points)} points of "
                f"{spec.name} ({why}); drop it"
            )
        if name in options.KNOBS and spec.points and not any(p.params.get(name) == value for p in spec.points):
            raise UserError(
                f"{options.KNOBS[name].flag} {value}: every point of {spec.name} sets {name} itself (an axis or "
                "a listed point), so no point keeps it; drop it, or change the spec's axis"
            )
    _check_point_options(spec)
    return spec


def _check_point_options(spec: SweepSpec) -> None:
    """Each distinct point's options as its run checks them (`run.check_options`), before any runs:
    a value its target refuses (``--tiles 9`` on an 8-tile RDU) is a mistake to fix, not a failed point."""
    from dabench_ir.run import check_options
    from dabench_ir.sweep.worker import point_options

    checked: set[tuple[str, str]] = set()
    for point in spec.points:
        knobs = point_options(point.params)
        key = (str(point.params["target"]), repr(sorted(knobs.items())))
        if key not in checked:
            checked.add(key)
            try:
                check_options(point.params["target"], knobs)
            except UserError as exc:
                raise UserError(f"{spec.name}, point {point.label()}: {exc}") from None
