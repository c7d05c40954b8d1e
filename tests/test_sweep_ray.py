"""The Ray executor gives the same rows as the local one (a local Ray, 1-2 CPUs, 2 points)."""

from __future__ import annotations

import csv

import pytest

pytest.importorskip("torch")
pytest.importorskip("onnxscript")
ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'dabench-ir[ray]')")

pytestmark = pytest.mark.slow  # the development lane (-m "not slow") leaves it out

from dabench_ir.sweep import parse_spec, run_sweep  # noqa: E402
from dabench_ir.sweep.executors import RayExecutor  # noqa: E402
from tests._helpers import one_finding_study  # noqa: E402

_NONDETERMINISTIC = {"seconds"}  # wall time of the worker


def _rows(folder):
    with open(folder / "results.csv", newline="") as fh:
        return [{k: v for k, v in r.items() if k not in _NONDETERMINISTIC} for r in csv.DictReader(fh)]


def test_ray_and_local_rows_identical(tmp_path):
    spec = parse_spec(
        {
            "defaults": {"family": "gpt2", "hidden": 64, "heads": 4, "seq": 8, "positional": "none"},
            "axes": {"layers": [1, 2], "target": ["rdu"]},
        }
    )
    cache = tmp_path / "models"
    run_sweep(spec, tmp_path / "local", jobs=1, cache_dir=cache, plots=False)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        executor = RayExecutor(2)
        result = run_sweep(spec, tmp_path / "ray", executor=executor, cache_dir=cache, plots=False)
    finally:
        ray.shutdown()
    assert result.ran == 2 and result.failed == 0
    assert _rows(tmp_path / "ray") == _rows(tmp_path / "local")


def test_a_study_on_ray_gives_the_local_findings(tmp_path):
    from dabench_ir.reproduce import parse_study, run_study

    defaults = {"family": "gpt2", "hidden": 64, "heads": 4, "seq": 8, "positional": "none"}
    data = one_finding_study(
        defaults,
        {"layers": [1, 2], "target": ["rdu"]},
        id="deeper-slower",
        numerator={"layers": 1},
        denominator={"layers": 2},
        paper="faster",
        expect="increasing",
        counterfactual={"what": "no section launch cost", "target": {"overheads.host_per_section_s": 0}},
    )
    study = parse_study(data, origin="tiny.toml")
    cache = tmp_path / "models"
    local = run_study(study, tmp_path / "local", jobs=1, cache_dir=cache, plots=False)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        on_ray = run_study(study, tmp_path / "ray", executor=RayExecutor(2), cache_dir=cache, plots=False)
    finally:
        ray.shutdown()
    assert on_ray.sweep.ran == 2 and on_ray.sweep.failed == 0
    assert on_ray.counterfactual_sweep.ran == 2 and on_ray.counterfactual_sweep.failed == 0  # the changed target's
    same = [(o.id, o.value, o.verdict, o.counterfactual_tool) for o in local.outcomes]
    assert [(o.id, o.value, o.verdict, o.counterfactual_tool) for o in on_ray.outcomes] == same
    assert local.outcomes[0].value > 0 and local.outcomes[0].counterfactual_reproduced is True
