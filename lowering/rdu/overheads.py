"""Time no node owns: the host's per-step rows and the device's fixed step time."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dabench_ir.lowering.rdu.chip import NEEDED_BY
from dabench_ir.passes import meta

if TYPE_CHECKING:
    from dabench_ir.lowering.context import LoweringContext
    from dabench_ir.plan import Plan
    from dabench_ir.targets import Target

__all__ = ["DEVICE_STEP", "HOST_ESTIMATE", "step_overheads"]

HOST_ESTIMATE = "host (estimate: fitted to training steps)"
"""The overhead row of an inference run's host cost: training's fitted per-section figure, no
inference source. Its name says "(estimate": the why advice holds such rows fixed (`dabench_ir.advice`)."""
DEVICE_STEP = "device step"
"""The overhead row of a training step's fixed RDU time (``overheads.device_step_s``): device time, not host."""


def step_overheads(ctx: LoweringContext, plan: Plan, target: Target, launches: int, host_loop: str) -> str:
    """Add the plan's per-step rows and return the host row's name.

    The host pays ``host_step_s + host_per_section_s · launches`` for a training step of SambaNova's
    tutorial app (``host_loop`` "tutorial": both fitted to DABench-LLM's host latency, its
    generative_train.py run under SambaTune: data loading, the Python training loop; ``launches``: the
    section launches of a step, one per section unless the step accumulates gradients and runs each
    section once a micro-batch), the device ``device_step_s``. SambaNova's production training apps
    (``host_loop`` "production": transformers_on_rdu with a human-decision file) keep the compiled
    tiles executing 90-97 % of a run (sntilestat in ALCF's GPT 1.5B runs, targets/sn30.toml):
    no host time is charged between their steps, and a note says so. No SN30 inference host time is
    published, so an inference run pays only the per-section launches, as the row `HOST_ESTIMATE`,
    and a note says so.
    """
    per_launch = target.overhead_value("host_per_section_s", needed_by=NEEDED_BY)
    if meta.graph_mode(ctx.graph) != "train":
        plan.step_overheads_s[HOST_ESTIMATE] = per_launch * launches
        plan.notes.append(
            f"{HOST_ESTIMATE}: {per_launch * 1e3:.3g} ms per section launch x {launches} sections, fitted to "
            "training steps (no published SN30 inference host time)"
        )
        return HOST_ESTIMATE
    if host_loop == "production":
        plan.notes.append(
            "host: none between steps (--rdu-host-loop production: SambaNova's production training apps keep "
            "the tiles executing 90-97 % of a run, sntilestat in ALCF's GPT 1.5B runs); the fitted host "
            "loop is the tutorial app's"
        )
    else:
        plan.step_overheads_s["host"] = (
            target.overhead_value("host_step_s", needed_by=NEEDED_BY) + per_launch * launches
        )
    if device_step := target.overhead_value("device_step_s", needed_by=NEEDED_BY):
        plan.step_overheads_s[DEVICE_STEP] = device_step
    return "host"
