"""Choosing the target's token at each position: greedy argmax, or a sample.

Every sample is keyed by the request's seed and the absolute position of the token it produces:
`key = fold_in(PRNGKey(seed), position)`. So a request's output does not depend on batching,
chunking, or on how many positions one step verifies. That is what makes sampled speculation
lossless token for token: the token the target would sample at position p is the same whether p
is reached by plain decoding or inside a verify window.

Temperature 0 means greedy. top_k = 0 and top_p = 1 disable those filters. Both filters find their
cut-off by bisection on the value axis (tens of vectorised passes over the vocabulary) instead of
sorting 50k-260k logits per position.
"""

import flax.struct
import jax
import jax.numpy as jnp

from jaxspec.device import attention

_BISECT_STEPS = 40


@flax.struct.dataclass
class SamplingArrays:
    """Per-row sampling parameters.

    Attributes:
      temperature: f32[B]; 0 = greedy.
      top_k: i32[B]; 0 = off.
      top_p: f32[B]; 1 = off.
      seed: i32[B] the request's seed.
    """

    temperature: jax.Array
    top_k: jax.Array
    top_p: jax.Array
    seed: jax.Array


def _top_k_threshold(logits: jax.Array, k: jax.Array) -> jax.Array:
    """Largest tau with at least k logits >= tau (bisection), f32[V], i32[] -> f32[]."""
    def body(_, lo_hi):
        lo, hi = lo_hi
        mid = (lo + hi) / 2
        enough = jnp.sum(logits >= mid) >= k
        return jnp.where(enough, mid, lo), jnp.where(enough, hi, mid)

    lo, _ = jax.lax.fori_loop(0, _BISECT_STEPS, body, (jnp.min(logits), jnp.max(logits) + 1.0))
    return lo


def _top_p_threshold(probs: jax.Array, p: jax.Array) -> jax.Array:
    """Largest tau whose tokens with prob >= tau hold at least mass p (the nucleus)."""
    def body(_, lo_hi):
        lo, hi = lo_hi
        mid = (lo + hi) / 2
        enough = jnp.sum(jnp.where(probs >= mid, probs, 0.0)) >= p
        return jnp.where(enough, mid, lo), jnp.where(enough, hi, mid)

    lo, _ = jax.lax.fori_loop(0, _BISECT_STEPS, body, (jnp.zeros(()), jnp.max(probs) + 1e-6))
    return lo


def _sample_one(logits, temperature, top_k, top_p, key):
    """f32[V] -> i32[] for one position of a sampling row."""
    scaled = logits / jnp.maximum(temperature, 1e-6)
    scaled = jax.lax.cond(
        top_k > 0,
        lambda x: jnp.where(x >= _top_k_threshold(x, top_k), x, attention.MASK_VALUE),
        lambda x: x, scaled)

    def nucleus(x):
        probs = jax.nn.softmax(x)
        return jnp.where(probs >= _top_p_threshold(probs, top_p), x, attention.MASK_VALUE)

    scaled = jax.lax.cond(top_p < 1.0, nucleus, lambda x: x, scaled)
    return jax.random.categorical(key, scaled).astype(jnp.int32)


def top2(logits: jax.Array) -> jax.Array:
    """f32[..., V] -> f32[..., 2]: the best and the second-best logit. Their difference is how far
    greedy decoding was from choosing otherwise (the greedy-equivalence report's measure of a
    near tie); the best one gives the scale of rounding errors."""
    return jax.lax.top_k(logits.astype(jnp.float32), 2)[0]


def choose_tokens(logits: jax.Array, params: SamplingArrays, positions: jax.Array, *,
                  greedy_only: bool) -> jax.Array:
    """The target's token at every position.

    Args:
      logits: f32[B, T, V].
      params: per-row sampling parameters.
      positions: i32[B, T] absolute position of the token each logit row produces.
      greedy_only: static; when True (every row has temperature 0) no sampling code is traced.

    Returns:
      i32[B, T].
    """
    greedy = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    if greedy_only:
        return greedy
    base = jax.vmap(jax.random.key)(params.seed)                                  # [B]
    keys = jax.vmap(jax.vmap(jax.random.fold_in, (None, 0)), (0, 0))(base, positions)
    per_pos = jax.vmap(jax.vmap(_sample_one, (0, None, None, None, 0)), (0, 0, 0, 0, 0))
    sampled = per_pos(logits, params.temperature, params.top_k, params.top_p, keys)
    return jnp.where(params.temperature[:, None] > 0, sampled, greedy)
