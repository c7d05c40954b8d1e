"""Every knob of dabench-ir, declared once.

A knob is a dataclass field whose metadata holds a `Knob`: its help, its choices, how a
command-line or TOML value is parsed and checked, and which commands offer it. The CLI
flags of ``profile``, ``scale`` and ``sweep``, the sweep-spec validation, the lowerings'
own option classes and the report's recorded configuration are all derived from these
fields (xDSL's passes derive their CLI from their dataclass fields the same way).

Adding a knob: one field below (``knob(...)``) plus the code that reads it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dabench_ir.errors import UserError

__all__ = ["KNOBS", "Knob", "ProfileOptions", "ScaleOptions", "knob"]

PROFILE, SCALE, SWEEP = "profile", "scale", "sweep"
_ALL = frozenset({PROFILE, SCALE, SWEEP})


@dataclass(frozen=True, slots=True)
class Knob:
    """How one option is offered and checked; ``name`` is the field's name."""

    help: str
    choices: tuple[str, ...] | None = None
    parse: Callable[[Any], Any] | None = None  # text/TOML value -> value; raises ValueError
    group: str = "run"  # run | target | measure | scale: the CLI's argument group
    commands: frozenset[str] = _ALL
    name: str = ""

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def check(self, value: Any) -> Any:
        """``value`` parsed and checked, or a UserError naming the flag and what it takes."""
        if value is None:
            return None
        if self.parse is not None and (self.parse is not _bool or not isinstance(value, bool)):
            try:
                value = self.parse(value)
            except (TypeError, ValueError) as exc:
                raise UserError(f"{self.flag} {value!r}: {exc}") from None
        if self.choices is not None and value not in self.choices:
            raise UserError(f"{self.flag} {value!r}: expected one of {', '.join(self.choices)}")
        return value


def knob(default: Any = None, *, default_factory: Callable[[], Any] | None = None, **how: Any) -> Any:
    """A dataclass field that is also a declared option (see `Knob`)."""
    kwargs: dict[str, Any] = {"metadata": {"knob": Knob(**how)}}
    if default_factory is not None:
        kwargs["default_factory"] = default_factory
    else:
        kwargs["default"] = default
    return field(**kwargs)


# -- value parsers: each raises ValueError with what it expected --------------------------------


def _positive(value: Any) -> int:
    if isinstance(value, bool) or not str(value).strip().lstrip("+").isdigit() or int(value) < 1:
        raise ValueError("expected a positive integer")
    return int(value)


def _non_negative(value: Any) -> int:
    if isinstance(value, bool) or not str(value).strip().lstrip("+").isdigit():
        raise ValueError("expected a non-negative integer")
    return int(value)


def _positive_or_auto(value: Any) -> int | str:
    return "auto" if value == "auto" else _positive(value)


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true or false")


PRECISIONS = ("fp32", "fp16", "bf16", "mixed")
MODES = ("inference", "train")
OPT_LEVELS = ("O0", "O1", "O3")
WSE_MODES = ("pipelined", "streaming", "auto")
STRATEGIES = ("dp", "tp", "pp")


@dataclass(frozen=True)
class ProfileOptions:
    """Everything `profile` can be asked. The CLI flags are derived from these fields."""

    dims: Mapping[str, int] = knob(
        default_factory=dict, help="bind a symbolic dim, NAME=VALUE (repeatable)", commands=frozenset({PROFILE, SCALE})
    )
    batch: int | None = knob(None, help="batch size (binds the model's batch dim when symbolic)", parse=_positive)
    precision: str | None = knob(None, help="rewrite dtypes before costing (default: as the model is)", choices=PRECISIONS)
    mode: str = knob("inference", help="inference (forward) or train (backward and optimizer too)", choices=MODES)
    recompute: bool = knob(False, help="train mode: recompute activations in the backward pass", parse=_bool)
    via: str = knob(
        "onnx", help="cost from ONNX rules or from linalg", choices=("onnx", "mlir"), commands=frozenset({PROFILE})
    )
    # target lowering
    opt_level: str = knob("O1", help="RDU compiler fusion level", choices=OPT_LEVELS, group="target")
    wse_mode: str = knob("auto", help="WSE execution mode", choices=WSE_MODES, group="target")
    replicas: int | str | None = knob(
        None, help="WSE on-wafer replicas: N or 'auto'", parse=_positive_or_auto, group="target"
    )
    ipus: int = knob(1, help="IPUs to pipeline over", parse=_positive, group="target")
    micro_batches: int | None = knob(
        None, help="micro-batches per step where the target pipelines", parse=_positive, group="target"
    )
    # measurement
    measure: bool = knob(
        False, help="run the model in onnxruntime and time every node", parse=_bool, group="measure",
        commands=frozenset({PROFILE}),
    )  # fmt: skip
    warmup: int = knob(2, help="untimed runs first", parse=_non_negative, group="measure", commands=frozenset({PROFILE}))
    repeat: int = knob(5, help="timed runs (the median is kept)", parse=_positive, group="measure",
                       commands=frozenset({PROFILE}))  # fmt: skip
    threads: int | None = knob(
        None, help="onnxruntime intra-op threads", parse=_positive, group="measure", commands=frozenset({PROFILE})
    )
    ort_opt: bool = knob(
        False, help="keep onnxruntime graph optimisation on", parse=_bool, group="measure",
        commands=frozenset({PROFILE}),
    )  # fmt: skip
    max_weight_bytes: int = knob(
        4 << 30, help="cap on synthesised weights", parse=_positive, group="measure", commands=frozenset({PROFILE})
    )

    def __post_init__(self) -> None:
        for name, k in KNOBS.items():
            if name in self.__dataclass_fields__ and name != "dims":
                object.__setattr__(self, name, k.check(getattr(self, name)))


@dataclass(frozen=True)
class ScaleOptions(ProfileOptions):
    """`scale` and multi-chip sweep points: a profile placed over several chips."""

    chips: int = knob(1, help="chips to scale over", parse=_positive, group="scale",
                      commands=frozenset({SWEEP}))  # fmt: skip
    strategy: str | None = knob(None, help="data, tensor or pipeline parallel", choices=STRATEGIES, group="scale",
                                commands=frozenset({SCALE, SWEEP}))  # fmt: skip


def _collect(*classes: type) -> dict[str, Knob]:
    found: dict[str, Knob] = {}
    for cls in classes:
        for f in dataclasses.fields(cls):
            if "knob" in f.metadata:
                found[f.name] = dataclasses.replace(f.metadata["knob"], name=f.name)
    return found


KNOBS: dict[str, Knob] = _collect(ProfileOptions, ScaleOptions)
"""Every declared option, by field name."""
