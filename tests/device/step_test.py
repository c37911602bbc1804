"""The jitted step on the tiny model: the target's tokens, accepted drafts plus the bonus, padding
rows, draft sources (host, automaton, enhancer), the device state passed through, one trace per
configuration, and StepConfig validation."""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec import sa_layout
from jaxspec.device import kv_cache
from jaxspec.device import sa_state
from jaxspec.device import sampling
from jaxspec.device import step as step_lib
from jaxspec.host import sa_build
from jaxspec.host import sa_reference

PAGE = 8
GREEDY = sampling.SamplingArrays(temperature=np.zeros(2, np.float32),
                                 top_k=np.zeros(2, np.int32), top_p=np.ones(2, np.float32),
                                 seed=np.zeros(2, np.int32))


def _state(model, *, automata=False, draft_len=0):
    spec = model.cache_spec
    kv = kv_cache.init_pages(num_layers=spec.num_layers, num_pages=9, page_size=PAGE,
                             num_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim)
    extra = (sa_layout.init_state(2, 64), jnp.zeros(3, jnp.bool_)) if automata else None
    return step_lib.init_state(kv, extra, draft_len=draft_len)


def _view(lengths, num_new):
    table = np.asarray([[1, 2, 3, 4], [5, 6, 7, 8]], np.int32)
    return kv_cache.CacheView(page_table=table, lengths=np.asarray(lengths, np.int32),
                              num_new=np.asarray(num_new, np.int32))


def _prefilled(model, prompt, cfg, **state_kwargs):
    """A state with `prompt` cached in row 0 (row 1 empty), and the first generated token."""
    graphdef, params = nnx.split(model)
    tokens = np.zeros((2, 16), np.int32)
    tokens[0, :len(prompt)] = prompt
    state, first, _ = step_lib.prefill(params, _state(model, **state_kwargs), tokens,
                                    _view([0, 0], [len(prompt), 0]), GREEDY, cfg=cfg)
    return params, state, int(first[0])


def _inputs(last, k, drafts=None, draft_lens=None, cached=7):
    """Row 0 decodes after `cached` tokens with `drafts`; row 1 is padding."""
    drafts = np.zeros((2, k), np.int32) if drafts is None else np.asarray(drafts, np.int32)
    lens = np.zeros(2, np.int32) if draft_lens is None else np.asarray(draft_lens, np.int32)
    return step_lib.StepInputs(last_tokens=np.asarray([last, 0], np.int32), drafts=drafts,
                               draft_lens=lens, view=_view([cached, 0], [1 + k, 0]),
                               sampling=GREEDY, slots=np.asarray([0, 2], np.int32))


PROMPT = [5, 9, 2, 7, 7, 1, 3]


def test_host_drafts_accept_the_matching_prefix_and_add_the_bonus(tiny_lm, uncached_greedy):
    truth = uncached_greedy(tiny_lm, PROMPT, 6)
    cfg = step_lib.StepConfig(graphdef=nnx.graphdef(tiny_lm), k=3, draft_source="host")
    params, state, first = _prefilled(tiny_lm, PROMPT, cfg)
    assert first == truth[0]
    wrong = (truth[3] + 1) % tiny_lm.vocab_size
    drafts = [[truth[1], truth[2], wrong], [0, 0, 0]]
    state, out = step_lib.step(params, state, _inputs(first, 3, drafts, [3, 0]), cfg=cfg)
    np.testing.assert_array_equal(out.num_new_tokens, [3, 1])
    np.testing.assert_array_equal(out.new_tokens[0], [truth[1], truth[2], truth[3], 0])
    np.testing.assert_array_equal(out.draft_lens, [3, 0])        # padding row verifies nothing
    assert state.sa is None and state.drafts is None


def test_weights_flatten_without_nnx_and_step_alike(tiny_lm):
    """The executor passes `weights`: a pytree of plain dicts (flattened in C++, where an NNX
    state's variables flatten in Python on every call) that steps exactly as the NNX state."""
    cfg = step_lib.StepConfig(graphdef=nnx.graphdef(tiny_lm), k=2, draft_source="host", top2=True)
    params, state, first = _prefilled(tiny_lm, PROMPT, cfg)
    weights = step_lib.weights(params)
    leaves, treedef = jax.tree.flatten(weights)
    assert len(leaves) == len(jax.tree.leaves(params))
    assert all(isinstance(x, jax.Array) for x in leaves)
    assert "Variable" not in str(treedef) and "State" not in str(treedef)
    inputs = _inputs(first, 2, [[3, 4], [0, 0]], [2, 0])
    state, by_state = step_lib.step(params, state, inputs, cfg=cfg)
    _, by_weights = step_lib.step(weights, state, inputs, cfg=cfg)
    np.testing.assert_array_equal(by_weights.top2, by_state.top2)
    np.testing.assert_array_equal(by_weights.new_tokens, by_state.new_tokens)


def test_a_short_host_draft_is_not_padded_into_acceptance(tiny_lm, uncached_greedy):
    truth = uncached_greedy(tiny_lm, PROMPT, 6)
    cfg = step_lib.StepConfig(graphdef=nnx.graphdef(tiny_lm), k=3, draft_source="host")
    params, state, first = _prefilled(tiny_lm, PROMPT, cfg)
    # Padding slots hold the true tokens, but only the first draft is real.
    drafts = [[truth[1], truth[2], truth[3]], [0, 0, 0]]
    _, out = step_lib.step(params, state, _inputs(first, 3, drafts, [1, 0]), cfg=cfg)
    np.testing.assert_array_equal(out.num_new_tokens, [2, 1])
    np.testing.assert_array_equal(out.draft_lens, [1, 0])


def test_automaton_drafts_and_next_drafts(tiny_lm):
    """The automaton (primed on prompt + first token) drafts what the reference automaton drafts;
    after the step it holds exactly the committed tokens, and the draft buffer the next drafts,
    reported without another sync."""
    prompt = [5, 9, 2, 5, 9, 2, 5]
    cfg = step_lib.StepConfig(graphdef=nnx.graphdef(tiny_lm), k=2, draft_source="sa",
                              automaton=True, sa_draft_len=2)
    params, state, first = _prefilled(tiny_lm, prompt, cfg, automata=True, draft_len=2)
    text = prompt + [first]
    state = state.replace(sa=sa_state.write_slot(state.sa, jnp.int32(0),
                                                 sa_build.build(text, 64)))
    state, lens, matches = step_lib.prime_drafts(state, np.asarray([0, 2], np.int32), cfg=cfg)
    match, draft = sa_reference.SuffixAutomaton(text).draft(2)
    np.testing.assert_array_equal(state.drafts.tokens[0, :len(draft)], draft)
    np.testing.assert_array_equal(lens, [len(draft), 0])
    np.testing.assert_array_equal(matches, [match, 0])

    # The host asks for more than the automaton holds: it verifies what it holds.
    inputs = _inputs(first, 2, draft_lens=[2, 0], cached=len(prompt))
    state, out = step_lib.step(params, state, inputs, cfg=cfg)
    assert (int(out.match_len[0]), int(out.draft_lens[0])) == (match, len(draft))
    n = int(out.num_new_tokens[0])
    committed = [int(t) for t in out.new_tokens[0, :n]]
    assert committed[:n - 1] == draft[:n - 1]            # accepted drafts are the drafted ones
    text += committed
    assert int(state.sa.text_len[0]) == len(text)
    np.testing.assert_array_equal(state.sa.text[0, :len(text)], text)
    next_match, next_draft = sa_reference.SuffixAutomaton(text).draft(2)
    assert (int(out.next_match_len[0]), int(out.next_draft_lens[0])) == (next_match,
                                                                         len(next_draft))


def test_enhancer_picks_automaton_rows_by_match_length():
    buf = step_lib.DraftBuffer(tokens=jnp.asarray([[7, 8], [5, 6], [0, 0]], jnp.int32),
                               lens=jnp.asarray([2, 1, 0], jnp.int32),
                               match_len=jnp.asarray([4, 2, 0], jnp.int32))
    state = step_lib.DeviceState(kv=None, sa=None, drafts=buf)
    inputs = step_lib.StepInputs(
        last_tokens=jnp.zeros(2, jnp.int32), drafts=jnp.asarray([[1, 2], [3, 4]], jnp.int32),
        draft_lens=jnp.asarray([2, 2], jnp.int32), view=None, sampling=None,
        slots=jnp.asarray([0, 1], jnp.int32))
    cfg = step_lib.StepConfig(graphdef=None, k=2, draft_source="host", automaton=True,
                              sa_draft_len=2, enhancer_threshold=3)
    drafts, lens, match = step_lib._drafts(cfg, state, inputs)
    np.testing.assert_array_equal(drafts, [[7, 8], [3, 4]])      # row 0 matched 4 >= 3
    np.testing.assert_array_equal(lens, [2, 2])
    np.testing.assert_array_equal(match, [4, 2])


def test_one_trace_per_configuration(tiny_lm):
    cfg = step_lib.StepConfig(graphdef=nnx.graphdef(tiny_lm), k=1, draft_source="host")
    params, state, first = _prefilled(tiny_lm, PROMPT, cfg)
    before = step_lib.trace_count("step")
    for cached in (7, 9, 11):                    # new lengths, same shapes: no new trace
        state, _ = step_lib.step(params, state, _inputs(first, 1, cached=cached), cfg=cfg)
    assert step_lib.trace_count("step") - before <= 1


@pytest.mark.parametrize("kwargs, match", [
    (dict(k=-1), "k must be >= 0"),
    (dict(k=3, draft_source="sa", automaton=True, sa_draft_len=2), "exceeds the draft buffer"),
    (dict(k=1, draft_source="sa", sa_draft_len=2), "needs automaton=True"),
])
def test_step_config_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        step_lib.StepConfig(graphdef=None, **kwargs)


def test_step_config_hash_is_stable_and_by_value():
    a = step_lib.StepConfig(graphdef=None, k=2, draft_source="host")
    b = step_lib.StepConfig(graphdef=None, k=2, draft_source="host")
    assert a == b and hash(a) == hash(b)
    assert a != step_lib.StepConfig(graphdef=None, k=3, draft_source="host")
