"""Issue 13's control plane on the tiny model: a reversible gate comes back (for the batch and
per request), no drafter resumes from stale state after the schedule paused speculation, and
resting automata wake up exact. Adaptive K's compiled widths: adaptive_test.py."""

import collections

import pytest

import jaxspec as js
from jaxspec import engine as engine_lib
from jaxspec.host import compiles
from jaxspec.host import cost_model as cost_model_lib
from jaxspec.host import requests as requests_lib
from jaxspec.host import rest as rest_lib
from jaxspec.host import scheduler as scheduler_lib
from tests.helpers import random_prompts

CONFIG = scheduler_lib.SchedulerConfig(max_batch_size=4, max_seq_len=96, page_size=16,
                                       max_num_tokens=256, prefill_chunk=32)


def _add(executor, prompt, n):
    return executor.add_request(prompt, requests_lib.SamplingParams(max_new_tokens=n),
                                frozenset())


class ScriptedDrafter(js.Drafter):
    """Drafts each request's true continuation where `good(request id, generated so far)`
    holds, else a continuation wrong at every position."""

    def __init__(self, truth, good, **kwargs):
        super().__init__(**kwargs)
        self.truth, self.good = truth, good

    def prepare_draft_tokens(self, requests):
        drafts = []
        for r in requests:
            true = self.truth[r.request_id][len(r.tokens):len(r.tokens) + self.draft_len]
            ok = self.good(r.request_id, len(r.output))
            drafts.append(true if ok else [(t + 1) % 128 for t in true])
        return drafts


def _scripted_run(model, uncached_greedy, good, n=60, **gate):
    prompts = random_prompts(5, [7, 9])
    drafter = ScriptedDrafter({}, good, max_draft_len=3, acceptance_rate_window_size=3,
                              acceptance_rate_threshold=0.5, **gate)
    executor = engine_lib.Engine(model, spec=drafter, scheduler=CONFIG).executor
    for p in prompts:
        rid = _add(executor, p, n)
        drafter.truth[rid] = p + uncached_greedy(model, p, n)
    done = executor.run()
    for rid, p in enumerate(prompts):
        assert done[rid].output == drafter.truth[rid][len(p):]
    return executor, done


def test_a_reversible_batch_gate_comes_back(tiny_lm, uncached_greedy):
    # Good drafts, then garbage (the gate closes), then good again: probes find it out.
    executor, _ = _scripted_run(tiny_lm, uncached_greedy, lambda rid, n: not 12 <= n < 30,
                                gate="reversible")
    k = executor.stats.k_history
    closed = k.index(0)
    assert set(k[:closed]) == {3}
    probes = [i for i in range(closed, len(k)) if k[i] == 2]        # probes draft 2 tokens
    assert probes, k
    assert 3 in k[probes[0]:], "speculation came back at full K after a good probe"
    assert not executor.gate.disabled


def test_the_permanent_gate_does_not_come_back(tiny_lm, uncached_greedy):
    executor, _ = _scripted_run(tiny_lm, uncached_greedy, lambda rid, n: not 12 <= n < 30)
    k = executor.stats.k_history
    assert set(k[k.index(0):]) == {0} and executor.gate.disabled


def test_a_request_whose_drafts_collapse_stops_drafting_alone(tiny_lm, uncached_greedy):
    """Request 1's drafts turn to garbage; its own gate closes while request 0 keeps drafting."""
    executor, done = _scripted_run(tiny_lm, uncached_greedy,
                                   lambda rid, n: rid == 0 or n < 10, gate="reversible")
    good, bad = done[0], done[1]
    assert good.accepted == good.drafted > 0
    # Request 1 drafted 3 per step until its window of 3 closed its gate, then only probes.
    assert bad.drafted < 3 * bad.steps // 2, (bad.drafted, bad.steps)
    assert not executor.gate.disabled                    # the pooled batch gate stayed open


# ---------------------------------------------------------------------------- stale state

def _positions(request):
    """{position of the step's first token: tokens the step kept} for every verify step."""
    out, p = {}, len(request.prompt) + 1
    for n in request.acceptance_lengths:
        out[p] = n
        p += n
    return out


@pytest.mark.parametrize("schedule", [{2: 4}, {1: 4, 4: 1}], ids=["paused", "shortened"])
@pytest.mark.parametrize("drafter", ["sa", "ngram"])
def test_no_stale_drafter_state_after_a_paused_stretch(tiny_lm, drafter, schedule):
    """The batch grows past the schedule (4 requests: K = 0, or 1), then shrinks back to one:
    its acceptance after resuming at K = 4 equals a run that never paused, position by position.
    (TensorRT-LLM's n-gram pool stores continuations at the runtime K, so text seen during a
    K = 1 stretch drafts one token for good.)"""
    spec = (js.SAConfig(max_draft_len=4, draft_len_schedule=schedule) if drafter == "sa" else
            js.NGramConfig(max_draft_len=4, max_matching_ngram_size=2, is_public_pool=False,
                           draft_len_schedule=schedule))
    long_prompt = random_prompts(7, [12], alphabet_size=3)[0]
    def run(paused):
        executor = engine_lib.Engine(tiny_lm, spec=spec, scheduler=CONFIG).executor
        rid = _add(executor, long_prompt, 70)
        if paused:
            for p in random_prompts(8, [6, 8, 10], alphabet_size=3):
                _add(executor, p, 20)
        return executor, executor.run()[rid]
    paused_ex, paused = run(True)
    _, steady = run(False)
    assert paused.output == steady.output
    # The long request decodes in every step: its steps line up with the run's K history, and
    # the first step with K > 0 is where speculation resumed (the other three had finished).
    k = paused_ex.stats.k_history
    resumed = k.index(4)
    assert resumed >= 10 and set(k[:resumed]) <= {0, 1}
    start = len(paused.prompt) + 1 + sum(paused.acceptance_lengths[:resumed])
    after = {p: n for p, n in _positions(paused).items() if p >= start}
    common = after.keys() & _positions(steady).keys()
    assert len(common) >= 5, (after, _positions(steady))
    assert {p: after[p] for p in common} == {p: _positions(steady)[p] for p in common}
    assert sum(after[p] for p in common) > len(common)      # drafts were accepted there


# ---------------------------------------------------------------------------- adaptive K

def test_resting_automata_rebuild_exactly_and_draft_again(tiny_lm, uncached_greedy, monkeypatch):
    """With rests cut short (two idle steps, then rests of 2-4 steps), requests rest and wake
    often. After every step, each awake request's device automaton holds exactly its tokens
    (resting rows extended nothing, woken ones were rebuilt), outputs stay greedy, and requests
    have drafts accepted after waking."""
    for name, value in (("REST_AFTER", 2), ("RECHECK_AFTER", 1), ("FIRST_WAIT", 2),
                        ("MAX_WAIT", 4)):
        monkeypatch.setattr(rest_lib, name, value)
    costs = cost_model_lib.StepCostModel()
    for rows in (1, 2, 4):
        for k in range(5):
            for _ in range(cost_model_lib.MIN_SAMPLES):
                costs.observe(rows, k, 1, 1.0 + 0.1 * k)
    spec = js.SAConfig(max_draft_len=4, adaptive=True, min_match_len=1)
    executor = engine_lib.Engine(tiny_lm, spec=spec, scheduler=CONFIG, cost_model=costs).executor
    prompts = random_prompts(11, [9, 12, 15], alphabet_size=3)
    ids = [_add(executor, p, 50) for p in prompts]
    done, rested, woke, accepted_awake = {}, set(), set(), collections.Counter()
    with compiles.LEDGER.eager():
        while executor.has_work():
            before = {rid: executor._resting(r) for rid, r in executor._live.items()}
            accepted = {rid: r.accepted for rid, r in executor._live.items()}
            done.update((e.request_id, e.result) for e in executor.step() if e.finished)
            sa = executor.state.sa
            for rid, r in executor._live.items():
                if r.state is not requests_lib.State.DECODE or r in executor._unprimed:
                    continue            # its prompt's automaton is copied by the next step
                if executor._resting(r):
                    rested.add(rid)
                    continue
                if before.get(rid):
                    woke.add(rid)
                if rid in woke:
                    accepted_awake[rid] += r.accepted - accepted.get(rid, 0)
                slot = int(executor.slots.slots([rid])[0])
                assert sa.text[slot, :int(sa.text_len[slot])].tolist() == r.tokens
                assert executor.slots.remaining(rid) == executor.slots.max_seq_len - len(r.tokens)
            assert int(sa.text_len[executor.slots.dummy_slot]) == 0
    for rid, p in zip(ids, prompts, strict=True):
        assert done[rid].output == uncached_greedy(tiny_lm, p, 50)
    assert rested and woke and sum(accepted_awake.values()) > 0, (rested, woke, accepted_awake)
