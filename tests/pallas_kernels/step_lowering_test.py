"""The whole jitted step lowers for CUDA with every kernel in place (the automaton's extend and
lookup, and paged attention in each layer), on this CPU-only machine: the integration of the
kernels, not only the kernels, is checked without a GPU."""

from flax import nnx
import jax
from jax import export
import jax.numpy as jnp
import pytest

from jaxspec import sa_layout
from jaxspec.device import kv_cache
from jaxspec.device import sampling
from jaxspec.device import step as step_lib
from jaxspec.models import precision


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_step_with_every_kernel_lowers_for_cuda(tiny_lm, dtype):
    model = precision.cast(tiny_lm, dtype)
    graphdef, params = nnx.split(model)
    spec = model.cache_spec
    rows, k, cols, page = 2, 3, 8, 16
    pages = jax.ShapeDtypeStruct((spec.num_layers, 17, page, spec.num_kv_heads, spec.head_dim),
                                 model.dtype)
    sa = jax.eval_shape(lambda: sa_layout.init_state(rows, 128))
    state = step_lib.DeviceState(
        kv=kv_cache.KVPages(k=pages, v=pages), sa=sa,
        drafts=step_lib.DraftBuffer(tokens=jax.ShapeDtypeStruct((rows + 1, k), jnp.int32),
                                    lens=jax.ShapeDtypeStruct((rows + 1,), jnp.int32),
                                    match_len=jax.ShapeDtypeStruct((rows + 1,), jnp.int32)),
        active_mask=jax.ShapeDtypeStruct((rows + 1,), jnp.bool_))
    i32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32)          # noqa: E731
    f32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)        # noqa: E731
    inputs = step_lib.StepInputs(
        last_tokens=i32(rows), drafts=i32(rows, k), draft_lens=i32(rows), slots=i32(rows),
        view=kv_cache.CacheView(page_table=i32(rows, cols), lengths=i32(rows),
                                num_new=i32(rows), implementation="pallas"),
        sampling=sampling.SamplingArrays(temperature=f32(rows), top_k=i32(rows),
                                         top_p=f32(rows), seed=i32(rows)))
    cfg = step_lib.StepConfig(graphdef=graphdef, k=k, draft_source="sa", automaton=True,
                              sa_draft_len=k, implementation="pallas")
    exported = export.export(
        jax.jit(lambda p, s, x: step_lib.step(p, s, x, cfg=cfg)), platforms=("cuda",),
        disabled_checks=[export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")],
    )(jax.eval_shape(lambda: params), state, inputs)
    # One attention kernel per layer, and the automaton's extend + lookup.
    assert exported.mlir_module().count("xla.gpu.triton") == spec.num_layers + 1


@pytest.mark.parametrize("numerics", ["fast", "exact"])
def test_tree_step_lowers_for_cuda(tiny_lm, numerics):
    """A token-tree step (host drafts, the tree mask in every layer's attention kernel, the
    accepted path's keys and values moved) lowers for CUDA in both numerics."""
    graphdef, params = nnx.split(tiny_lm)
    spec = tiny_lm.cache_spec
    rows, k, cols, page = 2, 8, 8, 16
    pages = jax.ShapeDtypeStruct((spec.num_layers, 17, page, spec.num_kv_heads, spec.head_dim),
                                 tiny_lm.dtype)
    i32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32)          # noqa: E731
    f32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)        # noqa: E731
    inputs = step_lib.StepInputs(
        last_tokens=i32(rows), drafts=i32(rows, k), draft_lens=i32(rows), slots=i32(rows),
        view=kv_cache.CacheView(page_table=i32(rows, cols), lengths=i32(rows),
                                num_new=i32(rows), implementation="pallas", numerics=numerics),
        sampling=sampling.SamplingArrays(temperature=f32(rows), top_k=i32(rows),
                                         top_p=f32(rows), seed=i32(rows)),
        parents=i32(rows, k))
    cfg = step_lib.StepConfig(graphdef=graphdef, k=k, draft_source="host", tree=True,
                              implementation="pallas")
    exported = export.export(
        jax.jit(lambda p, s, x: step_lib.step(p, s, x, cfg=cfg)), platforms=("cuda",),
        disabled_checks=[export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")],
    )(jax.eval_shape(lambda: params), step_lib.DeviceState(kv=kv_cache.KVPages(k=pages, v=pages)),
      inputs)
    text = exported.mlir_module()
    if numerics == "fast":              # one attention kernel per layer, the mask inside it
        assert text.count("xla.gpu.triton") == spec.num_layers
    else:                               # jitted kernels shared by the layers' calls
        assert "causal_attention_pages_per_block" in text and "linear_block_k" in text
