"""The tiny test model: deterministic in its seed, GQA, non-trivial norms, overridable."""

import numpy as np

from jaxspec.models import checkpoint
from jaxspec.models import tiny


def test_same_seed_same_weights_other_seed_other_weights():
    a, b, c = (checkpoint.flat_params(tiny.tiny_model(s)) for s in (0, 0, 1))
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])
    assert all(not np.array_equal(a[name], c[name]) for name in a)


def test_architecture_is_small_grouped_query_and_has_real_norms():
    cfg = tiny.tiny_config()
    assert 64 <= cfg.vocab_size <= 256 and cfg.num_layers == 2
    assert cfg.num_heads > cfg.num_kv_heads and cfg.num_heads % cfg.num_kv_heads == 0
    params = checkpoint.flat_params(tiny.tiny_model(0))
    for name in ("layers.input_norm.weight", "layers.post_norm.weight", "norm.weight"):
        assert not np.allclose(params[name], 1.0), name
    np.testing.assert_array_equal(params["layers.q_proj.kernel"].shape, (2, 64, 64))


def test_overrides_replace_fields():
    model = tiny.tiny_model(0, vocab_size=200, tie_embeddings=False)
    assert model.cfg.vocab_size == 200 and model.lm_head is not None
    assert all(v.dtype == np.float32 for v in checkpoint.flat_params(model).values())


def test_bfloat16_copy_computes_in_bfloat16_with_float32_logits(forward):
    import jax.numpy as jnp

    from jaxspec.models import precision

    original = tiny.tiny_model(seed=0)
    half = precision.cast(original, "bfloat16")
    assert half.dtype == jnp.bfloat16 and original.dtype == jnp.float32     # a copy
    assert precision.cast(half, "bfloat16") is half
    tokens = np.random.default_rng(0).integers(0, 128, (2, 17))
    full, low = forward(original, tokens), forward(half, tokens)
    assert low.dtype == np.float32
    # bfloat16 keeps 8 significant bits: logits agree to about 1% of their spread.
    np.testing.assert_allclose(low, full, atol=0.02 * np.abs(full).max())
    assert (low.argmax(-1) == full.argmax(-1)).mean() > 0.9


def test_tied_logits_are_the_same_whichever_operand_comes_first():
    # A few positions take the table-first matmul, one position and many the hidden-first one.
    from jaxspec.models import llama

    model = tiny.tiny_model(0)
    table = np.asarray(model.embed.embedding[...])
    rng = np.random.default_rng(0)
    for shape in [(1, 1), (1, 3), (2, 5), (1, llama.FEW_POSITIONS + 1)]:
        hidden = rng.standard_normal((*shape, table.shape[1])).astype(np.float32)
        np.testing.assert_allclose(np.asarray(model.logits(hidden)), hidden @ table.T,
                                   rtol=1e-5, atol=1e-5)
