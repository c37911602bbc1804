"""Token trees: ancestors and acceptance against brute-force oracles, and a tree step on the tiny
model against uncached forwards of every node's path (tree mask, depth positions), with the
accepted path's keys and values moved into place across page boundaries (the next step's logits
against an uncached forward)."""

from flax import nnx
import hypothesis
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.device import kv_cache
from jaxspec.device import sampling
from jaxspec.device import step as step_lib
from jaxspec.device import tree
from jaxspec.device import verify

PAGE = 4
COLS = 8
TOLERANCE = 2e-4
# Jitted once per tree size: op by op, the property tests below spent 5 minutes dispatching.
_ancestors = jax.jit(tree.ancestors)
_accept = jax.jit(tree.accept)
_accept_linear = jax.jit(verify.accept)


def _path(parents, node):
    """Inputs from the root to `node` (parents: of inputs 1..K)."""
    path = [node]
    while path[-1]:
        path.append(parents[path[-1] - 1])
    return path[::-1]


@st.composite
def trees(draw, max_nodes=12, vocab=3):
    """(parents, drafts, draft_len, target) of one row: parents before children, tokens from a
    small vocabulary so that paths match often."""
    k = draw(st.integers(1, max_nodes))
    parents = [draw(st.integers(0, j)) for j in range(k)]
    drafts = draw(st.lists(st.integers(0, vocab - 1), min_size=k, max_size=k))
    target = draw(st.lists(st.integers(0, vocab - 1), min_size=k + 1, max_size=k + 1))
    return parents, drafts, draw(st.integers(0, k)), target


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(case=trees())
def test_ancestors_and_acceptance_match_brute_force(case):
    parents, drafts, draft_len, target = case
    k = len(parents)
    mask, depth = _ancestors(jnp.asarray([parents], jnp.int32))
    paths = [_path(parents, i) for i in range(k + 1)]
    want = np.zeros((k + 1, k + 1), bool)
    for i, path in enumerate(paths):
        want[i, path] = True
    np.testing.assert_array_equal(mask[0], want)
    np.testing.assert_array_equal(depth[0], [len(p) - 1 for p in paths])

    new_tokens, num_new, path = _accept(
        jnp.asarray([drafts], jnp.int32), jnp.asarray([parents], jnp.int32),
        jnp.asarray([draft_len], jnp.int32), jnp.asarray([target], jnp.int32), mask, depth)
    # Oracle: every node whose path is real and follows the target; the deepest, earliest wins.
    accepted = [i for i, p in enumerate(paths)
                if all(j <= draft_len and drafts[j - 1] == target[parents[j - 1]]
                       for j in p[1:])]
    best = max(accepted, key=lambda i: (len(paths[i]), -i))
    a = len(paths[best]) - 1
    assert int(num_new[0]) == a + 1
    np.testing.assert_array_equal(path[0], paths[best] + [0] * (k - a))
    np.testing.assert_array_equal(new_tokens[0],
                                  [target[j] for j in paths[best]] + [0] * (k - a))


@hypothesis.settings(max_examples=100, deadline=None)
@hypothesis.given(k=st.integers(1, 10), data=st.data())
def test_a_chain_is_a_linear_draft(k, data):
    drafts = data.draw(st.lists(st.integers(0, 2), min_size=k, max_size=k))
    target = data.draw(st.lists(st.integers(0, 2), min_size=k + 1, max_size=k + 1))
    draft_len = data.draw(st.integers(0, k))
    parents = jnp.arange(k, dtype=jnp.int32)[None]
    mask, depth = _ancestors(parents)
    np.testing.assert_array_equal(mask[0], np.tril(np.ones((k + 1, k + 1), bool)))
    args = jnp.asarray([drafts]), jnp.asarray([draft_len]), jnp.asarray([target])
    new_tokens, num_new, path = _accept(args[0], parents, *args[1:], mask, depth)
    want_tokens, want_num = _accept_linear(*args)
    np.testing.assert_array_equal(new_tokens, want_tokens)
    np.testing.assert_array_equal(num_new, want_num)
    np.testing.assert_array_equal(path[0, :int(num_new[0])], np.arange(int(num_new[0])))


def test_parents_out_of_range_are_read_as_the_root():
    mask, depth = tree.ancestors(jnp.asarray([[0, 5, -1, 2]], jnp.int32))
    np.testing.assert_array_equal(depth[0], [0, 1, 1, 1, 2])


# ------------------------------------------------------------------ a tree step on the tiny model

PROMPTS = ([5, 9, 2, 7, 7, 1, 3], [4, 4, 8, 1])


def _view(lengths, num_new, numerics):
    table = np.arange(1, 2 * COLS + 1, dtype=np.int32).reshape(2, COLS)
    return kv_cache.CacheView(page_table=table, lengths=np.asarray(lengths, np.int32),
                              num_new=np.asarray(num_new, np.int32), numerics=numerics)


def _greedy(rows):
    return sampling.SamplingArrays(temperature=np.zeros(rows, np.float32),
                                   top_k=np.zeros(rows, np.int32),
                                   top_p=np.ones(rows, np.float32), seed=np.zeros(rows, np.int32))


def _wrong(token, model):
    return (token + 1) % model.vocab_size


@pytest.mark.parametrize("numerics", ["fast", "exact"])
def test_tree_step_verifies_every_path_and_moves_the_accepted_one(tiny_lm, uncached_greedy,
                                                                  forward, numerics):
    truth = [uncached_greedy(tiny_lm, p, 10) for p in PROMPTS]
    spec = tiny_lm.cache_spec
    kv = kv_cache.init_pages(num_layers=spec.num_layers, num_pages=2 * COLS + 1, page_size=PAGE,
                             num_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim)
    graphdef, params = nnx.split(tiny_lm)
    plain = step_lib.StepConfig(graphdef=graphdef, k=0, logits=True)
    tokens = np.zeros((2, 8), np.int32)
    for b, p in enumerate(PROMPTS):
        tokens[b, :len(p)] = p
    state, first, _ = step_lib.prefill(
        params, step_lib.init_state(kv), tokens,
        _view([0, 0], [len(p) for p in PROMPTS], numerics), _greedy(2), cfg=plain)
    np.testing.assert_array_equal(first, [t[0] for t in truth])

    # Row 0: the true continuation is the second branch, behind a wrong first one and with a
    # wrong sibling further down. Row 1: a chain whose third draft is wrong.
    t0, t1 = truth
    w = lambda x: _wrong(x, tiny_lm)    # noqa: E731
    drafts = [[w(t0[1]), t0[1], t0[2], t0[2], w(t0[3]), t0[3], t0[4]],
              [t1[1], t1[2], w(t1[3]), t1[4], 0, 0, 0]]
    parents = [[0, 0, 2, 1, 3, 3, 6], [0, 1, 2, 3, 0, 0, 0]]
    cfg = step_lib.StepConfig(graphdef=graphdef, k=7, draft_source="host", tree=True,
                              logits=True)
    lengths = [len(p) for p in PROMPTS]
    state, out = step_lib.step(params, state, step_lib.StepInputs(
        last_tokens=np.asarray(first, np.int32), drafts=np.asarray(drafts, np.int32),
        draft_lens=np.asarray([7, 4], np.int32), view=_view(lengths, [8, 8], numerics),
        sampling=_greedy(2), slots=np.zeros(2, np.int32),
        parents=np.asarray(parents, np.int32)), cfg=cfg)
    np.testing.assert_array_equal(out.num_new_tokens, [5, 3])
    np.testing.assert_array_equal(out.new_tokens[0, :5], t0[1:6])
    np.testing.assert_array_equal(out.new_tokens[1, :3], t1[1:4])
    # Every node's logits are those of its path's sequence, whatever its slot.
    for b in range(2):
        for node in range(8):
            path = [drafts[b][j - 1] for j in _path(parents[b], node)[1:]]
            sequence = PROMPTS[b] + [int(first[b])] + path
            np.testing.assert_allclose(out.logits[b, node], forward(tiny_lm, [sequence])[0, -1],
                                       rtol=TOLERANCE, atol=TOLERANCE, err_msg=f"{b=} {node=}")

    # The next step reads the accepted path's keys and values where plain decoding puts them.
    lengths = [n + int(c) for n, c in zip(lengths, out.num_new_tokens, strict=True)]
    nxt = [t0[5], t1[3]]
    linear = step_lib.StepConfig(graphdef=graphdef, k=2, draft_source="host", logits=True)
    state, out = step_lib.step(params, state, step_lib.StepInputs(
        last_tokens=np.asarray(nxt, np.int32),
        drafts=np.asarray([t0[6:8], t1[4:6]], np.int32), draft_lens=np.asarray([2, 2], np.int32),
        view=_view(lengths, [3, 3], numerics), sampling=_greedy(2),
        slots=np.zeros(2, np.int32)), cfg=linear)
    np.testing.assert_array_equal(out.num_new_tokens, [3, 3])
    for b, t in enumerate(truth):
        start = 6 if b == 0 else 4
        for j in range(3):
            sequence = PROMPTS[b] + t[:start + j]
            np.testing.assert_allclose(out.logits[b, j], forward(tiny_lm, [sequence])[0, -1],
                                       rtol=TOLERANCE, atol=TOLERANCE, err_msg=f"{b=} {j=}")


WIDTH = 32             # uncached forwards pad every sequence to this: one compilation


def _uncached_logits(model, forward, sequence):
    """The logits after `sequence` from one forward over an empty cache (padded: later
    positions cannot change earlier ones)."""
    padded = np.zeros((1, WIDTH), np.int32)
    padded[0, :len(sequence)] = sequence
    return forward(model, padded)[0, len(sequence) - 1]


@pytest.mark.parametrize("numerics", ["fast", "exact"])
@hypothesis.settings(max_examples=8, deadline=None, derandomize=True)
@hypothesis.given(data=st.data())
def test_random_trees_against_uncached_forwards(tiny_lm, uncached_greedy, forward, numerics,
                                                data):
    """Random trees of 7 nodes after prompts of 3-12 tokens (pages of 4: the trees and their
    moves cross page boundaries at every offset), one random path holding the true greedy
    continuation: every node's logits are its path's, the accepted tokens are the truth, and
    the next step's logits show the path's keys and values where plain decoding puts them."""
    k = 7
    prompt = data.draw(st.lists(st.integers(0, tiny_lm.vocab_size - 1), min_size=3,
                                max_size=12))
    parents = [data.draw(st.integers(0, j)) for j in range(k)]
    chosen = data.draw(st.integers(1, k))
    truth = uncached_greedy(tiny_lm, prompt, 12)
    chain = _path(parents, chosen)
    drafts = [data.draw(st.integers(0, tiny_lm.vocab_size - 1)) for _ in range(k)]
    for depth, node in enumerate(chain[1:], start=1):
        drafts[node - 1] = truth[depth]

    spec = tiny_lm.cache_spec
    kv = kv_cache.init_pages(num_layers=spec.num_layers, num_pages=2 * COLS + 1, page_size=PAGE,
                             num_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim)
    graphdef, params = nnx.split(tiny_lm)
    tokens = np.zeros((2, 16), np.int32)
    tokens[0, :len(prompt)] = prompt
    state, first, _ = step_lib.prefill(
        params, step_lib.init_state(kv), tokens, _view([0, 0], [len(prompt), 0], numerics),
        _greedy(2), cfg=step_lib.StepConfig(graphdef=graphdef, k=0))
    cfg = step_lib.StepConfig(graphdef=graphdef, k=k, draft_source="host", tree=True,
                              logits=True)
    state, out = step_lib.step(params, state, step_lib.StepInputs(
        last_tokens=np.asarray([first[0], 0], np.int32),
        drafts=np.asarray([drafts, [0] * k], np.int32), draft_lens=np.asarray([k, 0], np.int32),
        view=_view([len(prompt), 0], [k + 1, 0], numerics), sampling=_greedy(2),
        slots=np.zeros(2, np.int32), parents=np.asarray([parents, list(range(k))], np.int32)),
        cfg=cfg)
    n = int(out.num_new_tokens[0])
    assert n >= len(chain)
    np.testing.assert_array_equal(out.new_tokens[0, :n], truth[1:n + 1])
    for node in range(k + 1):
        sequence = prompt + truth[:1] + [drafts[j - 1] for j in _path(parents, node)[1:]]
        np.testing.assert_allclose(out.logits[0, node],
                                   _uncached_logits(tiny_lm, forward, sequence),
                                   rtol=TOLERANCE, atol=TOLERANCE, err_msg=f"{node=}")
    cached = len(prompt) + n
    state, out = step_lib.step(params, state, step_lib.StepInputs(
        last_tokens=np.asarray([truth[n], 0], np.int32), drafts=np.zeros((2, 0), np.int32),
        draft_lens=np.zeros(2, np.int32), view=_view([cached, 0], [1, 0], numerics),
        sampling=_greedy(2), slots=np.zeros(2, np.int32)),
        cfg=step_lib.StepConfig(graphdef=graphdef, k=0, logits=True))
    np.testing.assert_allclose(out.logits[0, 0],
                               _uncached_logits(tiny_lm, forward, prompt + truth[:n + 1]),
                               rtol=TOLERANCE, atol=TOLERANCE)


def test_a_tree_needs_host_drafts(tiny_lm):
    with pytest.raises(ValueError, match="token trees are host drafts"):
        step_lib.StepConfig(graphdef=nnx.graphdef(tiny_lm), k=2, draft_source="sa",
                            automaton=True, sa_draft_len=2, tree=True)
