"""Issue 34: bases a sweep or validate needs are read from the cache, the missing ones exported
once each on the executor (in parallel), saved, and an export's failure named per base."""

from __future__ import annotations

from dabench_ir.sweep import graphs
from dabench_ir.sweep.executors import SerialExecutor
from tests.conftest import parse

MODEL = parse("agraph (float[2,3] A, float[3,4] B) => (float[2,4] C) { C = MatMul(A, B) }").SerializeToString()


def test_export_missing_exports_each_missing_base_once(tmp_path, monkeypatch):
    asked = []

    def export(params):
        asked.append(params["hidden"])
        if params["hidden"] == 3:
            raise ValueError("no such model\nsecond line")
        return MODEL

    monkeypatch.setattr(graphs, "export_base", export)
    graphs.save_base(tmp_path, "cached", MODEL)
    wanted = {"cached": {"hidden": 1}, "new": {"hidden": 2}, "bad": {"hidden": 3}}
    bases, errors, exported = graphs.export_missing(tmp_path, wanted, SerialExecutor())
    assert asked == [2, 3]  # the cached base is read, not exported
    assert bases == {"cached": MODEL, "new": MODEL}
    assert errors == {"bad": "ValueError: no such model"} and exported == 2
    assert sorted(p.name for p in tmp_path.glob("*.onnx")) == ["cached.onnx", "new.onnx"]
    asked.clear()
    assert graphs.export_missing(tmp_path, {"new": {"hidden": 2}}, SerialExecutor()) == ({"new": MODEL}, {}, 0)
    assert asked == []
