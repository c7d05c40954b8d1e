"""Leave one source out (dabench_ir.validate.crossval): which sources can be cross-validated, that
the recorded fold fits are those of today's parameters and points, and that a stale record is
refused rather than scored."""

from __future__ import annotations

import pytest

from dabench_ir import validate
from dabench_ir.validate import crossval
from dabench_ir.validate.catalog import Point
from dabench_ir.validate.fit import counts


def _point(pid: str, source: str) -> Point:
    return Point(id=pid, kind="gemm", target="bow", source=source, file="test.toml")


@pytest.mark.parametrize(
    ("source", "key"),
    [
        ("Jia et al., arXiv 1912.03413, Table 5.1: fp32 GEMM", "Jia et al."),
        ("graphcore/examples nlp/gpt2/pytorch/run/pretraining_small.sh (commit 2d8b565)", "graphcore/examples"),
        (
            "DABench-LLM artifact (GitHub augustuszzq/Regular-DABench-LLM), sambaNova/x.numbers, O3 row",
            "augustuszzq/Regular-DABench-LLM",
        ),
    ],
)
def test_a_source_is_its_repository_or_its_paper(source, key):
    assert crossval.source_of(_point("p", source)) == key


def test_the_folds_say_what_each_source_informs():
    catalogue = validate.load_catalog()
    folds = {f.source: f for f in crossval.folds_of("bow", catalogue)}
    jia = folds["Jia et al."]
    assert jia.points == ("gc2-gemm-fp32", "gc2-gemm-mixed")
    assert set(jia.informed) == {"arch.matmul_efficiency_fp32", "arch.matmul_efficiency_fp16"}
    assert not jia.alone and jia.needs_fit
    assert set(jia.fit_points) == {"gc200-gemm-fp32-best", "gc200-gemm-fp16-over-fp32"}  # the other papers'
    assert not folds["argonne-lcf/user-guides"].informed  # out of sample as it stands: no refit
    # every SN30 parameter but the O3 rate is fitted to the DABench artifact alone: it cannot be left
    # out; the O3 rate has a second source (the ALCF user guide's GPT-2 XL run), refitted without it
    sn30 = {f.source: f for f in crossval.folds_of("sn30", catalogue)}
    artifact = sn30["augustuszzq/Regular-DABench-LLM"]
    assert set(artifact.informed) - set(artifact.alone) == {"arch.pcu_efficiency"}
    assert "overheads.device_step_s" in artifact.alone and not artifact.needs_fit
    guide = sn30["argonne-lcf/user-guides"]
    assert set(guide.informed) == {"arch.pcu_efficiency"} and guide.needs_fit and not guide.alone


def test_the_recorded_fits_are_of_todays_parameters_and_points():
    """A fitted parameter or a catalogue point changed since the folds were fitted: rerun
    scripts/refit.py --cross-validate TARGET (the record's key says what it was fitted to)."""
    catalogue = validate.load_catalog()
    record = crossval.load_record()
    for target in ("a100", "bow", "sn30", "wse2"):
        if any(f.needs_fit for f in crossval.folds_of(target, catalogue)):
            assert target in record, f"no fold fits recorded for {target}"
            assert record[target]["inputs"] == crossval.inputs_key(target, catalogue), (
                f"{target}: rerun scripts/refit.py --cross-validate {target}"
            )
            fitted = {f["source"] for f in record[target]["folds"] if f["values"]}
            assert fitted == {f.source for f in crossval.folds_of(target, catalogue) if f.needs_fit}


def test_a_stale_record_scores_nothing_it_fitted(monkeypatch):
    catalogue = [p for p in validate.load_catalog() if p.target == "bow" and p.kind.startswith("gemm")]
    result = validate.run_validation(catalogue)
    live = crossval.cross_validate(result).targets["bow"]
    assert live.refitted >= 1 and not live.stale
    record = crossval.load_record()
    monkeypatch.setattr(crossval, "load_record", lambda: {"bow": {**record["bow"], "inputs": "0" * 16}})
    stale = crossval.cross_validate(result).targets["bow"]
    assert "rerun scripts/refit.py --cross-validate bow" in stale.stale
    assert stale.refitted == 0 and set(stale.unscored) >= {"gc2-gemm-fp32", "gc200-gemm-fp32-best"}


def test_a_fold_is_predicted_at_its_own_values_not_the_files():
    """Peng et al.'s IPU points at the matmul efficiencies fitted without them: the same errors as a
    validation against a target file holding those values, and not the in-sample ones."""
    catalogue = validate.load_catalog()
    peng = [p for p in catalogue if crossval.source_of(p) == "Peng et al." and p.target == "bow"]
    result = validate.run_validation(peng)
    cv = crossval.cross_validate(result).targets["bow"]
    values = next(f["values"] for f in crossval.load_record()["bow"]["folds"] if f["source"] == "Peng et al.")
    import tempfile
    from dataclasses import replace
    from pathlib import Path

    from dabench_ir.targets import builtin_target_paths
    from dabench_ir.validate.fit import counts, with_values

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bow.toml"
        path.write_text(with_values(builtin_target_paths()["bow"].read_text(), values))
        direct = validate.run_validation([replace(p, target=str(path)) for p in peng])
    expected = sorted(abs(e) for r in direct.results for e in counts(r))  # of a [ref] point, its ratios
    in_sample = sorted(abs(e) for r in result.results for e in counts(r))
    assert sorted(cv.errors) == pytest.approx(expected)
    assert sorted(cv.errors) != pytest.approx(in_sample)


def _h100(*ids: str) -> list[Point]:
    by_id = {p.id: p for p in validate.load_catalog()}
    return [by_id[i] for i in ids]


MHA = "h100-trtllm090-llama2-7b-b896-128-128"  # multi-head decode: no group repeats, the rate unread
GQA = "h100-trtllm090-mistral-7b-b896-128-128"  # the per-query-head kernel's repeats: fitted to it


@pytest.mark.slow  # three validations of three decode points
def test_a_point_is_independent_of_a_parameter_only_when_its_predictions_do_not_move():
    """The decode attention load rate: a multi-head decode never reads it; a grouped-query decode by
    the per-query-head kernel does, whether or not it was fitted to it (a copy under a new id, in no
    ``fitted_to``, is found dependent by running it), and a point it was fitted to is not run."""
    from dataclasses import replace

    mha, gqa = _h100(MHA, GQA)
    unfitted = replace(gqa, id="test-mistral-7b-unfitted")
    result = validate.run_validation([mha, gqa, unfitted])
    rate = ["arch.decode_attention_load_bytes_per_s"]
    assert crossval.independent("h100", rate, result.results) == {MHA}
    assert crossval.independent("h100", [], result.results) == {MHA, GQA, unfitted.id}  # nothing to depend on


def test_a_source_that_alone_informs_a_parameter_scores_its_points_that_do_not_read_it():
    """NVIDIA's TensorRT-LLM tables alone inform the H100's decode attention load rate: the points the
    rate was fitted to stay unscored, a multi-head decode of the same tables is scored at the file's
    values (before session 70 every point of the source was unscored)."""
    result = validate.run_validation(_h100(MHA, GQA))
    cv = crossval.cross_validate(result).targets["h100"]
    assert cv.scored == [MHA] and cv.unscored == [GQA]
    assert cv.alone == {"NVIDIA/TensorRT-LLM": ["arch.decode_attention_load_bytes_per_s"]}
    assert cv.independent == {"NVIDIA/TensorRT-LLM": [MHA]} and cv.dependent == {"NVIDIA/TensorRT-LLM": [GQA]}
    mha = next(r for r in result.results if r.point.id == MHA)
    assert cv.errors == pytest.approx([abs(e) for e in counts(mha)])
    assert (
        "1 of its points depend on what it informs (not cross-validatable), 1 do not (scored)"
        in crossval.CrossValidation({"h100": cv}).format_table()
    )


def test_a_targets_errors_are_told_by_the_source_they_score():
    """The cross-validated errors of a target split by source: together they are the target's, and the
    table names each source's median and worst, the worst source first."""
    lib = "h100-trtllm-lib-llama2-7b-b1-128-128"  # Argonne's LLM-Inference-Bench
    result = validate.run_validation(_h100(MHA, lib))
    cv = crossval.cross_validate(result).targets["h100"]
    assert set(cv.by_source) == {"NVIDIA/TensorRT-LLM", "argonne-lcf/LLM-Inference-Bench"}
    assert sorted(e for errors in cv.by_source.values() for e in errors) == sorted(cv.errors)
    by = cv.stats()["by_source"]
    assert by["argonne-lcf/LLM-Inference-Bench"]["compared"] == 1
    line = next(x for x in crossval.CrossValidation({"h100": cv}).format_table().splitlines() if "by source" in x)
    worst = max(by, key=lambda s: by[s]["worst_abs_error"])
    assert line.index(worst) < min(line.index(s) for s in by if s != worst)


def test_a_value_carried_from_another_chip_is_informed_by_the_source_it_was_fitted_to():
    """The H200 takes the H100's decode attention rate, fitted to H100 rows of NVIDIA's TensorRT-LLM
    tables; the H200's rows of the same tables cannot test it: the source informs it there too, alone."""
    folds = {f.source: f for f in crossval.folds_of("h200", validate.load_catalog())}
    trt = folds["NVIDIA/TensorRT-LLM"]
    assert trt.informed == ("arch.decode_attention_load_bytes_per_s",) and trt.alone == trt.informed
    assert not trt.needs_fit


def test_a_wrong_fit_verdict_is_counted_and_named_not_scored_as_nothing():
    """A point whose run the tool says does not fit has no figure: before, it was counted among the
    scored points with no error, so a fold could turn every verdict wrong and the figure not move."""
    from dataclasses import replace

    (lib,) = _h100("h100-trtllm-lib-llama2-7b-b1-128-128")
    said_not = replace(lib, expect={"fits": False})  # the source saying it did not fit: the verdict is wrong
    result = validate.run_validation([said_not])
    (r,) = result.results
    assert r.fit_verdict == "wrong"
    cv = crossval.cross_validate(result).targets["h100"]
    assert cv.wrong_fits == [lib.id] and cv.stats()["fit_wrong"] == [lib.id]
    table = crossval.CrossValidation({"h100": cv}).format_table()
    assert f"h100: fit verdict wrong without its source: {lib.id}" in table
    assert table.splitlines()[1].split()[5] == "1"  # the fit bad column


def test_a_parameter_at_zero_is_never_shown_unread_and_its_move_from_zero_is_not_identified():
    """No factor moves 0: the perturbation cannot show a point free of it (sn30's pcu_k_half is 0 and
    moves the ALCF points when set to 128), and fold values 0 and 128 are not one identified value."""
    from types import SimpleNamespace

    point = SimpleNamespace(point=SimpleNamespace(id="sn30-gpt13b-dp4-ss2k"))
    assert crossval.independent("sn30", ["arch.pcu_k_half"], [point]) == set()
    moved = crossval._moved("sn30", [{"values": {"arch.pcu_k_half": 128.0}}])
    assert moved == {"arch.pcu_k_half": float("inf")}


def test_the_record_key_follows_what_a_point_asks_not_its_prose():
    from dataclasses import replace

    catalogue = validate.load_catalog()
    key = crossval.inputs_key("sn30", catalogue)
    i = next(k for k, p in enumerate(catalogue) if p.id == "sn30-gpt2-h1600-L12-O3")
    reworded = [*catalogue[:i], replace(catalogue[i], note="another note"), *catalogue[i + 1 :]]
    longer = [*catalogue[:i], replace(catalogue[i], model={**catalogue[i].model, "seq": 2048}), *catalogue[i + 1 :]]
    assert crossval.inputs_key("sn30", reworded) == key
    assert crossval.inputs_key("sn30", longer) != key
