"""Issue 34: the profile path does less work for the same answer.

`safe_name_scopes` splits the exporter's plain list form without a parse; every text gives the
list `ast.literal_eval` gives (the reference), and any other text still goes through the parse.
"""

from __future__ import annotations

import ast

import pytest

from dabench_ir.frontends.checks import safe_name_scopes


def _reference(text: str) -> list[str]:
    try:
        entries = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return []
    return [s for s in entries if isinstance(s, str) and s] if isinstance(entries, (list, tuple)) else []


@pytest.mark.parametrize(
    "text",
    [
        "['', 'full']",
        "['layers.0', 'layers.0.self_attn', 'linear']",
        "[]",
        "['']",
        "['a']",
        "['a', '']",
        "['a b', 'c;d']",
        "['a','b']",
        "[ 'a']",
        " ['a']",
        "['a', 'b',]",
        "['it\\'s']",
        '["a", "b"]',
        "['a\\nb']",
        "['é']",
        "['a', 5]",
        "('a', 'b')",
        "['a'] + ['b']",
        "['a', 'b'",
        "['a\tb']",
        "[''a']",
        "['[', ']']",
        "['a', ', ', 'b']",
    ],
)
def test_name_scopes_as_literal_eval(text):
    assert safe_name_scopes(text) == _reference(text)


def test_name_scopes_property():
    hypothesis = pytest.importorskip("hypothesis")
    from hypothesis import given
    from hypothesis import strategies as st

    from tests.conftest import property_settings

    items = st.lists(st.text(alphabet=st.sampled_from(list("ab.0 ',\\[]\t\né")), max_size=6), max_size=4)

    @property_settings("DABENCH_FUZZ_EXAMPLES", 200)
    @given(items, st.booleans())
    def check(entries, as_repr):
        text = repr(entries) if as_repr else "[" + ", ".join(f"'{e}'" for e in entries) + "]"
        assert safe_name_scopes(text) == _reference(text)

    assert hypothesis
    check()


def test_one_subcommand_parser_keeps_the_whole_command_line(capsys, tiny_matmul_path):
    """`main` builds only the named subcommand's parser; what a user sees is the whole command line's:
    a flag of another command is named as such, help before the command lists every command, a
    misspelt command is refused with the list."""
    from dabench_ir.cli import main

    assert main(["profile", str(tiny_matmul_path), "--list"]) == 2
    assert (
        capsys.readouterr().err.strip() == "dabench-ir: error: profile has no --list; it is a flag of sweep, reproduce"
    )
    with pytest.raises(SystemExit) as done:
        main(["-v", "-h", "profile"])
    assert done.value.code == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in ("profile", "export", "sweep", "validate", "reproduce"))
    assert main(["profil", str(tiny_matmul_path)]) == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'profil'" in err and "'sweep'" in err and err.count("\n") == 1


def test_arity_is_checked_per_node_with_the_schema_looked_up_once():
    """The schema counts are cached per op and opset; each node is still checked against them."""
    from onnx import parser

    from dabench_ir.errors import InputError
    from dabench_ir.frontends.checks import check_onnx_model

    ok = parser.parse_model(
        '<ir_version: 8, opset_import: ["" : 17]> g (float[2] A) => (float[2] C) { B = Relu(A)\n C = Relu(B) }'
    )
    check_onnx_model(ok)
    bad = parser.parse_model(
        '<ir_version: 8, opset_import: ["" : 17]> g (float[2] A) => (float[2] C) { B = Relu(A)\n C = Relu(B, A) }'
    )
    with pytest.raises(InputError, match=r"a Relu node has 2 input\(s\); Relu takes 1"):
        check_onnx_model(bad)
    outputs = parser.parse_model(
        '<ir_version: 8, opset_import: ["" : 17]> g (float[2] A) => (float[2] C) { B, D = Relu(A)\n C = Relu(B) }'
    )
    with pytest.raises(InputError, match=r"a Relu node has 2 output\(s\); Relu takes 1"):
        check_onnx_model(outputs)  # each node's own count, not the last node's


def test_value_info_dims_read_once_keep_their_meaning():
    """A dim read by value first: a size, a symbol, an explicit 0 and an unknown dim each keep their reading,
    and the first negative dim of a declared tensor is the one named."""
    from onnx import TensorProto, helper

    from dabench_ir.errors import InputError
    from dabench_ir.frontends.checks import _check_value_info
    from dabench_ir.frontends.onnx import _tensor_type
    from dabench_ir.ir import DType

    vi = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, "seq", 0])
    assert _tensor_type(vi.type, {}).shape == (4, "seq", 0) and _tensor_type(vi.type, {}).dtype is DType.from_onnx(1)
    vi.type.tensor_type.shape.dim.add()  # neither a value nor a symbol: the shape is unknown
    assert _tensor_type(vi.type, {}).shape is None
    bad = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, "b", -3, -5])
    with pytest.raises(InputError, match="tensor 'y' has a negative dim -3; fix the model"):
        _check_value_info(bad, "", {}, {})
    _check_value_info(vi, "", {}, {})


def test_a_repeated_type_is_read_once_and_reads_the_same():
    """The type caches of the check and of the Graph building: a type met again gives the same
    reading, and an unsized element type still records every value that has it, in order."""
    from onnx import TensorProto, helper

    from dabench_ir.frontends.checks import _check_value_info
    from dabench_ir.frontends.onnx import _tensor_type

    types: dict = {}
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, [2, 3])
    c = helper.make_tensor_value_info("c", TensorProto.FLOAT, [2, "s"])
    assert _tensor_type(b.type, types) is _tensor_type(a.type, types) and len(types) == 1
    assert _tensor_type(c.type, types).shape == (2, "s") and len(types) == 2
    passed: dict = {}
    assert [_check_value_info(v, "", {}, passed) for v in (a, b, c, b)] == [True, True, False, True]
    assert len(passed) == 2
    unsized: dict = {}
    for name in ("p", "q", "p", "r"):
        _check_value_info(helper.make_tensor_value_info(name, TensorProto.INT4, [8]), "", unsized, passed)
    assert list(unsized) == ["p", "q", "r"] and len(passed) == 2


def test_static_and_symbolic_types_after_the_fast_paths():
    """A static shape binds to itself and has no symbols; a symbolic one still resolves, and names what is unbound."""
    from dabench_ir.errors import UnboundSymbolError
    from dabench_ir.ir import Cost, DType, TensorType

    static = TensorType((2, 3), DType.FLOAT16)
    assert static.bind({"b": 4}) is static and static.symbols == frozenset() and static.nbytes() == 12
    sym = TensorType(("b", 3, "s"), DType.FLOAT32)
    assert sym.symbols == {"b", "s"} and sym.bind({"b": 4}).shape == (4, 3, "s")
    assert sym.nbytes({"b": 4, "s": 5}) == sym.bind({"b": 4}).nbytes({"s": 5}) == 240
    with pytest.raises(UnboundSymbolError) as unbound:
        sym.dims({"b": 4})
    assert unbound.value.symbols == {"s"}
    assert TensorType((), DType.INT64).dims() == () and TensorType((), DType.INT64).nbytes() == 8
    assert Cost(1, 2, 3, 4, 5, 6) + Cost(10, 20, 30, 40, 50, 60) == Cost(11, 22, 33, 44, 55, 66)


def test_wiring_of_a_subgraph_is_still_checked():
    """The node names read once for the model's graph; a subgraph's are read by its own check: a branch
    reading a tensor nothing defines, and a branch op with too many inputs, are each refused."""
    from onnx import TensorProto, helper

    from dabench_ir.errors import InputError
    from dabench_ir.frontends.checks import check_onnx_model

    def model(branch_node):
        out = helper.make_tensor_value_info("r", TensorProto.FLOAT, [4])
        branch = helper.make_graph([branch_node], "b", [], [out])
        graph = helper.make_graph(
            [helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch)],
            "g",
            [
                helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                helper.make_tensor_value_info("x", TensorProto.FLOAT, [4]),
            ],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        )
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])

    assert check_onnx_model(model(helper.make_node("Relu", ["x"], ["r"]))) is False  # reads the outer input; a subgraph
    with pytest.raises(InputError, match="a Relu node reads tensor 'w', which no input"):
        check_onnx_model(model(helper.make_node("Relu", ["w"], ["r"])))
    with pytest.raises(InputError, match=r"a Relu node has 2 input\(s\)"):
        check_onnx_model(model(helper.make_node("Relu", ["x", "x"], ["r"])))


def test_inference_without_data_propagation_only_where_every_output_is_declared_static():
    """A model declaring a static shape for every node output is inferred without data propagation, and the
    inferred model is the one full inference gives; a symbolic dim, an undeclared output or a subgraph keeps
    the full inference, and a refused shape is still refused with the op's own message."""
    import onnx
    from onnx import parser

    from dabench_ir.errors import InputError
    from dabench_ir.frontends.checks import check_onnx_model, infer_checked

    head = '<ir_version: 8, opset_import: ["" : 17]>'
    shape = "<int64[2] s = {4, 8}>"  # a Reshape target from a constant; data propagation adds nothing here
    static = parser.parse_model(
        f"{head} g (float[2,16] A) => (float[4,8] C) {shape} {{ B = Relu(A)\n C = Reshape(B, s) }}"
    )
    static.graph.value_info.append(onnx.helper.make_tensor_value_info("B", onnx.TensorProto.FLOAT, [2, 16]))
    assert check_onnx_model(static) is True
    full = onnx.shape_inference.infer_shapes(static, strict_mode=True, data_prop=True)
    assert infer_checked(static, declared_static=True).SerializeToString() == full.SerializeToString()
    undeclared = parser.parse_model(
        f"{head} g (float[2,16] A) => (float[4,8] C) {shape} {{ B = Relu(A)\n C = Reshape(B, s) }}"
    )
    symbolic = parser.parse_model(f"{head} g (float[n,16] A) => (float[n,16] C) {{ C = Relu(A) }}")
    assert check_onnx_model(undeclared) is False and check_onnx_model(symbolic) is False
    refused = parser.parse_model(f"{head} g (float[4,7] A, float[64,64] W) => (float[4,64] C) {{ C = MatMul(A, W) }}")
    assert check_onnx_model(refused) is True
    with pytest.raises(InputError, match="Incompatible dimensions"):
        infer_checked(refused, declared_static=True)


def test_a_declared_static_model_is_checked_in_parts_as_the_whole_model_is(monkeypatch):
    """Inference in parts of two nodes refuses what inference of the whole model refuses and passes what it
    passes: a declared shape its producer contradicts a part after the constant that fixes it (the Constant
    node is copied into the part that reads it), and an op refusing its inputs in the last part; a model that
    passes is returned as it is."""
    import onnx
    from onnx import parser

    from dabench_ir.errors import InputError
    from dabench_ir.frontends import checks

    def model(reshaped: list[int], weight_rows: int) -> onnx.ModelProto:
        """``C`` and ``D`` declared ``reshaped`` (the constant says [4, 8]); ``E = D @ W``, W ``weight_rows`` x 3."""
        out = [reshaped[0], 3]
        proto = parser.parse_model(
            f"""<ir_version: 8, opset_import: ["" : 17]>
            g (float[2,16] A) => (float{out} E) {{
                s = Constant<value = int64[2] {{4, 8}}>()
                B = Relu(A)
                C = Reshape(B, s)
                D = Relu(C)
                E = MatMul(D, W)
            }}"""
        )
        proto.graph.initializer.append(
            onnx.helper.make_tensor("W", onnx.TensorProto.FLOAT, [weight_rows, 3], [0.0] * weight_rows * 3)
        )
        declared = {"s": (onnx.TensorProto.INT64, [2]), "B": (onnx.TensorProto.FLOAT, [2, 16])}
        declared |= {"C": (onnx.TensorProto.FLOAT, reshaped), "D": (onnx.TensorProto.FLOAT, reshaped)}
        proto.graph.value_info.extend(onnx.helper.make_tensor_value_info(n, t, s) for n, (t, s) in declared.items())
        assert checks.check_onnx_model(proto) is True
        return proto

    def whole_refuses(proto: onnx.ModelProto) -> bool:
        try:
            onnx.shape_inference.infer_shapes(proto, strict_mode=True, data_prop=False)
        except onnx.shape_inference.InferenceError:
            return True
        return False

    def parts_refuse(proto: onnx.ModelProto) -> bool:
        try:
            checks._infer_static(proto, checks.read_nodes(proto.graph))
        except onnx.shape_inference.InferenceError:
            return True
        return False

    monkeypatch.setattr(checks, "INFER_PART_NODES", 2)
    # the contradiction is seen only through the constant, two parts before the Reshape; the rest agrees
    good, contradicted, refused = model([4, 8], 8), model([8, 4], 4), model([4, 8], 7)
    assert [whole_refuses(m) for m in (good, contradicted, refused)] == [False, True, True]
    assert [parts_refuse(m) for m in (good, contradicted, refused)] == [False, True, True]
    assert checks.infer_checked(good, declared_static=True) is good
    with pytest.raises(InputError, match="Incompatible dimensions"):
        checks.infer_checked(refused, declared_static=True)


def test_collector_settings_of_a_command_line_run(tiny_matmul_path):
    """`main` raises the young-generation threshold; it freezes what is left only when it runs the process's
    own command line (argv None), never for a caller that goes on (tests, the API)."""
    import gc
    import subprocess
    import sys

    from dabench_ir.cli import main
    from dabench_ir.gcpolicy import YOUNG

    before = gc.get_freeze_count()
    assert main(["profile", str(tiny_matmul_path), "--quiet"]) == 0
    assert gc.get_freeze_count() == before and gc.get_threshold()[0] == YOUNG
    code = (
        "import gc, sys; from dabench_ir.cli import main; sys.argv = ['dabench-ir', 'profile', sys.argv[1], "
        "'--quiet']; rc = main(); print(rc, gc.get_freeze_count() > 0)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tiny_matmul_path)], capture_output=True, text=True, check=True
    )
    assert done.stdout.split() == ["0", "True"]


def test_nodes_out_of_order_pass_and_a_cycle_is_still_refused():
    """The acyclic check passes nodes in topological order without Kahn's walk; nodes out of order
    (acyclic) still pass, and a cycle, or a node reading its own output, is still refused by the walk."""
    from onnx import TensorProto, helper

    from dabench_ir.errors import InputError
    from dabench_ir.frontends.checks import check_onnx_model

    def model(*nodes):
        x, y = (helper.make_tensor_value_info(n, TensorProto.FLOAT, [4]) for n in ("x", "y"))
        return helper.make_model(
            helper.make_graph(list(nodes), "g", [x], [y]), opset_imports=[helper.make_opsetid("", 18)]
        )

    relu = helper.make_node
    assert check_onnx_model(model(relu("Relu", ["x"], ["a"]), relu("Relu", ["a"], ["y"]))) is False  # in order
    assert check_onnx_model(model(relu("Relu", ["a"], ["y"]), relu("Relu", ["x"], ["a"]))) is False  # out of order
    with pytest.raises(InputError, match="the graph has a cycle \\(node 'n1' depends on its own output\\)"):
        check_onnx_model(
            model(
                relu("Relu", ["b"], ["a"], name="n1"), relu("Relu", ["a"], ["b"], name="n2"), relu("Relu", ["a"], ["y"])
            )
        )
    with pytest.raises(InputError, match="the graph has a cycle \\(node 'self' depends"):
        check_onnx_model(model(relu("Add", ["x", "y"], ["y"], name="self")))


@pytest.fixture(scope="module")
def exported_llama():
    """A one-block LLaMA as the exporter writes it (scopes in the node metadata, attributes, no weights)."""
    from dabench_ir.models.config import ModelConfig
    from dabench_ir.models.export import export_onnx

    return export_onnx(ModelConfig(family="llama", layers=1, hidden=64, heads=2, seq=8), weights="none")


def test_the_graph_is_built_from_the_nodes_the_checks_read(exported_llama):
    """`load_onnx` builds its nodes from `read_nodes` of the exported model (one read for the checks and
    the Graph): the same names, ops, wiring, attributes and scopes as read from the inferred model's protos."""
    import onnx

    from dabench_ir.frontends.checks import read_nodes
    from dabench_ir.frontends.onnx import _attributes, _scope_of, load_onnx, onnx_node_names

    inferred = onnx.shape_inference.infer_shapes(exported_llama, data_prop=True)
    graph = load_onnx(exported_llama)
    reads = read_nodes(inferred.graph)
    assert [n.name for n in graph.nodes] == onnx_node_names(inferred.graph)
    assert [(n.op_type, n.domain, n.inputs, n.outputs) for n in graph.nodes] == [r[1:5] for r in reads]
    assert [n.attrs for n in graph.nodes] == [_attributes(r[5])[0] for r in reads]
    assert [n.scope for n in graph.nodes] == [_scope_of(r[0], r[0].name) for r in reads]
    assert any(n.attrs for n in graph.nodes) and any(n.scope for n in graph.nodes)


def test_a_value_name_is_one_object_wherever_the_graph_holds_it(exported_llama):
    """Each node input and output is the very key its value has in ``graph.values`` (a read of a
    protobuf field builds a new str each time): a lookup by name finds its key by identity."""
    from dabench_ir.frontends.onnx import load_onnx

    graph = load_onnx(exported_llama)
    keys = {name: name for name in graph.values}
    wired = [v for n in graph.nodes for v in (*n.inputs, *n.outputs) if v]
    assert len(wired) > len(graph.nodes)
    assert all(v is keys[v] for v in (*wired, *graph.inputs, *graph.outputs))
    assert all(value.name is name for name, value in graph.values.items())


def test_a_nodes_cost_is_its_rule_count_plus_its_default_bytes(exported_llama):
    """The cost pass builds a node's Cost once (`Cost.plus_bytes`) and sizes each value type once per pass:
    the same Cost as the rule's count plus `default_bytes`, exactly."""
    from dabench_ir.frontends.onnx import load_onnx
    from dabench_ir.ir import Cost
    from dabench_ir.passes import meta, standard_passes
    from dabench_ir.passes.cost_rules import OpView, find_rule

    cost = Cost(1, 2, 3, 4, 5, 6)
    assert cost.plus_bytes(10, 20, 30) == cost + Cost(weight_bytes=10, act_bytes_in=20, act_bytes_out=30)
    graph = standard_passes()(load_onnx(exported_llama)).graph
    shared: dict[int, int] = {}
    costed = 0
    for node in graph.nodes:
        rule = find_rule(node)
        if rule is None or rule.custom_bytes or meta.FOLDED in node.meta:
            continue
        alone = OpView(node, graph, rule)
        assert (
            alone.rule.fn(alone) + alone.default_bytes()
            == node.meta[meta.COST]
            == OpView(node, graph, rule, shared).cost()
        )
        costed += 1
    assert costed > 20 and 0 < len(shared) < costed


def test_graph_symbols_are_every_values_symbols():
    from dabench_ir.ir import DType, Graph, TensorType, Value, ValueKind

    t = TensorType(("batch", 4), DType.FLOAT32)
    values = {
        "a": Value("a", t, ValueKind.INPUT),
        "b": Value("b", t, ValueKind.ACTIVATION),
        "c": Value("c", TensorType((2, "seq"), DType.FLOAT16), ValueKind.OUTPUT),
        "d": Value("d", TensorType(None, DType.FLOAT32), ValueKind.ACTIVATION),
    }
    assert Graph([], values, ["a"], ["c"]).symbols == frozenset({"batch", "seq"})


def test_serial_sweep_tasks_run_with_the_collector_tuned_and_give_it_back():
    """A sweep at --jobs 1 runs its tasks in the caller's process with `gcpolicy`'s threshold, as a
    worker process does, and leaves the caller's thresholds as they were."""
    import gc

    from dabench_ir.gcpolicy import YOUNG
    from dabench_ir.sweep.executors import SerialExecutor

    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    try:
        seen = [out for _, out in SerialExecutor().map_unordered([(gc.get_threshold, ())] * 2)]
        assert [t[0] for t in seen] == [YOUNG, YOUNG]
        assert gc.get_threshold() == (700, 10, 10)
    finally:
        gc.set_threshold(*before)
