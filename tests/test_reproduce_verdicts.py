"""The bundled DABench study run end to end: every finding's verdict and provenance pinned, every
reproduced finding failed by its counterfactual, and docs/reproduce.md's findings table the one a
run gives. A refit or a mechanism change that moves a finding fails here, naming it: then either
the change is wrong, or the pin and the docs table (scripts/reproduce_docs.py) move with it, in
the same commit, and the note says why. A band is never widened to keep a pin."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from dabench_ir.reproduce import load_study, run_study
from dabench_ir.reproduce.render import DOC_BEGIN, DOC_END, docs_table

pytestmark = pytest.mark.slow  # the whole study and its counterfactuals: about two minutes

ROOT = Path(__file__).resolve().parents[1]

PINNED = {
    # Level 2
    # session 61: +23.1 %, 0.2 points inside the band [22.9, 45.7]: pcu_efficiency refitted to its own points
    # (0.646 -> 0.624) once the ALCF runs drive the RDU through the production host loop; fragile
    "precision-rdu": ("reproduced", "predicted"),
    "precision-ipu": ("not reproduced", "predicted"),
    "precision-wse": ("not reproduced", "predicted"),  # issue 44: +4.8 %, the batch-bounded WSE pipeline buffers
    "precision-wse-least": ("reproduced", "predicted"),
    "batch-wse-knee": ("reproduced", "predicted"),
    "batch-rdu-linear": ("not reproduced", "predicted"),
    "batch-ipu-linear": ("not reproduced", "predicted"),
    "tp-rdu-2to4": ("reproduced", "predicted"),  # issue 44: the TP reduction through RDU 0 (SambaFlow docs)
    "pp-ipu-equal-max": ("not a test", "predicted"),
    "pp-ipu-max-layers": ("not a test", "predicted"),
    "dp-wse-replicas": ("not a test", "predicted"),
    "dp-wse-overhead": ("not a test", "predicted"),
    # Level 1
    "wse-allocation": ("reproduced", "in sample"),
    "wse-li": ("reproduced", "in sample"),
    "wse-fit-limit": ("not reproduced", "predicted"),
    "wse-weight-streaming": ("reproduced", "predicted"),
    "rdu-allocation": ("reproduced", "predicted"),  # session 60: sections on their PCUs, p90 67.8 -> 64.4 %
    "rdu-opt-levels": ("not a test", "predicted"),
    "rdu-o3-li": ("reproduced", "predicted"),
    "rdu-memory-bound": ("reproduced", "predicted"),
    "ipu-most-efficient": ("reproduced", "predicted"),
    "ipu-peak-efficiency": ("not reproduced", "predicted"),
    "ipu-memory-bound": ("reproduced", "predicted"),  # issue 44: the AMP loop streams its partial sums (PopLibs)
    "ipu-fit-limit": ("not reproduced", "predicted"),
    "ipu-tile-use": ("not a test", "predicted"),
    "wse-only-compute-bound": ("reproduced", "predicted"),  # issue 44: the IPU memory-bound by the same mechanism
    "limits": ("reproduced", "predicted"),  # issue 44: idem
    "memory-shared": ("not a test", "predicted"),
    "memory-global": ("not a test", "predicted"),
    # checks against the artifact
    "wse-16bit-formats": ("not a test", "predicted"),
}


@pytest.fixture(scope="module")
def doc(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("onnxscript")
    out = tmp_path_factory.mktemp("dabench")
    run_study(load_study("dabench"), out, jobs=2, plots=False, cache_dir=tmp_path_factory.mktemp("models"))
    return json.loads((out / "findings.json").read_text())


def test_every_verdict_is_pinned(doc):
    found = {f["id"]: (f["verdict"], f["provenance"]) for f in doc["findings"]}
    assert set(found) == set(PINNED), "a finding was added or removed: pin it"
    moved = {i: f"{PINNED[i]} -> {v}" for i, v in found.items() if v != PINNED[i]}
    assert not moved, f"findings whose verdict or provenance moved: {moved}"


def test_a_reproduced_finding_fails_its_counterfactual_and_states_its_band(doc):
    for f in doc["findings"]:
        if f["verdict"] == "reproduced":
            assert f["counterfactual"] and f["counterfactual_reproduced"] is False, f["id"]
        if f["grading"] in ("change", "factor", "relative", "scaling", "share", "limit", "position"):
            assert f["accept"] is not None and "within" in f["accept_text"], f["id"]
        if f["grading"] == "direction":
            assert f["accept_text"].startswith("direction only"), f["id"]
    assert doc["counts"]["paper"]["total"] + doc["counts"]["artifact"]["total"] == len(PINNED)


def test_the_docs_table_is_the_one_a_run_gives(doc):
    text = (ROOT / "docs" / "reproduce.md").read_text()
    written = text.split(DOC_BEGIN, 1)[1].split(DOC_END, 1)[0].strip()
    assert written == docs_table(doc), "docs/reproduce.md's findings table is stale: scripts/reproduce_docs.py"


def test_the_docs_script_writes_that_table(doc, tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("reproduce_docs", ROOT / "scripts" / "reproduce_docs.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    blank = f"intro\n{DOC_BEGIN}\nold\n{DOC_END}\ntail\n"
    assert script.with_table(blank, docs_table(doc)) == f"intro\n{DOC_BEGIN}\n{docs_table(doc)}\n{DOC_END}\ntail\n"
