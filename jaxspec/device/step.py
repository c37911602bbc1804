"""The one-engine step: forward -> verify -> commit -> automaton extend -> next drafts.

Two jitted entry points, both pure functions of pytrees:

  prefill(...)  runs one prompt chunk per row and picks each row's next token from the logits at its
                last valid position (used when the chunk completes the prompt).
  step(...)     runs `[B, 1 + K]` = the last committed token and K draft slots per row, verifies the
                drafts (verify.py), and — with the suffix automaton drafter — extends each row's
                automaton with exactly the committed tokens and looks up the next drafts, all on the
                device. The drafts wait in a `DraftBuffer` indexed by automaton slot until the next
                step reads them, so they never travel to the host.

KV rollback needs nothing here: every input position is written, and the host advances the
sequence length by `num_new_tokens` only (kv_cache.py's diagram).

Static configuration lives in the frozen, hashable `StepConfig`, passed as a static argument (one
compilation per distinct config and input shapes; see jaxspec/schedule.py for the buckets).
"""

import dataclasses
import functools
from typing import Any, Literal

import flax.struct
import jax
import jax.numpy as jnp
from flax import nnx

from jaxspec.device import kv_cache
from jaxspec.device import sampling
from jaxspec.device import verify

Drafting = Literal["none", "host", "sa", "sa_global"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepConfig:
    """Everything static about a compiled step.

    Attributes:
      graphdef: the model's NNX graph definition (weights are passed separately).
      k: draft slots per row this step (0 = plain decoding through the same machinery).
      greedy_only: no row samples, so no sampling code is compiled.
      drafting: where drafts come from: "none"; "host" (the inputs carry them: NGram, user
        drafters); "sa" / "sa_global" (the device draft buffer, refilled by the automaton).
      sa_draft_len: columns of the draft buffer (the largest K the automaton ever drafts).
      max_ngram_size: automaton lookup mode: -1 longest match, M > 0 fixed sizes M..1.
      min_match_len: automaton drafts behind a shorter match are not verified.
      sa_implementation: "pallas", "xla" or None (Pallas on GPU, XLA elsewhere).
    """

    graphdef: Any
    k: int
    greedy_only: bool = True
    drafting: Drafting = "none"
    sa_draft_len: int = 0
    max_ngram_size: int = -1
    min_match_len: int = 1
    sa_implementation: str | None = None

    def __post_init__(self):
        if self.k < 0:
            raise ValueError(f"k must be >= 0, got {self.k}")
        if self.drafting in ("sa", "sa_global") and self.k > self.sa_draft_len:
            raise ValueError(f"k ({self.k}) exceeds the draft buffer width ({self.sa_draft_len})")
        # jit hashes its static arguments on every call; hashing a 30-layer graphdef costs ~2 ms.
        object.__setattr__(self, "_hash", hash(tuple(
            getattr(self, f.name) for f in dataclasses.fields(self))))

    def __hash__(self):
        return self._hash


@flax.struct.dataclass
class DraftBuffer:
    """The automaton's next drafts, one row per automaton slot.

    Attributes:
      tokens: i32[num_slots + 1, sa_draft_len]; zero past lens.
      lens: i32[num_slots + 1] real draft length.
      match_len: i32[num_slots + 1] match length behind the draft.
    """

    tokens: jax.Array
    lens: jax.Array
    match_len: jax.Array


def init_draft_buffer(num_rows: int, draft_len: int) -> DraftBuffer:
    return DraftBuffer(tokens=jnp.zeros((num_rows, draft_len), jnp.int32),
                       lens=jnp.zeros((num_rows,), jnp.int32),
                       match_len=jnp.zeros((num_rows,), jnp.int32))


@flax.struct.dataclass
class StepInputs:
    """One verify step's batch.

    Attributes:
      last_tokens: i32[B] each row's last committed token (not yet in the cache).
      drafts: i32[B, K] host drafts ("host" drafting); ignored otherwise (may be [B, 0]).
      draft_lens: i32[B] real host draft lengths; ignored unless "host".
      view: cache view with num_new = 1 + K for real rows and 0 for padding rows.
      sampling: per-row sampling parameters.
      slots: i32[B] each row's automaton slot (the dummy slot for padding rows); ignored unless
        drafting is "sa" / "sa_global".
    """

    last_tokens: jax.Array
    drafts: jax.Array
    draft_lens: jax.Array
    view: kv_cache.CacheView
    sampling: sampling.SamplingArrays
    slots: jax.Array


@flax.struct.dataclass
class StepOutputs:
    """What the host reads back after a step.

    Attributes:
      new_tokens: i32[B, K+1] committed tokens (accepted drafts, then the bonus token); zero past
        num_new_tokens.
      num_new_tokens: i32[B] accepted drafts + 1.
      draft_lens: i32[B] drafts really verified this step (padding excluded).
      match_len: i32[B] automaton match length behind the verified drafts (0 otherwise).
      next_draft_lens: i32[B] length of the automaton's next admitted drafts (0 behind a match
        shorter than min_match_len, and without the automaton), already on the device: lets
        the host size the next step's K without another sync.
      next_match_len: i32[B] match length behind the next drafts.
    """

    new_tokens: jax.Array
    num_new_tokens: jax.Array
    draft_lens: jax.Array
    match_len: jax.Array
    next_draft_lens: jax.Array
    next_match_len: jax.Array


def _forward_logits(graphdef, params, tokens, kv, view):
    model = nnx.merge(graphdef, params)
    hidden, kv = model(tokens, kv, view)
    return model, hidden, kv


@functools.partial(jax.jit, static_argnames=("cfg",), donate_argnames=("kv",))
def prefill(params, kv: kv_cache.KVPages, tokens: jax.Array, view: kv_cache.CacheView,
            sampling_arrays: sampling.SamplingArrays, *, cfg: StepConfig):
    """One prompt chunk per row.

    Args:
      params: the model's NNX state.
      kv: cache pages (donated: updated in place).
      tokens: i32[B, C] chunk tokens, padded past view.num_new[b].
      view: rows' page tables; lengths = tokens of the prompt already cached.
      sampling_arrays: per-row sampling parameters.
      cfg: static configuration (its graphdef and greedy_only are used).

    Returns:
      (kv, next_tokens i32[B]) — the token after each row's last valid chunk position.
    """
    model, hidden, kv = _forward_logits(cfg.graphdef, params, tokens, kv, view)
    last = jnp.maximum(view.num_new - 1, 0)
    logits = model.logits(jnp.take_along_axis(hidden, last[:, None, None], axis=1))   # [B, 1, V]
    positions = (view.lengths + view.num_new)[:, None]
    chosen = sampling.choose_tokens(logits, sampling_arrays, positions,
                                    greedy_only=cfg.greedy_only)
    return kv, chosen[:, 0]


def _lookup_fn(cfg: StepConfig):
    from jaxspec import pallas_kernels  # Pallas backends load only when the automaton is used.

    if cfg.drafting == "sa_global":
        def run(sa, slots, new_tokens, num_new, active_mask):
            return pallas_kernels.sa_extend_and_global_search(
                sa, slots, new_tokens, num_new, active_mask, draft_len=cfg.sa_draft_len,
                max_ngram_size=cfg.max_ngram_size, implementation=cfg.sa_implementation)
    else:
        def run(sa, slots, new_tokens, num_new, active_mask):
            del active_mask
            return pallas_kernels.sa_extend_and_lookup(
                sa, slots, new_tokens, num_new, draft_len=cfg.sa_draft_len,
                max_ngram_size=cfg.max_ngram_size, implementation=cfg.sa_implementation)
    return run


def refill_drafts(cfg: StepConfig, sa, buf: DraftBuffer, slots, new_tokens, num_new, active_mask):
    """Extends the automata with the committed tokens and stores the next drafts per slot."""
    sa, match_len, drafts, lens = _lookup_fn(cfg)(sa, slots, new_tokens, num_new, active_mask)
    buf = DraftBuffer(tokens=buf.tokens.at[slots].set(drafts), lens=buf.lens.at[slots].set(lens),
                      match_len=buf.match_len.at[slots].set(match_len))
    return sa, buf


def _admitted(cfg: StepConfig, buf: DraftBuffer, slots):
    """(draft lengths worth verifying, match lengths) of the drafts waiting for `slots`: none
    behind a match shorter than cfg.min_match_len."""
    match_len = buf.match_len[slots]
    return jnp.where(match_len >= cfg.min_match_len, buf.lens[slots], 0), match_len


@functools.partial(jax.jit, static_argnames=("cfg",), donate_argnames=("kv", "sa", "buf"))
def step(params, kv: kv_cache.KVPages, sa, buf: DraftBuffer | None, active_mask,
         inputs: StepInputs, *, cfg: StepConfig):
    """Forward over [B, 1+K], verify, commit, and (automaton drafting) refill the drafts.

    Args:
      params: the model's NNX state.
      kv: cache pages (donated).
      sa: the automaton state (donated), or None unless drafting is "sa"/"sa_global".
      buf: the draft buffer (donated), or None likewise.
      active_mask: bool[num_slots + 1] slots searchable by the global pool, or None.
      inputs: the batch.
      cfg: static configuration.

    Returns:
      (kv, sa, buf, StepOutputs).
    """
    k = cfg.k
    none = jnp.zeros_like(inputs.last_tokens)
    match_len = next_lens = next_match = none
    if cfg.drafting in ("sa", "sa_global"):
        drafts = buf.tokens[inputs.slots, :k]
        draft_lens, match_len = _admitted(cfg, buf, inputs.slots)
        draft_lens = jnp.minimum(draft_lens, k)
    elif cfg.drafting == "host":
        drafts, draft_lens = inputs.drafts, jnp.minimum(inputs.draft_lens, k)
    else:
        drafts = jnp.zeros((inputs.last_tokens.shape[0], k), jnp.int32)
        draft_lens = none
    # Padding rows (num_new == 0) verify nothing.
    draft_lens = jnp.where(inputs.view.num_new > 0, draft_lens, 0)
    tokens = jnp.concatenate([inputs.last_tokens[:, None], drafts], axis=1)      # [B, 1+K]

    model, hidden, kv = _forward_logits(cfg.graphdef, params, tokens, kv, inputs.view)
    positions = inputs.view.lengths[:, None] + 1 + jnp.arange(k + 1, dtype=jnp.int32)[None, :]
    target = sampling.choose_tokens(model.logits(hidden), inputs.sampling, positions,
                                    greedy_only=cfg.greedy_only)
    new_tokens, num_new = verify.accept(drafts, draft_lens, target)
    if cfg.drafting in ("sa", "sa_global"):
        num_commit = jnp.where(inputs.view.num_new > 0, num_new, 0)
        sa, buf = refill_drafts(cfg, sa, buf, inputs.slots, new_tokens, num_commit, active_mask)
        next_lens, next_match = _admitted(cfg, buf, inputs.slots)
    return kv, sa, buf, StepOutputs(new_tokens=new_tokens, num_new_tokens=num_new,
                                    draft_lens=draft_lens, match_len=match_len,
                                    next_draft_lens=next_lens, next_match_len=next_match)


@functools.partial(jax.jit, static_argnames=("cfg",), donate_argnames=("sa", "buf"))
def prime_drafts(sa, buf: DraftBuffer, active_mask, slots: jax.Array, *, cfg: StepConfig):
    """First drafts for requests whose automaton was just built: a lookup that extends nothing.

    Args:
      slots: i32[B] the new requests' slots (padding rows use the dummy slot).
    """
    nothing = jnp.zeros((slots.shape[0], 1), jnp.int32)
    zero = jnp.zeros(slots.shape, jnp.int32)
    return refill_drafts(cfg, sa, buf, slots, nothing, zero, active_mask)
