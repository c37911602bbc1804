"""Token choice: greedy, keyed sampling, top-k, top-p, and the sampled distribution."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import scipy.stats

from jaxspec.device import sampling


def _params(b, temperature=1.0, top_k=0, top_p=1.0, seed=0):
    return sampling.SamplingArrays(temperature=jnp.full((b,), temperature, jnp.float32),
                                   top_k=jnp.full((b,), top_k, jnp.int32),
                                   top_p=jnp.full((b,), top_p, jnp.float32),
                                   seed=jnp.arange(b, dtype=jnp.int32) + seed)


@functools.partial(jax.jit, static_argnames=("greedy_only",))
def _choose(logits, params, positions, greedy_only=False):
    return sampling.choose_tokens(logits, params, positions, greedy_only=greedy_only)


LOGITS = jnp.log(jnp.asarray([0.5, 0.25, 0.15, 0.07, 0.03], jnp.float32))


def _expected(n, probs):
    probs = np.asarray(probs, np.float64)
    return n * probs / probs.sum()


def _sample_many(n, **kw):
    logits = jnp.broadcast_to(LOGITS[None, None, :], (n, 1, 5))
    return np.asarray(_choose(logits, _params(n, **kw), jnp.zeros((n, 1), jnp.int32))[:, 0])


def test_greedy_is_argmax():
    logits = jax.random.normal(jax.random.key(0), (3, 4, 11))
    out = _choose(logits, _params(3, temperature=0.0), jnp.zeros((3, 4), jnp.int32),
                  greedy_only=True)
    np.testing.assert_array_equal(np.asarray(out), np.argmax(np.asarray(logits), -1))
    # The sampling code path gives the same answer for temperature-0 rows.
    out2 = _choose(logits, _params(3, temperature=0.0), jnp.zeros((3, 4), jnp.int32))
    np.testing.assert_array_equal(np.asarray(out2), np.asarray(out))


def test_sample_depends_only_on_seed_and_position():
    logits = jax.random.normal(jax.random.key(1), (1, 3, 50))
    pos = jnp.asarray([[7, 8, 9]], jnp.int32)
    a = _choose(logits, _params(1, seed=4), pos)
    # The same row placed second in a batch, next to another request, at the same positions.
    batch = jnp.concatenate([jax.random.normal(jax.random.key(2), (1, 3, 50)), logits])
    p = _params(2, seed=3)
    b = _choose(batch, p, jnp.concatenate([pos, pos]))
    np.testing.assert_array_equal(np.asarray(a[0]), np.asarray(b[1]))
    # One position alone (a verify window of 1) samples the same token as inside the window.
    c = _choose(logits[:, 1:2], _params(1, seed=4), pos[:, 1:2])
    assert int(c[0, 0]) == int(a[0, 1])


def test_distribution_matches_softmax():
    counts = np.bincount(_sample_many(4000), minlength=5)
    expected = _expected(4000, jax.nn.softmax(LOGITS))
    assert scipy.stats.chisquare(counts, expected).pvalue > 1e-3


def test_temperature_sharpens():
    counts = np.bincount(_sample_many(4000, temperature=0.5), minlength=5)
    expected = _expected(4000, jax.nn.softmax(LOGITS / 0.5))
    assert scipy.stats.chisquare(counts, expected).pvalue > 1e-3


def test_top_k_restricts_support():
    out = _sample_many(2000, top_k=2)
    assert set(np.unique(out)) == {0, 1}
    counts = np.bincount(out, minlength=2)[:2]
    assert scipy.stats.chisquare(counts, _expected(2000, [2, 1])).pvalue > 1e-3


def test_top_p_keeps_the_nucleus():
    # 0.5 + 0.25 = 0.75 >= 0.7: the nucleus is tokens {0, 1}.
    assert set(np.unique(_sample_many(2000, top_p=0.7))) == {0, 1}
    # 0.5 + 0.25 + 0.15 = 0.9 >= 0.8 -> {0, 1, 2}.
    assert set(np.unique(_sample_many(3000, top_p=0.8))) == {0, 1, 2}
