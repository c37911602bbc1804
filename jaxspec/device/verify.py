"""Exact-match verification of model-free drafts.

Vocabulary (per batch row, one verify step):
  input        `[t, d_0, ..., d_{K-1}]`: the last committed token t (not yet in the KV cache) and K
               draft slots, of which only the first `draft_len` are real drafts; the rest are
               padding to the compiled bucket's static K and are never accepted.
  target       `y_j`, the token the target model chooses after input position j (greedy argmax or
               a keyed sample, see sampling.py), j = 0..K.
  accepted     d_j is accepted iff j < draft_len and d_i == y_i for every i <= j. Model-free drafts
               have no proposal distribution, so exact match is the only lossless rule: every
               accepted token is the token the target itself would have produced there.
  bonus        y_a, where a = number of accepted drafts: the target's own token after the last
               accepted draft. It is always committed, so each step commits a + 1 >= 1 tokens.
  committed    `new_tokens[:a+1] = [d_0 .. d_{a-1}, y_a]` — equal to y_0..y_a.
"""

import jax
import jax.numpy as jnp


def accept(drafts: jax.Array, draft_lens: jax.Array, target: jax.Array
           ) -> tuple[jax.Array, jax.Array]:
    """Longest matching draft prefix plus the bonus token.

    Args:
      drafts: i32[B, K] draft slots (only the first draft_lens[b] are real).
      draft_lens: i32[B].
      target: i32[B, K+1] the target's token after each input position.

    Returns:
      new_tokens: i32[B, K+1] committed tokens; entries past num_new_tokens[b] are 0.
      num_new_tokens: i32[B] = accepted drafts + 1.
    """
    k = drafts.shape[1]
    real = jnp.arange(k, dtype=jnp.int32)[None, :] < draft_lens[:, None]
    match = (drafts == target[:, :k]) & real
    num_accepted = jnp.sum(jnp.cumprod(match.astype(jnp.int32), axis=1), axis=1)
    num_new = num_accepted + 1
    # Committed tokens equal the target's tokens up to and including the bonus position.
    keep = jnp.arange(k + 1, dtype=jnp.int32)[None, :] < num_new[:, None]
    return jnp.where(keep, target, 0), num_new.astype(jnp.int32)
