"""A tiny random Llama for fast tests: every architectural feature of the real model, at toy size.

It has GQA (4 query heads over 2 KV heads), two layers, and RMSNorm weights that are not all ones,
so a loader that swaps or drops a norm is caught. It is deterministic in its seed.
"""

import dataclasses

from flax import nnx
import jax
import jax.numpy as jnp

from jaxspec.models import llama


def tiny_config(**overrides) -> llama.LlamaConfig:
    """The tiny architecture; keyword overrides replace fields (e.g. `tie_embeddings=False`)."""
    cfg = llama.LlamaConfig(
        vocab_size=128,          # large enough for random prompts to rarely repeat tokens
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,            # two, so a layer-stacking mistake shows up
        num_heads=4,
        num_kv_heads=2,          # grouped-query: 2 query heads share each KV head
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        tie_embeddings=True,
    )
    return dataclasses.replace(cfg, **overrides)


def tiny_model(seed: int = 0, **overrides) -> llama.LlamaForCausalLM:
    """A randomly initialized tiny model; the same seed and overrides give the same weights."""
    model = llama.LlamaForCausalLM(tiny_config(**overrides), rngs=nnx.Rngs(seed))
    key = jax.random.key(seed)
    norms = [x.input_norm for x in model.layers] + [x.post_norm for x in model.layers]
    for norm in norms + [model.norm]:
        key, sub = jax.random.split(key)
        norm.weight[...] = 1.0 + 0.1 * jax.random.normal(sub, norm.weight.shape, jnp.float32)
    return model
