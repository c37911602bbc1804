"""The executor's own contract, on the tiny model: K decided once and pages reserved for it, one
count of accepted drafts when a stop token or the length limit cuts a verify window, finished
requests leaving at once, the run's metrics reset on demand, and step configs shared between
executors."""

import dataclasses

from flax import nnx
import jax
import pytest

import jaxspec as js
from jaxspec.device import sa_state
from jaxspec.device import step as step_lib
from jaxspec.host import cost_model as cost_model_lib
from jaxspec.host import executor as executor_lib
from jaxspec.host import requests as requests_lib
from jaxspec.host import scheduler as scheduler_lib
from tests.helpers import random_prompts

CONFIG = scheduler_lib.SchedulerConfig(max_batch_size=4, max_seq_len=64, page_size=4,
                                       max_num_tokens=128, prefill_chunk=32)
K = 4


class OracleDrafter(js.Drafter):
    """Drafts each request's true greedy continuation: every draft is accepted."""

    def __init__(self, truth, **kwargs):
        super().__init__(**kwargs)
        self.truth = truth                      # request id -> prompt + greedy continuation

    def prepare_draft_tokens(self, requests):
        return [self.truth[r.request_id][len(r.tokens):len(r.tokens) + self.draft_len]
                for r in requests]


def _oracle_run(model, uncached_greedy, *, max_new_tokens, stop=None):
    prompt = random_prompts(0, [7])[0]
    truth = prompt + uncached_greedy(model, prompt, 40)
    drafter = OracleDrafter({0: truth}, max_draft_len=K)
    executor = executor_lib.Executor(model, scheduler_config=CONFIG, spec=drafter)
    stops = frozenset() if stop is None else frozenset([stop])
    rid = executor.add_request(prompt, requests_lib.SamplingParams(max_new_tokens=max_new_tokens),
                               stops)
    assert rid == 0
    pairs = []
    feed = executor._feed_gate
    executor._feed_gate = lambda p: (pairs.extend(p), feed(p))
    result = executor.run()[0]
    return truth[len(prompt):], result, executor.stats, pairs


def _assert_one_count(result, stats, pairs):
    """Per request, per run and for the gate: the same accepted drafts."""
    assert result.accepted == stats.accepted == sum(a for a, _ in pairs)
    assert result.drafted == stats.drafted == sum(d for _, d in pairs)
    assert sum(result.acceptance_lengths) == stats.committed == len(result.output) - 1


def test_a_stop_token_inside_a_window(tiny_lm, uncached_greedy):
    # The first token is committed by prefill; verify windows then commit K + 1 tokens each. Stop
    # on the 3rd token of the first window: its 3 accepted drafts are kept, the rest is cut.
    free, *_ = _oracle_run(tiny_lm, uncached_greedy, max_new_tokens=40)
    stop = free[3]
    assert stop not in free[:3], "pick a prompt whose continuation does not repeat early"
    want, result, stats, pairs = _oracle_run(tiny_lm, uncached_greedy, max_new_tokens=40,
                                             stop=stop)
    assert result.output == want[:4] and result.finish_reason == "stop"
    assert result.acceptance_lengths == [3]
    assert (result.accepted, result.drafted) == (3, K)
    _assert_one_count(result, stats, pairs)


def test_the_length_limit_inside_a_window(tiny_lm, uncached_greedy):
    # 1 (prefill) + 5 (one full window) + 2 (cut) = 8 tokens.
    want, result, stats, pairs = _oracle_run(tiny_lm, uncached_greedy, max_new_tokens=8)
    assert result.output == want[:8] and result.finish_reason == "length"
    assert result.acceptance_lengths == [K + 1, 2]
    assert result.accepted == K + 2
    _assert_one_count(result, stats, pairs)


def test_k_is_decided_once_and_pages_follow_it(tiny_lm):
    """Distinct prompt tokens give the automaton nothing to match: the step runs with K = 0 and
    allocates pages for 1 token, not for the placeholder's 1 + K."""
    executor = executor_lib.Executor(tiny_lm, scheduler_config=CONFIG,
                                     spec=js.SAConfig(max_draft_len=K))
    prompt = list(range(10, 17))                       # 7 tokens: pages of 4 hold 0..7
    executor.add_request(prompt, requests_lib.SamplingParams(max_new_tokens=30), frozenset())
    executor.step()                                    # prefill
    request = executor.scheduler.running[0]
    assert len(request.pages.pages) == 2
    executor.step()                                    # decode: 7 cached + 1 new = 8 slots
    assert executor.stats.k_history == [0]
    assert len(request.pages.pages) == 2               # 1 + K would have needed 3 pages


def test_finished_requests_leave_the_executor(tiny_lm):
    executor = executor_lib.Executor(tiny_lm, scheduler_config=CONFIG, spec=None)
    params = requests_lib.SamplingParams(max_new_tokens=3)
    ids = [executor.add_request(p, params, frozenset()) for p in random_prompts(1, [5, 9])]
    done = executor.run()
    assert sorted(done) == ids and all(len(r.output) == 3 for r in done.values())
    assert executor.run() == {}
    for rid in ids:
        with pytest.raises(ValueError, match="no live request"):
            executor.cancel(rid)
    allocator = executor.scheduler.allocator
    assert allocator.num_free == allocator.num_pages - 1


def test_cancel_returns_the_request_and_frees_it(tiny_lm):
    executor = executor_lib.Executor(tiny_lm, scheduler_config=CONFIG,
                                     spec=js.SAConfig(max_draft_len=K))
    rid = executor.add_request(random_prompts(2, [6])[0],
                               requests_lib.SamplingParams(max_new_tokens=20), frozenset())
    executor.step()
    executor.step()
    cancelled = executor.cancel(rid)
    assert cancelled.finish_reason == "cancelled" and cancelled.finished
    assert not executor.has_work()


def test_reset_stats(tiny_lm):
    executor = executor_lib.Executor(tiny_lm, scheduler_config=CONFIG, spec=None)
    executor.add_request([1, 2, 3], requests_lib.SamplingParams(max_new_tokens=4), frozenset())
    executor.run()
    assert executor.stats.generated_tokens == 4
    executor.reset_stats()
    assert executor.stats.generated_tokens == 0 and executor.stats.decode_steps == 0


def test_step_costs_are_saved_when_the_executor_goes_idle(tiny_lm, tmp_path):
    path = tmp_path / "costs.json"
    executor = executor_lib.Executor(tiny_lm, scheduler_config=CONFIG,
                                     spec=js.SAConfig(max_draft_len=K, adaptive=True),
                                     cost_model=cost_model_lib.StepCostModel(path))
    executor.add_request([1, 2, 3, 1, 2, 3], requests_lib.SamplingParams(max_new_tokens=12),
                         frozenset())
    executor.step()
    assert not path.exists()                        # fewer samples than a periodic save needs
    executor.run()
    assert cost_model_lib.StepCostModel(path).table() == executor.costs.table() != []


def test_an_enhancer_needs_a_host_drafter(tiny_lm):
    with pytest.raises(TypeError, match="enhances a host drafter"):
        executor_lib.Executor(tiny_lm, scheduler_config=CONFIG, spec=js.SAConfig(max_draft_len=2),
                              enhancer=js.SAEnhancerConfig())


def test_step_costs_are_kept_apart_per_dtype(tiny_lm):
    from jaxspec.models import precision

    half = precision.cast(tiny_lm, "bfloat16")
    keys = {cost_model_lib.model_key(tiny_lm), cost_model_lib.model_key(half),
            cost_model_lib.model_key(tiny_lm, "bfloat16")}
    assert len(keys) == 3
    assert cost_model_lib.model_key(tiny_lm).endswith("-float32")
    assert cost_model_lib.model_key(tiny_lm, "float32") == cost_model_lib.model_key(tiny_lm)


def test_executors_of_one_model_share_their_step_configs(tiny_lm):
    # jit compares static arguments by equality: equal configs of two executors would compare
    # their graphdefs node by node on every call, the same object by identity; and hashing a
    # graphdef walks it too, so a canonical one's hash is computed once.
    a, b = (executor_lib.Executor(tiny_lm, scheduler_config=CONFIG, spec=js.SAConfig(
        max_draft_len=K)) for _ in range(2))
    assert a.graphdef is b.graphdef
    assert a.programs.config(K, True) is b.programs.config(K, True)
    split = nnx.split(tiny_lm)[0]
    assert split is not a.graphdef and step_lib.canonical_graphdef(split) is a.graphdef
    own = step_lib.StepConfig(graphdef=split, k=K, draft_source="sa", automaton=True,
                              sa_draft_len=K)
    canonical = dataclasses.replace(own, graphdef=a.graphdef)
    assert hash(own) == hash(canonical) and own == canonical
    assert a.programs.config(0, True) is not a.programs.config(K, True)


def test_an_automaton_rebuilt_after_steps_compiles_nothing_new(tiny_lm):
    """A new executor's state is committed to its device, as a step's outputs are, so the
    programs that copy an automaton in and prime it, compiled at a request's start, serve a
    rebuild after steps (a rest's end) too: an uncommitted state compiled them again there."""
    executor = executor_lib.Executor(tiny_lm, scheduler_config=CONFIG,
                                     spec=js.SAConfig(max_draft_len=K))
    assert all(a.committed for a in jax.tree.leaves(executor.state))
    executor.add_request(random_prompts(3, [6])[0],
                         requests_lib.SamplingParams(max_new_tokens=20), frozenset())
    for _ in range(3):                  # the prefill, the priming with the first step, a step
        executor.step()
    compiled = step_lib.prime_drafts._cache_size(), sa_state.write_slot._cache_size()
    request = next(iter(executor._live.values()))
    executor.slots.add_request(request.request_id, request.tokens)
    executor._unprimed.append(request)
    executor._flush_automata()
    assert (step_lib.prime_drafts._cache_size(), sa_state.write_slot._cache_size()) == compiled
