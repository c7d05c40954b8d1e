"""Issue 34: the Ray executor for grids far larger than one machine's. A large argument shared by
many tasks (a sweep's base model) enters the object store once; at most ``window`` tasks are in
flight; every task's result comes back once. A stand-in for Ray records what the executor asks of it."""

from __future__ import annotations

import sys
import types

from dabench_ir.sweep.executors import RayExecutor


class _Ref:
    def __init__(self, value):
        self.value = value


class _FakeRay(types.ModuleType):
    def __init__(self):
        super().__init__("ray")
        self.puts, self.in_flight, self.most_in_flight = [], 0, 0
        self.exceptions = types.SimpleNamespace(WorkerCrashedError=RuntimeError, NodeDiedError=RuntimeError)

    def is_initialized(self):
        return True

    def cluster_resources(self):
        return {"CPU": 2.0}

    def put(self, value):
        self.puts.append(value)
        return _Ref(value)

    def remote(self, max_retries=0):
        def wrap(fn):
            def submit(*args):
                assert not any(isinstance(a, bytes) and len(a) >= RayExecutor.SHARED_BYTES for a in args)
                self.in_flight += 1
                self.most_in_flight = max(self.most_in_flight, self.in_flight)
                return _Ref(fn(*[a.value if isinstance(a, _Ref) else a for a in args]))

            return types.SimpleNamespace(remote=submit)

        return wrap

    def wait(self, refs, num_returns=1):
        return refs[:num_returns], refs[num_returns:]

    def get(self, ref):
        self.in_flight -= 1
        return ref.value


def _size(base: bytes, layers: int) -> tuple[int, int]:
    return len(base), layers


def test_ray_puts_a_shared_base_once_and_bounds_the_tasks_in_flight(monkeypatch):
    fake = _FakeRay()
    monkeypatch.setitem(sys.modules, "ray", fake)
    big, other, small = b"x" * RayExecutor.SHARED_BYTES, b"y" * (RayExecutor.SHARED_BYTES + 1), b"z"
    tasks = [(_size, (big, n)) for n in range(20)] + [(_size, (other, 1)), (_size, (small, 2))]
    executor = RayExecutor(1)
    got = dict(executor.map_unordered(tasks))
    assert got == {i: (len(args[0]), args[1]) for i, (_, args) in enumerate(tasks)}  # each task once
    assert [len(p) for p in fake.puts] == [len(big), len(other)]  # the small one travels by value
    assert fake.most_in_flight == 8  # 4 per cluster CPU
    fake.puts.clear()
    fake.most_in_flight = 0
    assert len(dict(RayExecutor(1, window=3).map_unordered(tasks))) == len(tasks)
    assert fake.most_in_flight == 3 and len(fake.puts) == 2


def test_a_point_record_is_encoded_once_and_nan_becomes_null():
    """Issue 34: a record is encoded in one pass, as it is (not copied), NaN and infinity written
    as null; the table row built from the record in memory is the row its file gives back."""
    import json
    import math

    from dabench_ir.sweep.results import encode_point, record_row

    nodes = [{"name": "a", "time_s": 2.0, "bound": "compute"}, {"name": "b", "time_s": 1.0, "bound": "memory"}]
    record = {
        "key": "k",
        "params": {"layers": 2},
        "status": "ok",
        "error": None,
        "report": {"totals": {"time_s": 0.5}, "units": (1, 2), "nodes": nodes},
    }
    assert json.loads(encode_point(record)) == {**record, "report": {**record["report"], "units": [1, 2]}}
    bad = {
        **record,
        "report": {
            "totals": {"time_s": math.nan, "flops": math.inf},
            "nodes": [*nodes, {"name": "c", "time_s": math.nan, "bound": "overhead"}],
        },
    }
    back = json.loads(encode_point(bad))
    assert back["report"]["totals"] == {"time_s": None, "flops": None} and back["report"]["nodes"][2]["time_s"] is None
    assert math.isnan(bad["report"]["totals"]["time_s"])  # the record itself is left as it was
    assert record_row(bad) == record_row(back) and record_row(back)["dominant_bound"] == "compute"
