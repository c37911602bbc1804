"""Shared fixtures for the model tests: the real default model (loaded once), a full forward over a
fresh paged cache, and a tiny byte-level BPE vocabulary for writing toy checkpoints."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tokenizers
from flax import nnx

from jaxspec.device import kv_cache
from jaxspec.models import registry

PAGE_SIZE = 16


@pytest.fixture(scope="session")
def smollm2():
    """(model, tokenizer) of the embedded default, through the on-disk cache."""
    return registry.load(None)


@functools.lru_cache(maxsize=4)
def _jitted_forward(graphdef):
    @jax.jit
    def forward(state, tokens):
        model = nnx.merge(graphdef, state)
        b, t = tokens.shape
        num_pages = -(-t // PAGE_SIZE)
        spec = model.cache_spec
        kv = kv_cache.init_pages(num_layers=spec.num_layers, num_pages=num_pages + 1,
                                 page_size=PAGE_SIZE, num_kv_heads=spec.num_kv_heads,
                                 head_dim=spec.head_dim)
        view = kv_cache.CacheView(
            page_table=jnp.arange(1, num_pages + 1, dtype=jnp.int32)[None, :] * jnp.ones(
                (b, 1), jnp.int32),
            lengths=jnp.zeros((b,), jnp.int32), num_new=jnp.full((b,), t, jnp.int32))
        hidden, _ = model(tokens, kv, view)
        return model.logits(hidden)
    return forward


def full_logits(model, tokens) -> np.ndarray:
    """Logits f32[B, T, V] of a whole prompt in one forward over an empty cache.

    Every row gets the same pages, which is harmless: nothing is read from the cache when all
    lengths are 0, and the writes are discarded.
    """
    graphdef, state = nnx.split(model)
    return np.asarray(_jitted_forward(graphdef)(state, jnp.asarray(tokens, jnp.int32)))


@pytest.fixture(scope="session")
def forward():
    return full_logits


@pytest.fixture(scope="session")
def byte_vocab():
    """A tiny byte-level BPE vocabulary: 3 control tokens, the 256 byte symbols, a few merges and
    one user-defined token.

    Returns (tokens, merges, token_types) with GGUF token types (1 normal, 3 control, 4 user).
    """
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    alphabet = sorted(tokenizers.pre_tokenizers.ByteLevel.alphabet())
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n")]
    tokens = specials + alphabet + [a + b for a, b in merges] + ["<tool>"]
    types = [3] * len(specials) + [1] * (len(tokens) - len(specials) - 1) + [4]
    return tokens, [f"{a} {b}" for a, b in merges], types
