"""The Pallas kernels against their XLA references on fixed-seed random inputs: the correctness
part of the GPU check (`benchmarks.gpu_check`), compiled on a GPU or in the Pallas interpreter.

Automaton (`check_automaton`): one case is a lookup mode and a batch of B rows over B slots (plus
the dummy). Each slot starts from a built prompt of up to the largest history, text like an edited
document (random runs and copies of earlier spans, vocabularies of 4 to 49,152 tokens). Every step
gives the rows a fresh permutation of the slots (odd steps put one row on the dummy slot), commits
to each row a prefix of its last draft plus one more token (sometimes cut, sometimes nothing), and
runs both implementations on the same inputs. Halfway, a quarter of the slots get new prompts:
requests finish and others reuse their slots. Compared exactly (integers): every step's match
lengths, drafts and draft lengths; at the end every array of every slot, and a few slots against
the host builder run on the whole text they were given.

Attention (`check_attention`): the fast path's attention partials (`attention_partials`: the
cached slots and the 1 + K new tokens) of the kernel and the reference (computed at
`Precision.HIGHEST`, like the kernel's dots) over random pages and new keys, lengths from 0 to
the context with page boundaries among them; `acc / l` and `m + log l` agree within
`ATTENTION_TOLERANCE`.

A difference raises `Mismatch`, whose message names the case and the first differing value.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import sa_overhead
from jaxspec import sa_layout
from jaxspec.device import attention
from jaxspec.device import ops
from jaxspec.device import sa_state
from jaxspec.host import sa_build

DRAFT_LEN = sa_overhead.DRAFT_LEN
# Lookup modes checked: (global search?, max_ngram_size).
MODES = {"longest": (False, -1), "fixed-3": (False, 3), "global": (True, -1),
         "global-fixed-2": (True, 2)}
# The same modes under their names in `benchmarks.sa_overhead` (the timed ones).
TIMED_MODES = {"longest": "longest", "fixed-3": "fixed 3", "global": "global"}
VOCABULARIES = (4, 64, 256, 49152)   # slot i draws from VOCABULARIES[i % 4]
IMPLEMENTATIONS = ("xla", "pallas")
# f32 sums over up to 8k keys in another order: a few ulps per term, far below this.
ATTENTION_TOLERANCE = 1e-4
# SmolLM2-135M's attention: 3 KV heads, 3 query heads per KV head, head dim 64, pages of 16.
KV_HEADS, GROUP, HEAD_DIM, PAGE_SIZE = 3, 3, 64, 16


class Mismatch(AssertionError):
    """A kernel's result differs from its reference; the message names the case."""


def random_text(rng: np.random.Generator, length: int, vocab: int) -> np.ndarray:
    """i32[length] tokens like an edited document: random runs and copies of earlier spans."""
    out = np.empty(length, np.int32)
    n = 0
    while n < length:
        if n >= 8 and rng.random() < 0.5:
            start = int(rng.integers(0, n))
            span = min(int(rng.integers(4, 128)), n - start, length - n)
            out[n:n + span] = out[start:start + span]
        else:
            span = min(int(rng.integers(1, 32)), length - n)
            out[n:n + span] = rng.integers(0, vocab, span)
        n += span
    return out


def _first_difference(case: str, name: str, want: np.ndarray, got: np.ndarray, what: str):
    if not np.array_equal(want, got):
        index = np.argwhere(want != got)[0] if want.shape == got.shape else None
        where = "shapes" if index is None else f"{what} {int(index[0])}"
        raise Mismatch(f"{case}: {name} differs first at {where}: xla "
                       f"{want.shape if index is None else want[index[0]].tolist()} vs pallas "
                       f"{got.shape if index is None else got[index[0]].tolist()}")


def check_automaton(batch: int, mode: str, *, histories, capacity: int, steps: int, seed: int,
                    interpret: bool) -> dict:
    """Runs one case on both implementations, comparing everything (see the module doc).

    Args:
      batch: rows, and usable slots.
      mode: a name in `MODES`.
      histories: prompt lengths; slot i starts from about `histories[-1 - i % len]` tokens.
      capacity: tokens per slot; at least the largest history plus `steps * (DRAFT_LEN + 1)`.
      steps: steps to run.
      seed: the inputs' seed (with the batch and mode).
      interpret: the Pallas kernels in the interpreter (CPU) rather than compiled.

    Returns:
      What the case exercised: `{"case", "steps", "drafted_rows", "rows", "mean_match_len"}`.

    Raises:
      Mismatch: at the first difference, naming the case, step and row or slot.
    """
    global_search, max_ngram_size = MODES[mode]
    case = f"automaton {mode}, batch {batch}"
    if capacity < max(histories) + steps * (DRAFT_LEN + 1):
        raise ValueError(f"{case}: capacity {capacity} < {max(histories)} + {steps} steps")
    rng = np.random.default_rng([seed, batch, list(MODES).index(mode)])
    fns = {impl: sa_overhead.sa_ops(impl, interpret=interpret and impl == "pallas")
           for impl in IMPLEMENTATIONS}
    states = {impl: sa_layout.init_state(batch, capacity) for impl in IMPLEMENTATIONS}
    texts: list[list[int]] = [[] for _ in range(batch)]
    last_draft: list[list[int]] = [[] for _ in range(batch)]

    def new_prompt(slot: int):
        length = max(1, histories[-1 - slot % len(histories)] - int(rng.integers(0, 64)))
        text = random_text(rng, length, VOCABULARIES[slot % len(VOCABULARIES)])
        built = sa_build.build(text, capacity)
        for impl in IMPLEMENTATIONS:
            states[impl] = sa_state.write_slot(states[impl], jnp.int32(slot), built)
        texts[slot], last_draft[slot] = text.tolist(), []

    for slot in range(batch):
        new_prompt(slot)
    drafted = matched = 0
    for step in range(steps):
        if step == steps // 2 and step:
            for slot in rng.choice(batch, size=max(1, batch // 4), replace=False):
                new_prompt(int(slot))
        slots = rng.permutation(batch).astype(np.int32)
        if step % 2:
            slots[rng.integers(batch)] = batch          # a padding row on the dummy slot
        accepted = np.zeros((batch, DRAFT_LEN + 1), np.int32)
        num_accepted = np.zeros((batch,), np.int32)
        for row, slot in enumerate(slots):
            if slot == batch:                            # ignored: the dummy never extends
                accepted[row] = rng.integers(0, VOCABULARIES[-1], DRAFT_LEN + 1)
                num_accepted[row] = rng.integers(0, DRAFT_LEN + 2)
                continue
            draft = last_draft[slot]
            bonus = int(rng.integers(0, VOCABULARIES[slot % len(VOCABULARIES)]))
            chunk = draft[:int(rng.integers(0, len(draft) + 1))] + [bonus]
            if rng.random() < 0.1:
                chunk = chunk[:int(rng.integers(0, len(chunk) + 1))]
            accepted[row, :len(chunk)] = chunk
            num_accepted[row] = len(chunk)
            texts[slot] += chunk
        args = (jnp.asarray(slots), jnp.asarray(accepted), jnp.asarray(num_accepted))
        active = jnp.asarray(rng.random(batch + 1) < 0.75)
        outs = {}
        for impl in IMPLEMENTATIONS:
            lookup, search = fns[impl]
            if global_search:
                states[impl], *out = search(states[impl], *args, active, draft_len=DRAFT_LEN,
                                            max_ngram_size=max_ngram_size)
            else:
                states[impl], *out = lookup(states[impl], *args, draft_len=DRAFT_LEN,
                                            max_ngram_size=max_ngram_size)
            outs[impl] = [np.asarray(x) for x in out]
        for name, want, got in zip(("match_len", "draft_tokens", "draft_lens"), outs["xla"],
                                   outs["pallas"], strict=True):
            _first_difference(f"{case}, step {step}", name, want, got, "row")
        match_len, tokens, lens = outs["xla"]
        for row, slot in enumerate(slots):
            if slot < batch:
                last_draft[slot] = tokens[row, :lens[row]].tolist()
                drafted += int(lens[row] > 0)
                matched += int(match_len[row])
    _compare_states(case, states, texts, capacity)
    rows = steps * batch
    return dict(case=case, steps=steps, rows=rows, drafted_rows=drafted,
                mean_match_len=matched / rows)


def _compare_states(case: str, states: dict, texts: list[list[int]], capacity: int):
    """Every slot's arrays equal between the implementations; a few equal to the host build."""
    for name in sa_layout.SAState.__dataclass_fields__:
        want, got = getattr(states["xla"], name), getattr(states["pallas"], name)
        if not bool(jnp.array_equal(want, got)):
            differs = jnp.any((want != got).reshape(want.shape[0], -1), axis=1)
            slot = int(np.flatnonzero(np.asarray(differs))[0])
            raise Mismatch(f"{case}, after the last step: SAState.{name} differs in slot {slot}")
    batch = len(texts)
    for slot in sorted({0, batch // 2, batch - 1}):
        host = sa_build.build(np.asarray(texts[slot], np.int32), capacity)
        for name in sa_layout.SAState.__dataclass_fields__:
            device = np.asarray(getattr(states["xla"], name)[slot])
            if not np.array_equal(device, getattr(host, name)):
                raise Mismatch(f"{case}, after the last step: slot {slot}'s {name} differs from "
                               "the host build of its text (both implementations agree)")


def attention_fn(implementation: str, *, interpret: bool, layer: int, queries: int):
    """Attention partials `(q, k_new, v_new, k_pages, v_pages, page_table, lengths) -> (acc, m,
    l)` of one implementation, jitted; the kernel in the interpreter with `interpret`."""
    if implementation == "pallas" and interpret:
        from jaxspec.pallas_kernels import paged_attention

        return functools.partial(paged_attention.attention_partials, layer=layer,
                                 pages_per_block=ops.KERNEL_PAGES_PER_BLOCK, interpret=True)
    return jax.jit(functools.partial(
        ops.attention_partials, layer=layer, implementation=implementation,
        pages_per_block=attention.pages_per_block(KV_HEADS, queries)))


def attention_inputs(batch: int, k: int, context: int, dtype, *, seed: int, num_layers: int = 2):
    """`(q, k_new, v_new, k_pages, v_pages, page_table, lengths)` of SmolLM2's attention shapes:
    `batch` rows verifying K drafts (1 + K new tokens, Q = 3 * (1 + K) queries per KV head) over
    up to `context` cached tokens, each row on its own pages (page 0 is the null page)."""
    rng = np.random.default_rng([seed, batch, k, context])
    width = -(-context // PAGE_SIZE)
    lengths = rng.integers(0, context + 1, batch)
    specials = [context, 0, PAGE_SIZE, PAGE_SIZE * 8 + 1, context - 1]   # edges and boundaries
    lengths[:min(batch, len(specials))] = np.clip(specials[:batch], 0, context)
    table = (1 + rng.permutation(batch * width)).reshape(batch, width).astype(np.int32)
    key_k, key_v, key_q, key_new = jax.random.split(jax.random.key(seed), 4)
    shape = (num_layers, 1 + batch * width, PAGE_SIZE, KV_HEADS, HEAD_DIM)
    queries = GROUP * (1 + k)
    k_new, v_new = jax.random.normal(key_new, (2, batch, KV_HEADS, 1 + k, HEAD_DIM), jnp.float32)
    return (jax.random.normal(key_q, (batch, KV_HEADS, queries, HEAD_DIM), jnp.float32)
            * HEAD_DIM ** -0.5, k_new, v_new,
            jax.random.normal(key_k, shape, jnp.float32).astype(dtype),
            jax.random.normal(key_v, shape, jnp.float32).astype(dtype),
            jnp.asarray(table), jnp.asarray(lengths, jnp.int32))


def check_attention(batch: int, k: int, context: int, dtype: str, *, seed: int,
                    interpret: bool) -> dict:
    """The kernel's attention against the reference's on one shape (see the module doc).

    Returns:
      `{"case", "max_abs_error", "tolerance"}`: the largest difference of `acc / l` and of
      `m + log l` over every query.

    Raises:
      Mismatch: a difference above `ATTENTION_TOLERANCE`, or a query with nothing visible in
        either (each sees at least its own new key).
    """
    case = f"attention batch {batch}, K={k}, context {context}, {dtype} pages"
    layer = 1
    queries = GROUP * (1 + k)
    args = attention_inputs(batch, k, context, jnp.dtype(dtype), seed=seed)
    with jax.default_matmul_precision("highest"):
        want = attention_fn("xla", interpret=False, layer=layer, queries=queries)(*args)
    got = attention_fn("pallas", interpret=interpret, layer=layer, queries=queries)(*args)
    (acc_w, m_w, l_w), (acc_g, m_g, l_g) = ([np.asarray(x, np.float64) for x in out]
                                            for out in (want, got))
    if not (l_w > 0).all() or not (l_g > 0).all():
        raise Mismatch(f"{case}: a query without a visible key (every query sees its own)")
    out_w, out_g = acc_w / l_w[..., None], acc_g / l_g[..., None]
    lse_w, lse_g = m_w + np.log(l_w), m_g + np.log(l_g)
    error = max(np.abs(out_w - out_g).max(initial=0.0), np.abs(lse_w - lse_g).max(initial=0.0))
    if not error <= ATTENTION_TOLERANCE:
        raise Mismatch(f"{case}: largest difference {error:.3g} > {ATTENTION_TOLERANCE} "
                       "(attention output or log-sum-exp)")
    return dict(case=case, max_abs_error=float(error), tolerance=ATTENTION_TOLERANCE)
