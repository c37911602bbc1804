"""The one-engine step: forward -> verify -> commit -> automaton extend -> next drafts.

Three jitted entry points, pure functions of pytrees. Each takes the executor's `DeviceState`
(donated: updated in place) and returns it:

  prefill(...)       runs one prompt chunk per row and picks each row's next token from the logits
                     at its last valid position (used when the chunk completes the prompt).
  prime_drafts(...)  the first drafts of automata just copied from the host.
  step(...)          runs `[B, 1 + K]` = the last committed token and K draft slots per row,
                     verifies the drafts (verify.py), and — with device automata — extends each
                     row's automaton with exactly the committed tokens and looks up the next
                     drafts, all on the device. The drafts wait in a `DraftBuffer` indexed by
                     automaton slot until the next step reads them, so they never travel to the
                     host. Host drafts may be token trees (`StepConfig.tree`, tree.py).

KV rollback needs nothing here: every input position is written, and the host advances the
sequence length by `num_new_tokens` only (kv_cache.py's diagram).

Static configuration lives in the frozen, hashable `StepConfig`, passed as a static argument (one
compilation per distinct config and input shapes; see jaxspec/schedule.py for the buckets).
`trace_count` counts how often each entry point was traced, i.e. compiled (or loaded from the
persistent compilation cache): tests pin it, and the executor reports the time of the iterations
that compiled apart from the steady state.
"""

import collections
import dataclasses
import functools
from typing import Any
from typing import Literal
import weakref

from flax import nnx
import flax.struct
import jax
import jax.numpy as jnp

from jaxspec import sa_layout
from jaxspec.device import enhancer
from jaxspec.device import kv_cache
from jaxspec.device import ops
from jaxspec.device import sampling
from jaxspec.device import sharding
from jaxspec.device import tree as tree_lib
from jaxspec.device import verify

DraftSource = Literal["none", "host", "sa"]
_TRACES: collections.Counter = collections.Counter()


def trace_count(name: str) -> int:
    """Times the entry point `name` ("prefill", "step", "prime_drafts") has been traced."""
    return _TRACES[name]


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepConfig:
    """Everything static about a compiled step.

    Attributes:
      graphdef: the model's NNX graph definition (weights are passed separately).
      k: draft slots per row this step (0 = plain decoding through the same machinery).
      greedy_only: no row samples, so no sampling code is compiled.
      draft_source: "none"; "host" (the inputs carry the drafts: NGram, user drafters); "sa"
        (the device draft buffer, refilled by the automata).
      automaton: device automata are extended with the committed tokens ("sa", or "host" with
        an enhancer).
      global_pool: the automata draft from the best active slot, not only their own.
      sa_draft_len: columns of the draft buffer (the largest K the automaton ever drafts).
      max_ngram_size: automaton lookup mode: -1 longest match, M > 0 fixed sizes M..1.
      min_match_len: automaton drafts behind a shorter match are not verified.
      enhancer_threshold: with host drafts, rows whose automaton match is at least this long
        verify the automaton's drafts instead (None: no enhancer).
      top2: also return the target's two best logits at every position (the
        greedy-equivalence report reads them).
      logits: also return the target's float32 logits at every position (the teacher-forced
        divergence report compares them; `benchmarks.teacher_forced`).
      implementation: the automaton kernels: "pallas", "xla" or None (Pallas on GPU, XLA
        elsewhere); attention's is the cache view's.
      mesh: the device mesh the state and batch are sharded over (`jaxspec.device.sharding`),
        or None; outputs come back replicated and the state keeps its shardings.
      tree: the host drafts are token trees (`StepInputs.parents`, `jaxspec.device.tree`):
        verified side by side, the deepest accepted path committed and its keys and values
        moved into place.
    """

    graphdef: Any
    k: int
    greedy_only: bool = True
    draft_source: DraftSource = "none"
    automaton: bool = False
    global_pool: bool = False
    sa_draft_len: int = 0
    max_ngram_size: int = -1
    min_match_len: int = 1
    enhancer_threshold: int | None = None
    top2: bool = False
    logits: bool = False
    implementation: str | None = None
    mesh: Any = None
    tree: bool = False

    def __post_init__(self):
        if self.k < 0:
            raise ValueError(f"k must be >= 0, got {self.k}")
        if self.automaton and self.k > self.sa_draft_len:
            raise ValueError(f"k ({self.k}) exceeds the draft buffer width ({self.sa_draft_len})")
        if self.draft_source == "sa" and not self.automaton:
            raise ValueError("draft_source 'sa' needs automaton=True")
        if self.tree and (self.draft_source != "host" or self.automaton):
            raise ValueError(f"token trees are host drafts without device automata, got "
                             f"draft_source={self.draft_source!r}, automaton={self.automaton}")
        # jit hashes its static arguments on every call; hashing a 30-layer graphdef costs
        # ~20 ms, so a canonical graphdef's hash is computed once (`canonical_graphdef`).
        graphdef = _GRAPHDEF_HASHES.get(id(self.graphdef))
        object.__setattr__(self, "_hash", hash(tuple(
            (hash(self.graphdef) if graphdef is None else graphdef) if f.name == "graphdef"
            else getattr(self, f.name) for f in dataclasses.fields(self))))

    def __hash__(self):
        return self._hash


# Executors of one model split it into equal but distinct graphdefs, and hashing or comparing
# two walks all their nodes. One object per distinct graphdef, kept for the process (it holds
# no weights), its hash computed once.
_GRAPHDEFS: dict = {}
_GRAPHDEF_HASHES: dict[int, int] = {}


def canonical_graphdef(graphdef):
    """The first graphdef equal to `graphdef` (itself if none): build step configs with it."""
    graphdef = _GRAPHDEFS.setdefault(graphdef, graphdef)
    _GRAPHDEF_HASHES.setdefault(id(graphdef), hash(graphdef))
    return graphdef


# jit's caches find a compiled step by comparing static arguments, and two equal configs made by
# two executors compare their graphdefs node by node (~2 ms for 30 layers, several times a call:
# a fresh engine's plain step at a 53-token prompt took 53 ms against 45 for a reused one). The
# same object compares by identity.
_CONFIGS: "weakref.WeakValueDictionary[StepConfig, StepConfig]" = weakref.WeakValueDictionary()


def canonical(cfg: StepConfig) -> StepConfig:
    """The live config equal to `cfg` that was made first (`cfg` itself if none): pass it to
    the jitted functions, every call."""
    return _CONFIGS.setdefault(cfg, cfg)


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


@flax.struct.dataclass
class DeviceState:
    """Everything the device keeps between steps. The executor owns the one instance; every
    jitted entry point takes it (donated) and returns it.

    Attributes:
      kv: the paged KV cache.
      sa: the automata of `num_slots + 1` slots, or None without device automata.
      drafts: the automata's next drafts per slot, or None likewise.
      active_mask: bool[num_slots + 1] slots the global search reads, or None likewise.
    """

    kv: kv_cache.KVPages
    sa: sa_layout.SAState | None = None
    drafts: DraftBuffer | None = None
    active_mask: jax.Array | None = None


def init_state(kv: kv_cache.KVPages, automata: tuple[sa_layout.SAState, jax.Array] | None = None,
               draft_len: int = 0) -> DeviceState:
    """A device state around `kv`; with `automata = (SAState, active_mask)` also a zeroed draft
    buffer of `draft_len` columns per slot."""
    if automata is None:
        return DeviceState(kv=kv)
    sa, active_mask = automata
    rows = sa.num_slots + 1
    # Distinct buffers: the state is donated, and one buffer cannot be donated twice.
    drafts = DraftBuffer(tokens=jnp.zeros((rows, draft_len), jnp.int32),
                         lens=jnp.zeros((rows,), jnp.int32),
                         match_len=jnp.zeros((rows,), jnp.int32))
    return DeviceState(kv=kv, sa=sa, drafts=drafts, active_mask=active_mask)


@flax.struct.dataclass
class StepInputs:
    """One verify step's batch.

    Attributes:
      last_tokens: i32[B] each row's last committed token (not yet in the cache); ignored by a
        chained step.
      drafts: i32[B, K] host drafts (draft source "host"); ignored otherwise (may be [B, 0]).
      draft_lens: i32[B] draft lengths to verify, decided on the host for every draft source
        (an automaton row's capped on the device at its admitted length).
      view: cache view with num_new = 1 + K for real rows and 0 for padding rows; a chained
        step's lengths are those the previous step used.
      sampling: per-row sampling parameters.
      slots: i32[B] each row's automaton slot (the dummy slot for padding rows); ignored without
        device automata.
      previous: the previous step's `(new_tokens i32[B, K+1], num_new_tokens i32[B])`, still
        on the device, the same rows in the same order: a row that committed tokens there
        continues from them (a chained step). Zeros leave every row as given, as None does;
        the executor passes zeros when it has read the previous step, so that one program runs
        both kinds of step.
      parents: with `StepConfig.tree`, i32[B, K] the input each draft continues
        (`jaxspec.device.tree`); else None.
    """

    last_tokens: jax.Array
    drafts: jax.Array
    draft_lens: jax.Array
    view: kv_cache.CacheView
    sampling: sampling.SamplingArrays
    slots: jax.Array
    previous: tuple[jax.Array, jax.Array] | None = None
    parents: jax.Array | None = None


@flax.struct.dataclass
class StepOutputs:
    """What the host reads back after a step.

    Attributes:
      new_tokens: i32[B, K+1] committed tokens (accepted drafts, then the bonus token); zero past
        num_new_tokens.
      num_new_tokens: i32[B] accepted drafts + 1.
      draft_lens: i32[B] drafts really verified this step (padding excluded).
      match_len: i32[B] automaton match length behind this step's automaton drafts (0 otherwise).
      next_draft_lens: i32[B] length of the automaton's next admitted drafts (0 behind a match
        shorter than min_match_len, and without automata), already on the device: lets the host
        size the next step's K without another sync.
      next_match_len: i32[B] match length behind the next drafts.
      top2: f32[B, K+1, 2] the target's two best logits at each position, with
        `StepConfig.top2`; else None.
      logits: f32[B, K+1, V] the target's logits at each position, with `StepConfig.logits`;
        else None.
    """

    new_tokens: jax.Array
    num_new_tokens: jax.Array
    draft_lens: jax.Array
    match_len: jax.Array
    next_draft_lens: jax.Array
    next_match_len: jax.Array
    top2: jax.Array | None = None
    logits: jax.Array | None = None


def _pinned(cfg: StepConfig, state: DeviceState, outputs):
    """`(state, *outputs)`, on a mesh with the state on its shardings (so a donated buffer keeps
    its layout from call to call) and the outputs replicated (every process can read them)."""
    if cfg.mesh is not None:
        state = jax.lax.with_sharding_constraint(
            state, sharding.state_shardings(cfg.mesh, state))
        outputs = jax.lax.with_sharding_constraint(outputs, sharding.replicated(cfg.mesh))
    return (state, *outputs) if isinstance(outputs, tuple) else (state, outputs)


def weights(params) -> dict:
    """The model's weights as the jitted functions here take them fastest: the NNX state's pure
    dict (`nnx.to_pure_dict`). jit flattens a dict in C++; an NNX state's 272 variables of
    SmolLM2 flatten in Python, 0.4-1.5 ms of every call (up to 5% of a 30 ms plain step)."""
    return nnx.to_pure_dict(params)


def _forward(graphdef, params, tokens, kv, view):
    model = nnx.merge(graphdef, params)
    hidden, kv = model(tokens, kv, view)
    return model, hidden, kv


@functools.partial(jax.jit, static_argnames=("cfg",), donate_argnames=("state",))
def prefill(params, state: DeviceState, tokens: jax.Array, view: kv_cache.CacheView,
            sampling_arrays: sampling.SamplingArrays, *, cfg: StepConfig):
    """One prompt chunk per row.

    Args:
      params: the model's weights (`weights`; its NNX state works too, slower).
      state: the device state (donated; only its KV pages change).
      tokens: i32[B, C] chunk tokens, padded past view.num_new[b].
      view: rows' page tables; lengths = tokens of the prompt already cached.
      sampling_arrays: per-row sampling parameters.
      cfg: static configuration (its graphdef and greedy_only are used).

    Returns:
      (state, next_tokens i32[B], top2 f32[B, 2] or None) — the token after each row's last
      valid chunk position, and with `cfg.top2` the two best logits behind it.
    """
    _TRACES["prefill"] += 1
    model, hidden, kv = _forward(cfg.graphdef, params, tokens, state.kv, view)
    last = jnp.maximum(view.num_new - 1, 0)
    logits = model.logits(jnp.take_along_axis(hidden, last[:, None, None], axis=1),
                          view)                                                  # [B, 1, V]
    positions = (view.lengths + view.num_new)[:, None]
    chosen = sampling.choose_tokens(logits, sampling_arrays, positions,
                                    greedy_only=cfg.greedy_only)
    top2 = sampling.top2(logits[:, 0]) if cfg.top2 else None
    return _pinned(cfg, state.replace(kv=kv), (chosen[:, 0], top2))


def _refill_drafts(cfg: StepConfig, state: DeviceState, slots, new_tokens, num_new):
    """Extends the automata with the committed tokens and stores the next drafts per slot."""
    if cfg.global_pool:
        sa, match_len, drafts, lens = ops.sa_extend_and_global_search(
            state.sa, slots, new_tokens, num_new, state.active_mask, draft_len=cfg.sa_draft_len,
            max_ngram_size=cfg.max_ngram_size, implementation=cfg.implementation,
            mesh=cfg.mesh)
    else:
        sa, match_len, drafts, lens = ops.sa_extend_and_lookup(
            state.sa, slots, new_tokens, num_new, draft_len=cfg.sa_draft_len,
            max_ngram_size=cfg.max_ngram_size, implementation=cfg.implementation, mesh=cfg.mesh)
    buf = state.drafts
    buf = DraftBuffer(tokens=buf.tokens.at[slots].set(drafts), lens=buf.lens.at[slots].set(lens),
                      match_len=buf.match_len.at[slots].set(match_len))
    return state.replace(sa=sa, drafts=buf)


def _admitted(cfg: StepConfig, buf: DraftBuffer, slots):
    """(draft lengths worth verifying, match lengths) of the automaton drafts waiting for `slots`:
    none behind a match shorter than cfg.min_match_len (source "sa") or cfg.enhancer_threshold
    (an enhancer)."""
    match_len = buf.match_len[slots]
    least = cfg.min_match_len if cfg.enhancer_threshold is None else cfg.enhancer_threshold
    return jnp.where(match_len >= least, buf.lens[slots], 0), match_len


def _drafts(cfg: StepConfig, state: DeviceState, inputs: StepInputs):
    """This step's (drafts i32[B, K], lengths to verify i32[B], automaton match lengths i32[B]).

    The host decides every row's length (`inputs.draft_lens`: it knows the automaton's from the
    last step's outputs); the tokens come from the inputs, the draft buffer, or both (enhancer).
    """
    k = cfg.k
    rows = inputs.last_tokens.shape[0]
    if cfg.draft_source == "none":
        none = jnp.zeros((rows,), jnp.int32)
        return jnp.zeros((rows, k), jnp.int32), none, none
    if not cfg.automaton:
        return inputs.drafts, inputs.draft_lens, jnp.zeros((rows,), jnp.int32)
    sa_drafts = state.drafts.tokens[inputs.slots, :k]
    match_len = state.drafts.match_len[inputs.slots]
    if cfg.draft_source == "sa":
        # Never past the automaton's admitted continuation, whatever the host asked: the host
        # of a chained step has not read the lengths yet and asks for K.
        admitted, _ = _admitted(cfg, state.drafts, inputs.slots)
        return sa_drafts, jnp.minimum(inputs.draft_lens, admitted), match_len
    # Enhancer: rows with a long enough match verify the automaton's drafts, the others the host's.
    drafts = enhancer.enhance(inputs.drafts, sa_drafts, match_len,
                              threshold=cfg.enhancer_threshold)
    return drafts, inputs.draft_lens, match_len


def _continued(inputs: StepInputs) -> StepInputs:
    """A chained step's inputs: each row that committed tokens in the previous step continues
    from its bonus token (its last committed token), with the length that step used plus the
    tokens it committed; the others keep their inputs."""
    new_tokens, num_new = inputs.previous
    bonus = jnp.take_along_axis(new_tokens, jnp.maximum(num_new - 1, 0)[:, None], axis=1)[:, 0]
    last = jnp.where(num_new > 0, bonus, inputs.last_tokens)
    view = inputs.view
    lengths = view.lengths + jnp.where(view.num_new > 0, num_new, 0)
    return inputs.replace(last_tokens=last, view=view.replace(lengths=lengths), previous=None)


@functools.partial(jax.jit, static_argnames=("cfg",), donate_argnames=("state",))
def step(params, state: DeviceState, inputs: StepInputs, *, cfg: StepConfig):
    """Forward over [B, 1+K], verify, commit, and (device automata) refill the drafts.

    Args:
      params: the model's weights (`weights`; its NNX state works too, slower).
      state: the device state (donated).
      inputs: the batch (its last tokens and lengths may continue `inputs.previous`).
      cfg: static configuration.

    Returns:
      (state, StepOutputs).
    """
    _TRACES["step"] += 1
    if inputs.previous is not None:
        inputs = _continued(inputs)
    k = cfg.k
    drafts, draft_lens, match_len = _drafts(cfg, state, inputs)
    # Padding rows (num_new == 0) verify nothing.
    draft_lens = jnp.where(inputs.view.num_new > 0, jnp.minimum(draft_lens, k), 0)
    tokens = jnp.concatenate([inputs.last_tokens[:, None], drafts], axis=1)      # [B, 1+K]
    view = inputs.view
    if cfg.tree:
        mask, depth = tree_lib.ancestors(inputs.parents)
        view = view.replace(tree=mask, depth=depth)

    model, hidden, kv = _forward(cfg.graphdef, params, tokens, state.kv, view)
    # Each target token is drawn at the position it would take in the text (its sampling key).
    logits = model.logits(hidden, view)
    target = sampling.choose_tokens(logits, inputs.sampling, view.positions(k + 1) + 1,
                                    greedy_only=cfg.greedy_only)
    if cfg.tree:
        new_tokens, num_new, path = tree_lib.accept(drafts, inputs.parents, draft_lens, target,
                                                    view.tree, view.depth)
        kv = kv_cache.move_slots(kv, view, path, jnp.where(view.num_new > 0, num_new, 0))
    else:
        new_tokens, num_new = verify.accept(drafts, draft_lens, target)
    state = state.replace(kv=kv)
    next_lens = next_match = jnp.zeros_like(num_new)
    if cfg.automaton:
        num_commit = jnp.where(inputs.view.num_new > 0, num_new, 0)
        state = _refill_drafts(cfg, state, inputs.slots, new_tokens, num_commit)
        next_lens, next_match = _admitted(cfg, state.drafts, inputs.slots)
    return _pinned(cfg, state, StepOutputs(
        new_tokens=new_tokens, num_new_tokens=num_new, draft_lens=draft_lens, match_len=match_len,
        next_draft_lens=next_lens, next_match_len=next_match,
        top2=sampling.top2(logits) if cfg.top2 else None,
        logits=logits if cfg.logits else None))


@functools.partial(jax.jit, static_argnames=("cfg",), donate_argnames=("state",))
def prime_drafts(state: DeviceState, slots: jax.Array, *, cfg: StepConfig):
    """First drafts for requests whose automaton was just copied in: a lookup that extends
    nothing.

    Args:
      state: the device state (donated).
      slots: i32[B] the new requests' slots (padding rows use the dummy slot).

    Returns:
      (state with their drafts in the draft buffer, i32[B] the drafts' admitted lengths, i32[B]
      the match lengths behind them).
    """
    _TRACES["prime_drafts"] += 1
    nothing = jnp.zeros((slots.shape[0], 1), jnp.int32)
    state = _refill_drafts(cfg, state, slots, nothing, jnp.zeros(slots.shape, jnp.int32))
    return _pinned(cfg, state, _admitted(cfg, state.drafts, slots))
