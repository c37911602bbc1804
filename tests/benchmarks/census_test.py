"""The GPU step's op census (`benchmarks.census`): the step lowered for CUDA on this CPU-only
machine, its ops counted per decoder layer, and the counts pinned, so a change that adds a kernel,
a matmul, a conversion or a loop to the GPU step shows here without a GPU."""

import json

import jax
from jax import export
import jax.numpy as jnp
import pytest

from benchmarks import census

# ---------------------------------------------------------------------------------------------
# PINNED CENSUS: update these when the model or the step changes on purpose.
# Per decoder layer and outside the layers (embedding, final norm, logits, verify), SmolLM2-135M's
# shapes, batch 1, host drafts, the Pallas kernels, per numerics: what `python -m
# benchmarks.census` printed for the working tree with fused QKV and gate/up weights, the new
# tokens' attention inside the kernel and float32 activations. A whole step is num_layers *
# "layer" + "outside". Fast: XLA's 4 projection matmuls beside the attention kernel, bfloat16
# converting each matmul's input (4) where float32 converts nothing of its own; exact: 5 Triton
# kernels per layer (4 row-invariant linear layers, causal attention) and no XLA matmul.
_FAST_F32 = dict(layer=dict(dot_general=4, reduce=5, convert=5, custom_call=1, while_loops=0),
                 outside=dict(dot_general=1, reduce=6, convert=7, custom_call=0, while_loops=0))
_FAST_BF16 = dict(layer=dict(dot_general=4, reduce=5, convert=9, custom_call=1, while_loops=0),
                  outside=dict(dot_general=1, reduce=6, convert=11, custom_call=0,
                               while_loops=0))
_EXACT_OUTSIDE = dict(dot_general=0, reduce=3, convert=4, custom_call=1, while_loops=0)
_EXACT_F32 = dict(layer=dict(dot_general=0, reduce=1, convert=15, custom_call=5, while_loops=0),
                  outside=_EXACT_OUTSIDE)
_EXACT_BF16 = dict(layer=dict(dot_general=0, reduce=1, convert=21, custom_call=5, while_loops=0),
                   outside=_EXACT_OUTSIDE)
PINNED = {
    "fast": {(0, "float32"): _FAST_F32, (0, "bfloat16"): _FAST_BF16,
             (4, "float32"): _FAST_F32, (4, "bfloat16"): _FAST_BF16},
    "exact": {(0, "float32"): _EXACT_F32, (0, "bfloat16"): _EXACT_BF16,
              (4, "float32"): _EXACT_F32, (4, "bfloat16"): _EXACT_BF16},
}
# The custom calls every layer makes: Triton kernels (attention; and the linear layers, exact).
LAYER_CUSTOM_CALLS = {"fast": {"__gpu$xla.gpu.triton": 1}, "exact": {"__gpu$xla.gpu.triton": 5}}
# ---------------------------------------------------------------------------------------------
KEYS = ("dot_general", "reduce", "convert", "custom_call", "while_loops")


def _check(variant: dict, num_layers: int, numerics: str = "fast"):
    pinned = PINNED[numerics][variant["k"], variant["dtype"]]
    assert len(variant["layers"]) == num_layers
    for i, layer in enumerate(variant["layers"]):
        assert {key: layer[key] for key in KEYS} == pinned["layer"], f"layer {i}"
        assert layer["custom_call_targets"] == LAYER_CUSTOM_CALLS[numerics], f"layer {i}"
        assert layer["runtime_while_loops"] == 0
    assert {key: variant["outside"][key] for key in KEYS} == pinned["outside"]
    for key in KEYS:
        assert variant["total"][key] == num_layers * pinned["layer"][key] + pinned["outside"][key]


@pytest.mark.parametrize("numerics", ["fast", "exact"])
def test_pinned_census_on_two_layers(numerics):
    """Every variant, lowered with two layers (each layer's ops and the rest do not depend on
    the depth): the pinned counts, layer by layer."""
    result = census.census(num_layers=2, numerics=numerics)
    assert [(v["k"], v["dtype"]) for v in result["variants"]] == list(PINNED[numerics])
    for variant in result["variants"]:
        _check(variant, 2, numerics)
    met = {t["name"]: t["met"] for t in result["targets"]}
    # Fast mode has one kernel and four XLA matmuls a layer; exact mode five kernels and none.
    assert (met["custom calls per layer"], met["dot_generals per layer"]) == (
        (True, True) if numerics == "fast" else (False, True))
    assert met["bfloat16 / float32 converts, K=0"] and met["bfloat16 / float32 converts, K=4"]
    assert met["while loops with a run-time trip count"]
    text = census.markdown(result)
    assert "| K=4 bfloat16 | layers 0-1, each | " in text
    assert "| issue 31 target | measured | limit | met |" in text


@pytest.mark.slow
def test_pinned_census_of_the_whole_model(tmp_path, capsys):
    """`python -m benchmarks.census --json`: SmolLM2-135M's 30 layers, the same pins."""
    path = tmp_path / "census.json"
    assert census.main(["--json", str(path), "--numerics", "fast"]) == 0
    result = json.loads(path.read_text())
    assert result["num_layers"] == 30
    for variant in result["variants"]:
        _check(variant, 30)
    assert "| K=0 float32 | layers 0-29, each | " in capsys.readouterr().out


def test_the_xla_path_has_loops_with_run_time_trip_counts():
    """The attention reference reads the cache up to each row's length: a loop whose trip
    count the GPU learns only at run time, in every layer. The census sees each one."""
    counts = census.count(census.lower(4, "float32", num_layers=2, implementation="xla"), 2)
    assert counts["total"]["custom_call"] == 0
    for layer in counts["layers"]:
        assert layer["while_loops"] >= 1 and layer["runtime_while_loops"] == layer["while_loops"]
    assert counts["outside"]["while_loops"] == 0


def _loops(fn, *args) -> list[bool]:
    text = export.export(jax.jit(fn))(*args).mlir_module()
    functions, _ = census.parse(text)
    defs, known = {}, []
    for op in functions["main"]:
        defs.update((r, op) for r in op.results)
        if op.name == "stablehlo.while":
            known.append(census.trip_count_known(op, [defs]))
    return known


def test_trip_counts_known_at_compile_time_or_only_at_run_time():
    def fn(x, n):
        fixed = jax.lax.fori_loop(0, 10, lambda i, c: c * 2.0, x)
        carried = jax.lax.while_loop(lambda c: c[0] < c[1], lambda c: (c[0] + 1, c[1], c[2] + 1),
                                     (0, 7, x))[2]
        bounded_by_input = jax.lax.fori_loop(0, n, lambda i, c: c + 1.0, x)
        data_dependent = jax.lax.while_loop(lambda c: c < 100.0, lambda c: c * 3.0, x)
        return fixed + carried + bounded_by_input + data_dependent

    scalar = lambda dtype: jax.ShapeDtypeStruct((), dtype)          # noqa: E731
    assert _loops(fn, scalar(jnp.float32), scalar(jnp.int32)) == [True, True, False, False]


def test_ops_outside_any_layer_scope_are_an_error():
    text = export.export(jax.jit(lambda x: x @ x))(
        jax.ShapeDtypeStruct((2, 2), jnp.float32)).mlir_module()
    assert census.count(text, 0)["outside"]["dot_general"] == 1
    with pytest.raises(ValueError, match="named scopes"):
        census.count(text, 2)


def test_targets_judge_each_limit():
    def variant(k, dtype, dots, converts, runtime_loops=0):
        layer = dict(dot_general=dots, custom_call=1)
        return dict(k=k, dtype=dtype, layers=[layer, layer],
                    total=dict(convert=converts, runtime_while_loops=runtime_loops))

    rows = census.targets([variant(0, "float32", 5, 10), variant(0, "bfloat16", 5, 20)])
    assert [(r["name"], r["measured"], r["met"]) for r in rows] == [
        ("dot_generals per layer", 5, True), ("custom calls per layer", 1, True),
        ("while loops with a run-time trip count", 0, True),
        ("bfloat16 / float32 converts, K=0", 2.0, True)]
    rows = census.targets([variant(4, "float32", 6, 10), variant(4, "bfloat16", 5, 21, 1)])
    assert [r["met"] for r in rows] == [False, True, False, False]
