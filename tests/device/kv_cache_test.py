"""Cached decoding equals an uncached full forward, across page boundaries and after rollbacks."""

import functools

from flax import nnx
import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.device import kv_cache
from jaxspec.models import tiny

MODEL = tiny.tiny_model(seed=3)
GRAPHDEF, PARAMS = nnx.split(MODEL)
SPEC = MODEL.cache_spec
MAX_LEN = 32          # longest sequence a case builds
WINDOW = 4            # tokens per incremental forward (padded with num_new)
NUM_PAGES = 24


@functools.partial(jax.jit, donate_argnames=("kv",))
def _forward(params, kv, tokens, view):
    model = nnx.merge(GRAPHDEF, params)
    hidden, kv = model(tokens, kv, view)
    return model.logits(hidden), kv


def _fresh(page_size):
    return kv_cache.init_pages(num_layers=SPEC.num_layers, num_pages=NUM_PAGES,
                               page_size=page_size, num_kv_heads=SPEC.num_kv_heads,
                               head_dim=SPEC.head_dim)


def _view(table, length, num_new):
    return kv_cache.CacheView(page_table=jnp.asarray(table)[None],
                              lengths=jnp.asarray([length], jnp.int32),
                              num_new=jnp.asarray([num_new], jnp.int32))


def _uncached_logits(tokens, page_size, table):
    padded = np.zeros((1, MAX_LEN), np.int32)
    padded[0, :len(tokens)] = tokens
    logits, _ = _forward(PARAMS, _fresh(page_size), jnp.asarray(padded),
                         _view(table, 0, len(tokens)))
    return np.asarray(logits[0, :len(tokens)])


@pytest.mark.parametrize("page_size", [2, 5])
@hypothesis.settings(max_examples=12, deadline=None)
@hypothesis.given(data=st.data())
def test_cached_equals_uncached_with_rollbacks(page_size, data):
    """Writes of up to WINDOW tokens, the last `r` of them junk (rejected drafts) rolled back."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    true = rng.integers(0, MODEL.vocab_size, MAX_LEN).astype(np.int32)
    num_cols = -(-(MAX_LEN + WINDOW) // page_size)
    # Pages in a shuffled order, so the page-table indirection is really exercised.
    table = (rng.permutation(NUM_PAGES - 1)[:num_cols] + 1).astype(np.int32)
    expected = _uncached_logits(true, page_size, table)

    kv, length = _fresh(page_size), 0
    while length < MAX_LEN:
        keep = data.draw(st.integers(1, min(WINDOW, MAX_LEN - length)), label="keep")
        junk = data.draw(st.integers(0, WINDOW - keep), label="rolled back")
        window = np.zeros((1, WINDOW), np.int32)
        window[0, :keep] = true[length:length + keep]
        window[0, keep:keep + junk] = rng.integers(0, MODEL.vocab_size, junk)
        logits, kv = _forward(PARAMS, kv, jnp.asarray(window),
                              _view(table, length, keep + junk))
        np.testing.assert_allclose(np.asarray(logits[0, :keep]),
                                   expected[length:length + keep], atol=1e-4, rtol=0)
        length += keep          # rollback: only the length moves back over the junk


def test_padding_rows_and_tokens_never_write():
    """A padding row (num_new = 0) and padded positions touch only the null page."""
    page_size = 4
    kv = _fresh(page_size)
    table = np.array([[1, 2], [0, 0]], np.int32)
    view = kv_cache.CacheView(page_table=jnp.asarray(table), lengths=jnp.zeros(2, jnp.int32),
                              num_new=jnp.asarray([3, 0], jnp.int32))
    tokens = jnp.ones((2, 6), jnp.int32)
    _, kv = _forward(PARAMS, kv, tokens, view)
    k = np.asarray(kv.k)
    assert np.any(k[:, 1, :3] != 0)                      # the 3 valid tokens of row 0
    assert np.all(k[:, 1, 3:] == 0) and np.all(k[:, 2:] == 0)


def test_write_slots_maps_positions_through_the_page_table():
    view = kv_cache.CacheView(page_table=jnp.asarray([[5, 9, 2]], jnp.int32),
                              lengths=jnp.asarray([3], jnp.int32),
                              num_new=jnp.asarray([4], jnp.int32))
    page, offset = kv_cache.write_slots(view, 6, page_size=2)
    # positions 3..8: pages [9, 2, 2, null(past the table), null(padding), null(padding)]
    np.testing.assert_array_equal(np.asarray(page[0]), [9, 2, 2, 0, 0, 0])
    np.testing.assert_array_equal(np.asarray(offset[0]), [1, 0, 1, 0, 1, 0])
