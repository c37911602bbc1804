"""The control plane, observed through the engine on the tiny model: the acceptance gate switching
speculation off for good, K following the schedule as the batch shrinks, the capacity gate,
bounded compilation per bucket, and AUTO."""

import dataclasses

import pytest

import jaxspec as js
from jaxspec import engine as engine_lib
from jaxspec import schedule as schedule_lib
from jaxspec.device import step as step_lib
from jaxspec.host import compiles
from jaxspec.host import cost_model as cost_model_lib
from jaxspec.host import policy as policy_lib
from jaxspec.host import requests as requests_lib
from jaxspec.host import scheduler as scheduler_lib
from tests.helpers import random_prompts

# One page per sequence, so page tables are always one column and each decode bucket is exactly
# one step compilation.
CONFIG = scheduler_lib.SchedulerConfig(max_batch_size=8, max_seq_len=48, page_size=64,
                                       max_num_tokens=256, prefill_chunk=32)


ENTRY_POINTS = ("step", "prefill", "prime_drafts")


def prompts(seed, lengths):
    return random_prompts(seed, lengths, alphabet_size=3)


def add(executor, prompt, max_new_tokens) -> int:
    return executor.add_request(prompt, requests_lib.SamplingParams(max_new_tokens=max_new_tokens),
                                frozenset())


def traces() -> tuple[int, ...]:
    return tuple(step_lib.trace_count(name) for name in ENTRY_POINTS)


def step_and_record(executor, outputs: dict) -> tuple[int, int] | None:
    """One iteration, finished requests' outputs into `outputs`; `(decode rows, K)` when it ran
    a verify step, else None."""
    rows_before, steps_before = executor.stats.request_steps, executor.stats.decode_steps
    for event in executor.step():
        if event.finished:
            outputs[event.request_id] = event.result.output
    if executor.stats.decode_steps == steps_before:
        return None
    return executor.stats.request_steps - rows_before, executor.stats.k_history[-1]


def outputs_of(executor) -> dict[int, list[int]]:
    return {rid: r.output for rid, r in executor.run().items()}


# ---------------------------------------------------------------------------- acceptance gate

class OracleThenGarbageDrafter(js.Drafter):
    """Drafts each request's true greedy continuation for `good_calls` calls, then a continuation
    that is wrong at every position: acceptance drops from 1 to 0."""

    def __init__(self, *, good_calls: int, vocab_size: int, **kwargs):
        super().__init__(**kwargs)
        self.good_calls = good_calls
        self.vocab_size = vocab_size
        self.calls = 0
        self.truth: dict[int, list[int]] = {}      # request id -> prompt + greedy continuation

    def prepare_draft_tokens(self, requests):
        self.calls += 1
        drafts = []
        for r in requests:
            true = self.truth[r.request_id][len(r.tokens):len(r.tokens) + self.draft_len]
            good = self.calls <= self.good_calls
            drafts.append(true if good else [(t + 1) % self.vocab_size for t in true])
        return drafts


def test_configs_carry_the_gate(tiny_lm):
    spec = js.NGramConfig(max_draft_len=3, acceptance_rate_window_size=3,
                          acceptance_rate_threshold=0.5)
    gate = engine_lib.Engine(tiny_lm, spec=spec, scheduler=CONFIG).executor.gate
    assert (gate.window, gate.threshold) == (3, 0.5)
    assert engine_lib.Engine(tiny_lm, spec=js.NGramConfig(max_draft_len=3),
                             scheduler=CONFIG).executor.gate is None
    sa = js.SAConfig(max_draft_len=3, acceptance_rate_window_size=5, acceptance_rate_threshold=0.2)
    gate = engine_lib.Engine(tiny_lm, spec=sa, scheduler=CONFIG).executor.gate
    assert (gate.window, gate.threshold) == (5, 0.2)


def test_gate_switches_speculation_off_for_good(tiny_lm, uncached_greedy):
    drafter = OracleThenGarbageDrafter(max_draft_len=3, good_calls=4, vocab_size=128,
                                       acceptance_rate_window_size=3,
                                       acceptance_rate_threshold=0.5)
    executor = engine_lib.Engine(tiny_lm, spec=drafter, scheduler=CONFIG).executor
    batch = prompts(0, [9, 13])
    ids = []
    for p in batch:
        ids.append(add(executor, p, 30))
        drafter.truth[ids[-1]] = p + uncached_greedy(tiny_lm, p, 30)
    outputs = outputs_of(executor)
    # Window means: 1, 1, 1 (four oracle steps), then (1 + 1 + 0) / 3 >= 0.5 keeps going and
    # (1 + 0 + 0) / 3 < 0.5 disables: six speculative steps, plain decoding ever after.
    k = executor.stats.k_history
    assert k[:6] == [3] * 6 and set(k[6:]) == {0} and len(k) > 12, k
    assert executor.gate.disabled
    assert drafter.calls == 6
    stats = executor.stats
    assert (stats.drafted, stats.accepted) == (6 * 2 * 3, 4 * 2 * 3)
    # Metrics: 8 verify rows committed 3 drafts + the bonus token; every other row committed one.
    assert stats.acceptance_lengths == {4: 8, 1: stats.request_steps - 8}
    assert stats.per_position_acceptance() == [8 / 12] * 3
    assert stats.acceptance_rate == 24 / 36
    assert stats.mean_acceptance_length == (24 + stats.request_steps) / stats.request_steps
    for rid, p in zip(ids, batch, strict=True):
        assert outputs[rid] == drafter.truth[rid][len(p):]


# ---------------------------------------------------------------------------- schedule, compiles

# Key 6 is no power of two: it becomes a bucket of its own, so K is constant inside every bucket.
# min_match_len=1 admits every draft, so once drafts exist no step falls back to K = 0.
SCHEDULE = {2: 3, 6: 2, 8: 1}
SPEC = js.SAConfig(max_draft_len=3, max_matching_ngram_size=5, enable_global_pool=True,
                   draft_len_schedule=SCHEDULE, min_match_len=1)


def _shrinking_run(model):
    """8 requests ending at different times; per iteration: decode (rows, K) and the traces of
    (step, prefill, prime_drafts) since the run began."""
    executor = engine_lib.Engine(model, spec=SPEC, scheduler=CONFIG).executor
    executor.overlap = False        # each iteration commits the step it ran
    batch = prompts(1, [3, 16, 7, 12, 5, 9, 14, 4])
    ids = [add(executor, p, n) for p, n in zip(batch, [2, 5, 9, 14, 19, 24, 30, 40], strict=True)]
    trace, done = [], {}
    start = traces()
    while executor.has_work():
        decoded = step_and_record(executor, done)
        trace.append((decoded, *(t - t0 for t, t0 in zip(traces(), start, strict=True))))
    return executor, batch, [done[i] for i in ids], trace


@pytest.fixture(scope="module")
def shrinking_run(tiny_lm):
    for fn in (step_lib.step, step_lib.prefill, step_lib.prime_drafts):
        fn.clear_cache()
    return _shrinking_run(tiny_lm)


def test_k_follows_the_schedule_as_the_batch_shrinks(shrinking_run, tiny_lm, uncached_greedy):
    executor, batch, outputs, trace = shrinking_run
    decoded = [d for d, *_ in trace if d is not None]
    assert executor.batch_buckets == (1, 2, 4, 6, 8)
    # The first step drafts only if a prompt's first generated token already continues a suffix
    # seen in the pool (it depends on the random weights): plain, or the schedule's K. Every later
    # step drafts, with the schedule's K.
    assert decoded[0] in ((8, 0), (8, schedule_lib.draft_len_for_batch_size(SCHEDULE, 8, 3)))
    for rows, k in decoded[1:]:
        assert k == schedule_lib.draft_len_for_batch_size(SCHEDULE, rows, 3), (rows, k)
    # As the batch shrank through the buckets, K took every value of the schedule, in order.
    seen = [k for _, k in decoded[1:]]
    assert seen == sorted(seen) and set(seen) == {1, 2, 3}
    buckets = {schedule_lib.bucket_for(rows, executor.batch_buckets) for rows, _ in decoded}
    assert len(buckets) >= 4, decoded
    for p, out in zip(batch, outputs, strict=True):
        assert out == uncached_greedy(tiny_lm, p, len(out))
    assert executor.stats.accepted > 0


def test_each_bucket_compiles_once_and_steady_state_never(shrinking_run, tiny_lm):
    executor, _, _, trace = shrinking_run
    buckets_seen = set()
    step_compiles = 0
    for decoded, num_step, _, _ in trace:
        if decoded is not None:
            shape = (schedule_lib.bucket_for(decoded[0], executor.batch_buckets), decoded[1])
            if shape not in buckets_seen:
                buckets_seen.add(shape)
                step_compiles += 1
        # A step compiles exactly when its batch lands in a (bucket, K) not seen before.
        assert num_step == step_compiles, trace
    _, _, num_prefill, num_prime = trace[-1]
    # One prefill (all 8 prompts in one chunk each) and one priming of 8 new automata.
    assert (num_prefill, num_prime) == (1, 1)
    # A second executor with the same configuration reuses every compiled step.
    _, _, _, rerun = _shrinking_run(tiny_lm)
    assert rerun[-1][1:] == (0, 0, 0)


def test_auto_resolves_and_runs(tiny_lm, uncached_greedy):
    executor = engine_lib.Engine(tiny_lm, spec="auto", scheduler=CONFIG,
                                 cost_model=cost_model_lib.StepCostModel()).executor
    assert executor.policy == policy_lib.resolve(js.AutoConfig(),
                                                 max_batch_size=CONFIG.max_batch_size)
    batch = prompts(2, [6, 11])
    ids = [add(executor, p, 20) for p in batch]
    with compiles.LEDGER.eager():       # the widths it prefers, compiled at once
        outputs = outputs_of(executor)
    for rid, p in zip(ids, batch, strict=True):
        assert outputs[rid] == uncached_greedy(tiny_lm, p, 20)
    # Adaptive K: compiled widths only, speculating on some steps.
    assert set(executor.stats.k_history) <= set(executor.widths)
    assert max(executor.stats.k_history) > 0
    assert executor.stats.accepted > 0


# ---------------------------------------------------------------------------- capacity gate

def _capacity_run(model, max_num_tokens, spec, num_requests):
    config = dataclasses.replace(CONFIG, max_num_tokens=max_num_tokens)
    executor = engine_lib.Engine(model, spec=spec, scheduler=config).executor
    batch = prompts(3, [5, 8, 6][:num_requests])
    ids = [add(executor, p, 12) for p in batch]
    trace, done = [], {}
    while executor.has_work():
        trace.append(step_and_record(executor, done))
    return [done[i] for i in ids], [d for d in trace if d is not None], batch


def test_token_budget_below_one_plus_k_turns_speculation_off(tiny_lm, uncached_greedy):
    spec = js.NGramConfig(max_draft_len=3)
    outputs, decoded, batch = _capacity_run(tiny_lm, 3, spec, 1)
    assert {k for _, k in decoded} == {0}
    assert outputs[0] == uncached_greedy(tiny_lm, batch[0], 12)
    _, decoded, _ = _capacity_run(tiny_lm, 4, spec, 1)
    # Full K, except on steps where the pool had no draft at all (those run plain).
    assert 3 in {k for _, k in decoded} and {k for _, k in decoded} <= {0, 3}


def test_placeholders_bound_the_decode_rows(tiny_lm, uncached_greedy):
    """A budget of 9 tokens holds two 1 + 3 windows: two of three requests decode per step, with
    full speculation, and the third waits its turn."""
    spec = js.NGramConfig(max_draft_len=3)
    outputs, decoded, batch = _capacity_run(tiny_lm, 9, spec, 3)
    assert {rows for rows, _ in decoded} == {1, 2}
    assert 3 in {k for _, k in decoded} and {k for _, k in decoded} <= {0, 3}
    for p, out in zip(batch, outputs, strict=True):
        assert out == uncached_greedy(tiny_lm, p, 12)


# ---------------------------------------------------------------------------- draft admission

def test_steps_without_admitted_drafts_run_as_plain_decoding(tiny_lm, uncached_greedy):
    """Prompts of distinct tokens give the automaton nothing to match at first: those steps run
    with K = 0; once the output repeats itself (the tiny model loops), drafts come back."""
    engine = engine_lib.Engine(tiny_lm, spec=js.SAConfig(max_draft_len=3, min_match_len=2),
                               scheduler=CONFIG)
    prompt = list(range(20, 30))
    out = engine.generate(prompt, max_new_tokens=30)
    k = engine.executor.stats.k_history
    assert 0 in k and 3 in k, k
    assert set(k) == {0, 3}
    assert out.token_ids == uncached_greedy(tiny_lm, prompt, 30)
    # Only admitted drafts are verified: every verified row drafted after a match of >= 2.
    assert engine.executor.stats.drafted > 0


def test_a_higher_min_match_len_verifies_fewer_drafts(tiny_lm, uncached_greedy):
    prompt = list(range(20, 30))
    runs = {}
    for min_match in (1, 8):
        engine = engine_lib.Engine(tiny_lm, spec=js.SAConfig(max_draft_len=3,
                                                           min_match_len=min_match),
                                   scheduler=CONFIG)
        out = engine.generate(prompt, max_new_tokens=24)
        assert out.token_ids == uncached_greedy(tiny_lm, prompt, 24)
        runs[min_match] = engine.executor.stats
    assert runs[8].drafted < runs[1].drafted
    assert runs[8].k_history.count(0) > runs[1].k_history.count(0)
