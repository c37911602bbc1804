"""The suffix-automaton enhancer: SA drafts override another drafter's where the automaton matched.

A neural drafter (a draft model, MTP heads, early exit) guesses; the automaton copies text already
seen. When the automaton's match is long, copying beats guessing, so the whole row of neural drafts
is replaced by the automaton's continuation (TensorRT-LLM `SADraftEnhancer`, trtllm-semantics
§5.4). It runs once, after the neural draft loop, so neural layers never condition on SA tokens.

The row is replaced whole, as in TensorRT-LLM, including positions past the automaton's real
continuation (zero-filled here): verification is exact match, so a useless tail costs verify slots,
never correctness.
"""

import jax
import jax.numpy as jnp


def enhance(neural_drafts: jax.Array, sa_drafts: jax.Array, match_len: jax.Array, *,
            threshold: int) -> jax.Array:
    """Rows whose automaton match is at least `threshold` tokens take the automaton's drafts.

    Example: with threshold 4, match lengths ``[3, 4]`` keep row 0's neural drafts and give row 1
    the SA drafts.

    Args:
      neural_drafts: i32[B, K] the other drafter's drafts.
      sa_drafts: i32[B, K] the automaton's drafts (zero past its real continuation).
      match_len: i32[B] length of the suffix the automaton matched for each row.
      threshold: static; the smallest match length that overrides, >= 1
        (`SAEnhancerConfig.threshold`).

    Returns:
      i32[B, K].

    Raises:
      ValueError: `threshold` < 1, or shapes that do not line up.
    """
    if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 1:
        raise ValueError(f"threshold must be an int >= 1, got {threshold!r}")
    if neural_drafts.ndim != 2 or sa_drafts.shape != neural_drafts.shape:
        raise ValueError(f"drafts must both be [B, K], got {neural_drafts.shape} and "
                         f"{sa_drafts.shape}")
    if match_len.shape != neural_drafts.shape[:1]:
        raise ValueError(f"match_len must be [{neural_drafts.shape[0]}], got {match_len.shape}")
    return jnp.where((match_len >= threshold)[:, None], sa_drafts, neural_drafts)
