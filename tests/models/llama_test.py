"""The Llama model's fused layout: one matmul per fused projection, Megatron sharding by KV heads
that hands each device the heads separate q/k/v would, KV head replication, and an embedding
gathered in the table's own dtype."""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.device import kv_cache
from jaxspec.models import checkpoint
from jaxspec.models import precision
from jaxspec.models import tiny


def _forward_stablehlo(model, t: int = 5) -> str:
    graphdef, state = nnx.split(model)
    spec = model.cache_spec
    kv = kv_cache.init_pages(num_layers=spec.num_layers, num_pages=2, page_size=16,
                             num_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim,
                             dtype=spec.dtype)
    view = kv_cache.CacheView(page_table=jnp.ones((1, 1), jnp.int32),
                              lengths=jnp.zeros((1,), jnp.int32), num_new=jnp.full((1,), t))

    def forward(state, tokens):
        return nnx.merge(graphdef, state)(tokens, kv, view)[0]
    return jax.jit(forward).lower(state, jnp.zeros((1, t), jnp.int32)).as_text()


def test_each_fused_projection_is_one_matmul_and_the_table_is_never_cast():
    model = precision.cast(tiny.tiny_model(0), "bfloat16")
    cfg, text = model.cfg, _forward_stablehlo(model)
    dots = [line for line in text.splitlines() if "stablehlo.dot_general" in line]
    layer = model.layers[0]
    for kernel in (layer.qkv_proj.kernel, layer.gate_up_proj.kernel):
        kernel_type = "x".join(map(str, kernel.shape)) + "xbf16>"
        assert sum(kernel_type in line for line in dots) == cfg.num_layers, kernel.shape
    assert f"tensor<{cfg.vocab_size}x{cfg.hidden_size}xf32>" not in text


@pytest.mark.parametrize("size", [1, 2])
def test_param_specs_give_each_device_its_kv_heads_with_their_query_heads(size):
    model = tiny.tiny_model(0)
    cfg = model.cfg
    groups = cfg.num_heads // cfg.num_kv_heads
    specs = dict(nnx.to_flat_state(model.param_specs("model", size)))
    assert specs[("layers", 0, "qkv_proj", "kernel")] == jax.P(None, "model", None, None)
    assert specs[("layers", 0, "gate_up_proj", "kernel")] == jax.P(None, None, "model")
    separate = checkpoint.flat_params(model)
    qkv = np.asarray(model.layers[0].qkv_proj.kernel[...])
    gate_up = np.asarray(model.layers[0].gate_up_proj.kernel[...])

    def shards(name):          # a separate projection split by output features, as it was
        return np.split(separate[f"layers.{name}.kernel"][0], size, axis=-1)

    for s, (held, q, k, v) in enumerate(zip(np.split(qkv, size, axis=1), shards("q_proj"),
                                            shards("k_proj"), shards("v_proj"), strict=True)):
        d = held.shape[0]
        np.testing.assert_array_equal(held[:, :, :groups].reshape(d, -1), q, err_msg=f"{s}")
        np.testing.assert_array_equal(held[:, :, groups].reshape(d, -1), k, err_msg=f"{s}")
        np.testing.assert_array_equal(held[:, :, groups + 1].reshape(d, -1), v, err_msg=f"{s}")
    for held, gate, up in zip(np.split(gate_up, size, axis=2), shards("gate_proj"),
                              shards("up_proj"), strict=True):
        np.testing.assert_array_equal(held[:, 0], gate)
        np.testing.assert_array_equal(held[:, 1], up)


def test_with_kv_heads_repeats_keys_and_values_and_keeps_the_function(forward):
    model = tiny.tiny_model(1, num_heads=8, num_kv_heads=2, hidden_size=64)
    repeated = model.with_kv_heads(4)
    assert repeated.cfg.num_kv_heads == 4 and repeated.cache_spec.num_kv_heads == 4
    old, new = checkpoint.flat_params(model), checkpoint.flat_params(repeated)
    hd = model.cfg.resolved_head_dim
    for name in ("layers.k_proj.kernel", "layers.v_proj.kernel"):
        heads = old[name].reshape(old[name].shape[:-1] + (2, hd))
        np.testing.assert_array_equal(new[name], np.repeat(heads, 2, axis=-2).reshape(
            new[name].shape))
    for name in old.keys() - {"layers.k_proj.kernel", "layers.v_proj.kernel"}:
        np.testing.assert_array_equal(new[name], old[name], err_msg=name)
    tokens = np.random.default_rng(0).integers(0, model.cfg.vocab_size, (2, 9))
    np.testing.assert_allclose(forward(repeated, tokens), forward(model, tokens),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("num_kv_heads", [3, 8])
def test_with_kv_heads_that_do_not_fit_are_value_errors(num_kv_heads):
    with pytest.raises(ValueError, match=f"cannot repeat 2 KV heads into {num_kv_heads}"):
        tiny.tiny_model(0).with_kv_heads(num_kv_heads)
