"""Paged attention against a dense brute-force reference, cached decoding against an uncached
forward, and one compilation for every live length.

Lengths cross page and block boundaries and include 0; batches mix rows of different lengths with
padding rows; both formulations of `cached_attention` run (block-diagonal for few query rows, per
KV head for many).
"""

import functools

from absl.testing import parameterized
import chex
from flax import nnx
import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.device import attention
from jaxspec.device import kv_cache
from jaxspec.device import sampling
from jaxspec.device import step as step_lib


def _pages(rng, shape, dtype):
    k = jnp.asarray(rng.standard_normal(shape), dtype)
    v = jnp.asarray(rng.standard_normal(shape), dtype)
    return k, v


def _tables(rng, batch, cols, num_pages):
    """Distinct pages in shuffled order per row, so the indirection really matters."""
    pages = rng.permutation(np.arange(1, num_pages))[:batch * cols].reshape(batch, cols)
    return pages.astype(np.int32)


def _reference_partials(q, k_pages, v_pages, table, lengths, layer):
    """(acc, m, l) in float64 over every slot of the table, masked at the lengths."""
    q = np.asarray(q, np.float64)
    b, hkv, _, d = q.shape
    k = np.asarray(k_pages.astype(jnp.float32), np.float64)[layer][table].reshape(b, -1, hkv, d)
    v = np.asarray(v_pages.astype(jnp.float32), np.float64)[layer][table].reshape(b, -1, hkv, d)
    s = np.einsum("bhqd,bkhd->bhqk", q, k)
    valid = (np.arange(k.shape[1])[None, :] < np.asarray(lengths)[:, None])[:, None, None, :]
    m = np.where(valid, s, -np.inf).max(-1)
    m = np.where(np.isfinite(m), m, np.float32(attention.MASK_VALUE))
    p = np.exp(np.where(valid, s - m[..., None], -np.inf))
    return np.einsum("bhqk,bkhd->bhqd", p, v), m, p.sum(-1)


class CachedAttentionTest(parameterized.TestCase):

    @parameterized.product(
        heads=[(1, 1), (2, 3), (3, 3)],          # (Hkv, G)
        t=[1, 5, 12],                            # Hkv * G * T from 1 to 108: both formulations
        pages_per_block=[1, 3, 32],              # 32: a tail of 16-page blocks
        dtype=["float32", "bfloat16"],
    )
    def test_matches_dense_reference(self, heads, t, pages_per_block, dtype):
        hkv, g = heads
        page_size, cols, d, layers = 4, 10, 8, 2
        lengths = np.asarray([0, 1, 4, 5, 12, 13, 25, 40], np.int32)  # 40: the whole table
        b = len(lengths)
        rng = np.random.default_rng(hkv * 100 + t * 10 + pages_per_block)
        num_pages = b * cols + 1
        k_pages, v_pages = _pages(rng, (layers, num_pages, page_size, hkv, d), dtype)
        table = _tables(rng, b, cols, num_pages)
        q = jnp.asarray(rng.standard_normal((b, hkv, g * t, d)), jnp.float32) * d ** -0.5

        fn = jax.jit(functools.partial(attention.cached_attention, layer=1,
                                       pages_per_block=pages_per_block))
        acc, m, l = fn(q, k_pages, v_pages, jnp.asarray(table), jnp.asarray(lengths))
        ref_acc, ref_m, ref_l = _reference_partials(q, k_pages, v_pages, table, lengths, 1)
        tol = 1e-5 if dtype == "float32" else 1e-4   # bf16 values are exact in f32: only order
        chex.assert_trees_all_close((acc, m, l), (ref_acc, ref_m, ref_l), atol=tol, rtol=tol)
        # A row with nothing cached: exactly the empty partials.
        np.testing.assert_array_equal(np.asarray(m[0]), np.float32(attention.MASK_VALUE))
        np.testing.assert_array_equal(np.asarray(l[0]), 0.0)
        np.testing.assert_array_equal(np.asarray(acc[0]), 0.0)

    def test_reads_nothing_past_the_longest_row(self):
        """Pages past every row's length may hold anything (NaN here): they are never read."""
        rng = np.random.default_rng(0)
        k_pages, v_pages = _pages(rng, (1, 9, 4, 1, 8), "float32")
        table = np.asarray([[1, 2, 3, 4, 5, 6, 7, 8]], np.int32)
        k_pages = k_pages.at[:, 3:].set(jnp.nan)
        v_pages = v_pages.at[:, 3:].set(jnp.nan)
        q = jnp.asarray(rng.standard_normal((1, 1, 2, 8)), jnp.float32)
        acc, _, l = attention.cached_attention(q, k_pages, v_pages, jnp.asarray(table),
                                               jnp.asarray([8], jnp.int32), layer=0,
                                               pages_per_block=2)
        assert np.all(np.isfinite(np.asarray(acc))) and np.all(np.isfinite(np.asarray(l)))


def _reference_attention(q, k_new, v_new, kv, table, lengths):
    """Softmax over [gathered cache, new keys] with the cache masked at the length and the new
    keys causally, in float64."""
    b, t, hq, d = q.shape
    hkv = k_new.shape[2]
    g = hq // hkv
    kc = np.asarray(kv.k, np.float64)[0][table].reshape(b, -1, hkv, d)
    vc = np.asarray(kv.v, np.float64)[0][table].reshape(b, -1, hkv, d)
    keys = np.concatenate([kc, np.asarray(k_new, np.float64)], axis=1)
    values = np.concatenate([vc, np.asarray(v_new, np.float64)], axis=1)
    keys, values = np.repeat(keys, g, axis=2), np.repeat(values, g, axis=2)  # head h -> h // g
    s = np.einsum("bthd,bkhd->bhtk", np.asarray(q, np.float64), keys) * d ** -0.5
    c = kc.shape[1]
    cached = np.arange(c)[None, :] < np.asarray(lengths)[:, None]              # [B, C]
    causal = np.arange(t)[None, :] <= np.arange(t)[:, None]                    # [T, T]
    valid = np.concatenate([np.broadcast_to(cached[:, None, :], (b, t, c)),
                            np.broadcast_to(causal[None], (b, t, t))], axis=2)[:, None]
    s = np.where(valid, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bhtk,bkhd->bthd", p, values)


@pytest.mark.parametrize("t", [1, 6, 40, 300])  # decode, verify, prompt chunks (300: 3 tiles)
@pytest.mark.parametrize("heads", [(2, 2), (3, 3)])
def test_paged_attention_matches_dense_reference(t, heads):
    hkv, g = heads
    page_size, cols, d = 2, 80, 8                # 160 slots: past both block sizes' boundaries
    lengths = np.asarray([0, 1, 31, 32, 33, 127, 128, 129, 160], np.int32)
    b = len(lengths)
    rng = np.random.default_rng(t * 10 + hkv)
    num_pages = b * cols + 1
    kv = kv_cache.KVPages(*_pages(rng, (1, num_pages, page_size, hkv, d), "float32"))
    table = _tables(rng, b, cols, num_pages)
    table[0] = kv_cache.NULL_PAGE                 # a padding row: nothing allocated
    q = jnp.asarray(rng.standard_normal((b, t, hkv * g, d)), jnp.float32)
    k_new = jnp.asarray(rng.standard_normal((b, t, hkv, d)), jnp.float32)
    v_new = jnp.asarray(rng.standard_normal((b, t, hkv, d)), jnp.float32)
    num_new = np.full((b,), t, np.int32)
    num_new[0] = 0
    view = kv_cache.CacheView(page_table=jnp.asarray(table), lengths=jnp.asarray(lengths),
                              num_new=jnp.asarray(num_new))

    out = jax.jit(attention.paged_attention, static_argnums=4)(q, k_new, v_new, kv, 0, view)
    chex.assert_trees_all_close(out, _reference_attention(q, k_new, v_new, kv, table, lengths),
                                atol=1e-5, rtol=1e-5)


# --- the tiny model: cached decoding equals an uncached forward -----------------------------------

MAX_LEN = 160                 # past a 64-page block at page size 2 and 3
CHUNK = 32                    # prompt chunks: Hkv * G * 32 = 128 rows, the per-head formulation
WINDOWS = (1, 4)              # decode and verify windows: the block-diagonal formulation


@functools.partial(jax.jit, static_argnames=("graphdef",), donate_argnames=("kv",))
def _forward(params, kv, tokens, view, *, graphdef):
    model = nnx.merge(graphdef, params)
    hidden, kv = model(tokens, kv, view)
    return model.logits(hidden), kv


@pytest.mark.parametrize("page_size", [2, 3])
@hypothesis.settings(max_examples=6, deadline=None)
@hypothesis.given(data=st.data())
def test_cached_decoding_equals_uncached_forward(page_size, data, forward, tiny_lm):
    """A prompt prefilled in chunks, then windows of 1 or 4 tokens up to MAX_LEN: every window's
    logits equal those of one uncached forward over the whole sequence."""
    graphdef, params = nnx.split(tiny_lm)
    spec = tiny_lm.cache_spec
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    tokens = rng.integers(0, tiny_lm.vocab_size, MAX_LEN).astype(np.int32)
    expected = forward(tiny_lm, tokens[None])[0]
    cols = -(-(MAX_LEN + max(WINDOWS)) // page_size)
    table = jnp.asarray(rng.permutation(np.arange(1, cols + 1)).astype(np.int32)[None])
    kv = kv_cache.init_pages(num_layers=spec.num_layers, num_pages=cols + 1,
                             page_size=page_size, num_kv_heads=spec.num_kv_heads,
                             head_dim=spec.head_dim)
    prompt_len = data.draw(st.integers(1, MAX_LEN - 1), label="prompt")
    length = 0
    while length < MAX_LEN:
        prefilling = length < prompt_len
        width = CHUNK if prefilling else data.draw(st.sampled_from(WINDOWS), label="window")
        n = min(width, (prompt_len if prefilling else MAX_LEN) - length)
        window = np.zeros((1, width), np.int32)
        window[0, :n] = tokens[length:length + n]
        view = kv_cache.CacheView(page_table=table, lengths=jnp.asarray([length], jnp.int32),
                                  num_new=jnp.asarray([n], jnp.int32))
        logits, kv = _forward(params, kv, jnp.asarray(window), view, graphdef=graphdef)
        np.testing.assert_allclose(np.asarray(logits[0, :n]), expected[length:length + n],
                                   atol=1e-4, rtol=0)
        length += n


def test_one_compilation_for_every_live_length(tiny_lm):
    """The jitted step traces once for a bucket (rows x T) whatever the rows' lengths: the loop's
    trip count is a traced value, not a shape."""
    graphdef, params = nnx.split(tiny_lm)
    spec = tiny_lm.cache_spec
    page_size, cols = 2, 100
    kv = kv_cache.init_pages(num_layers=spec.num_layers, num_pages=2 * cols + 1,
                             page_size=page_size, num_kv_heads=spec.num_kv_heads,
                             head_dim=spec.head_dim)
    state = step_lib.init_state(kv)
    table = np.arange(1, 2 * cols + 1, dtype=np.int32).reshape(2, cols)
    cfg = step_lib.StepConfig(graphdef=graphdef, k=0)
    greedy = sampling.SamplingArrays(temperature=np.zeros(2, np.float32),
                                     top_k=np.zeros(2, np.int32), top_p=np.ones(2, np.float32),
                                     seed=np.zeros(2, np.int32))
    before = step_lib.trace_count("step")
    for lengths in ([0, 0], [5, 0], [40, 3], [127, 128], [129, 199]):
        inputs = step_lib.StepInputs(
            last_tokens=np.ones(2, np.int32), drafts=np.zeros((2, 0), np.int32),
            draft_lens=np.zeros(2, np.int32), sampling=greedy, slots=np.zeros(2, np.int32),
            view=kv_cache.CacheView(page_table=table, lengths=np.asarray(lengths, np.int32),
                                    num_new=np.ones(2, np.int32)))
        state, out = step_lib.step(params, state, inputs, cfg=cfg)
        jax.block_until_ready(out)
    assert step_lib.trace_count("step") - before <= 1


def test_cached_decoding_in_bfloat16_stays_within_bfloat16_of_the_uncached_forward(forward,
                                                                                   tiny_lm):
    """bfloat16 weights, activations and KV pages: cached windows agree with one uncached
    forward of the same bfloat16 model to bfloat16's precision (8 significant bits)."""
    from jaxspec.models import precision

    model = precision.cast(tiny_lm, "bfloat16")
    graphdef, params = nnx.split(model)
    spec = model.cache_spec
    tokens = np.random.default_rng(3).integers(0, model.vocab_size, 70).astype(np.int32)
    expected = forward(model, tokens[None])[0]
    kv = kv_cache.init_pages(num_layers=spec.num_layers, num_pages=20, page_size=4,
                             num_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim,
                             dtype=jnp.bfloat16)
    table = jnp.arange(1, 20, dtype=jnp.int32)[None]
    length = 0
    for n in (32, 1, 4, 1, 4, 4, 24):                       # chunks of 32, windows of 4
        window = np.zeros((1, 32 if n > 4 else 4), np.int32)
        window[0, :n] = tokens[length:length + n]
        view = kv_cache.CacheView(page_table=table, lengths=jnp.asarray([length], jnp.int32),
                                  num_new=jnp.asarray([n], jnp.int32))
        logits, kv = _forward(params, kv, jnp.asarray(window), view, graphdef=graphdef)
        got = np.asarray(logits[0, :n])
        want = expected[length:length + n]
        np.testing.assert_allclose(got, want, atol=0.05 * np.abs(want).max())
        assert (got.argmax(-1) == want.argmax(-1)).mean() >= 0.75
        length += n


@pytest.mark.parametrize("cols", [1, 16, 17, 40, 64, 65, 100, 128, 129, 512])
@pytest.mark.parametrize("page_size", [2, 16])
@pytest.mark.parametrize("pages_per_block", [attention.DECODE_PAGES_PER_BLOCK,
                                             attention.PREFILL_PAGES_PER_BLOCK])
def test_block_loops_cover_every_length(cols, page_size, pages_per_block):
    """Against a brute-force walk: at every length the loops fold each needed page once, in
    blocks that never start past the length."""
    loops = attention.block_loops(cols, page_size, pages_per_block, 0)
    if cols <= attention.TAIL_PAGES_PER_BLOCK:
        assert loops is None
        return
    for length in range(cols * page_size + 1):
        pages, tail, whole, stop = map(int, attention.block_loops(cols, page_size,
                                                                  pages_per_block, length))
        first = list(range(whole * pages))
        second = list(range(whole * pages, stop * tail))
        needed = -(-length // page_size)
        assert first + second == list(range(len(first) + len(second)))
        assert needed <= len(first) + len(second) < needed + tail
        assert whole * pages * page_size <= length
