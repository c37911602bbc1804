"""Lossless speculation, property-tested on the tiny model: every request's greedy output with
speculation equals its output without it, token for token.

Each example is a workload of 1-10 requests (at most 8 run at once: later ones wait for a batch row
and reuse freed pages and automaton slots) with mixed prompt and output lengths, some joining the
run after it started and some cancelled before the end (the executor is driven directly), prompts
drawn from 2-4 token ids so the text repeats and drafts really get accepted, sometimes a stop
token, and a random valid draft-length schedule. Every drafter path runs: the suffix automaton
(longest match, fixed n-gram size, global pool), frequency-scored suffix drafts and token trees,
the n-gram pool, a user `Drafter` subclass, and the same user drafter enhanced by device
automata. The reference is the plain engine at batch size 1: greedy output depends only on the
prompt.

Shapes are shared by all examples (one SchedulerConfig, one max_draft_len, every schedule key a
power-of-two batch bucket), so compilations are reused across examples and drafter paths.
"""

import collections
import dataclasses

import hypothesis
from hypothesis import strategies as st
import numpy as np
import pytest

import jaxspec as js
from jaxspec import engine as engine_lib
from jaxspec.host import compiles
from jaxspec.host import cost_model
from jaxspec.host import requests as requests_lib
from jaxspec.host import scheduler as scheduler_lib
from jaxspec.models import tiny

pytestmark = pytest.mark.slow
VOCAB_SIZE = tiny.tiny_config().vocab_size
MAX_DRAFT_LEN = 3
MAX_PROMPT = 20
MAX_NEW = 20
# A budget of 64 tokens is shared between up to 8 x (1 + 3) placeholder tokens and prompt chunks
# of at most 16, so prefill is often split by the budget as well as by the chunk size. Sequences
# reach 44 slots (40 tokens + the verify window): two pages of 32, so verify windows and rollbacks
# cross a page boundary, while page tables stay 1 or 2 columns wide (few compilations).
CONFIG = scheduler_lib.SchedulerConfig(max_batch_size=8, max_seq_len=MAX_PROMPT + MAX_NEW,
                                       page_size=32, max_num_tokens=64, prefill_chunk=16)
REFERENCE_CONFIG = dataclasses.replace(CONFIG, max_batch_size=1)
_SETTINGS = hypothesis.settings(max_examples=5, deadline=None, derandomize=True,
                                suppress_health_check=[hypothesis.HealthCheck.too_slow,
                                                       hypothesis.HealthCheck.data_too_large])


class RepeatLastDrafter(js.Drafter):
    """A user drafter: the last token repeated, 0..K times depending on the text length.

    Drafts of every length (empty ones included) exercise the padding to the bucket's K; `drafted`
    counts what it really proposed, which the executor's statistics must match exactly.
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.drafted = 0

    def prepare_draft_tokens(self, requests):
        drafts = [[r.tokens[-1]] * (len(r.tokens) % (self.draft_len + 1)) for r in requests]
        self.drafted += sum(map(len, drafts))
        return drafts


def random_costs(seed: int) -> cost_model.StepCostModel:
    """A cost model with random step times for every width: adaptive K then picks widths all
    over the place."""
    rng = np.random.default_rng(seed)
    costs = cost_model.StepCostModel()
    for rows in (1, 2, 4, 8):
        for k in range(MAX_DRAFT_LEN + 1):
            costs.observe(rows, k, 1, float(rng.uniform(0.5, 2.0)))
    return costs


GATE = dict(acceptance_rate_window_size=2, acceptance_rate_threshold=0.4, gate="reversible")
SPECS = {
    "sa_longest": lambda s, _: dict(spec=js.SAConfig(max_draft_len=MAX_DRAFT_LEN,
                                                     draft_len_schedule=s)),
    "sa_fixed_ngram": lambda s, _: dict(spec=js.SAConfig(
        max_draft_len=MAX_DRAFT_LEN, max_matching_ngram_size=2, draft_len_schedule=s)),
    "sa_global_pool": lambda s, _: dict(spec=js.SAConfig(
        max_draft_len=MAX_DRAFT_LEN, enable_global_pool=True, draft_len_schedule=s)),
    "sa_frequent": lambda s, _: dict(spec=js.SAConfig(
        max_draft_len=MAX_DRAFT_LEN, selection="frequent", draft_len_schedule=s)),
    # Trees of up to 2K nodes, at most K deep.
    "sa_frequent_tree": lambda s, _: dict(spec=js.SAConfig(
        max_draft_len=MAX_DRAFT_LEN, selection="frequent", min_match_len=1,
        tree_budget=2 * MAX_DRAFT_LEN, draft_len_schedule=s)),
    "ngram": lambda s, _: dict(spec=js.NGramConfig(
        max_draft_len=MAX_DRAFT_LEN, max_matching_ngram_size=2, draft_len_schedule=s)),
    "user_drafter": lambda s, _: dict(spec=RepeatLastDrafter(max_draft_len=MAX_DRAFT_LEN,
                                                             draft_len_schedule=s)),
    "enhanced_user_drafter": lambda s, _: dict(
        spec=RepeatLastDrafter(max_draft_len=MAX_DRAFT_LEN, draft_len_schedule=s),
        enhancer=js.SAEnhancerConfig(threshold=2)),
    # Adaptive K over random step costs, with reversible gates for the batch and each request.
    "sa_adaptive": lambda s, seed: dict(
        spec=js.SAConfig(max_draft_len=MAX_DRAFT_LEN, draft_len_schedule=s, adaptive=True,
                         min_match_len=1, enable_global_pool=True, **GATE),
        cost_model=random_costs(seed)),
    "sa_frequent_adaptive": lambda s, seed: dict(
        spec=js.SAConfig(max_draft_len=MAX_DRAFT_LEN, draft_len_schedule=s, adaptive=True,
                         selection="frequent", min_match_len=1, enable_global_pool=True,
                         **GATE),
        cost_model=random_costs(seed)),
    "sa_frequent_tree_adaptive": lambda s, seed: dict(
        spec=js.SAConfig(max_draft_len=MAX_DRAFT_LEN, draft_len_schedule=s, adaptive=True,
                         selection="frequent", min_match_len=1, enable_global_pool=True,
                         tree_budget=2 * MAX_DRAFT_LEN, **GATE),
        cost_model=random_costs(seed)),
    # AUTO (no gate: plain steps chain while the planner would not verify the drafts).
    "auto": lambda s, seed: dict(spec=js.AutoConfig(), cost_model=random_costs(seed)),
    "ngram_adaptive": lambda s, seed: dict(
        spec=js.NGramConfig(max_draft_len=MAX_DRAFT_LEN, max_matching_ngram_size=2,
                            draft_len_schedule=s, adaptive=True, **GATE),
        cost_model=random_costs(seed)),
}


@dataclasses.dataclass(frozen=True)
class Arrival:
    step: int                     # executor iterations run before the request is added
    prompt: tuple[int, ...]
    max_new_tokens: int
    stop: int | None              # a stop token id
    cancel_after: int | None      # iterations after which the request is cancelled

    def expected(self, reference) -> list[int]:
        out = reference[self.prompt][:self.max_new_tokens]
        return out[:out.index(self.stop) + 1] if self.stop in out else out


@st.composite
def schedules(draw):
    """None (a quarter of the time), or a valid schedule whose keys are batch buckets (so it adds
    no compilation bucket)."""
    if draw(st.integers(0, 3)) == 0:
        return None
    keys = sorted(draw(st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=3,
                                unique=True)))
    values = [MAX_DRAFT_LEN] + [draw(st.integers(0, MAX_DRAFT_LEN)) for _ in keys[1:]]
    return dict(zip(keys, values, strict=True))


@st.composite
def workloads(draw):
    alphabet = draw(st.lists(st.integers(0, VOCAB_SIZE - 1), min_size=2, max_size=4,
                             unique=True))
    arrivals = []
    for i in range(draw(st.integers(1, CONFIG.max_batch_size + 2))):
        arrivals.append(Arrival(
            step=0 if i == 0 else draw(st.integers(0, 8)),
            prompt=tuple(draw(st.lists(st.sampled_from(alphabet), min_size=1,
                                       max_size=MAX_PROMPT))),
            max_new_tokens=draw(st.integers(1, MAX_NEW)),
            stop=draw(st.one_of(st.none(), st.sampled_from(alphabet))),
            cancel_after=draw(st.one_of(st.none(), st.none(), st.integers(1, 10)))))
    return sorted(arrivals, key=lambda a: a.step)


class _References(dict):
    """Greedy continuations of MAX_NEW tokens by prompt; a shorter request takes a prefix."""

    def __init__(self, engine):
        super().__init__()
        self.engine = engine

    def __missing__(self, prompt):
        out = self.engine.generate(list(prompt), max_new_tokens=MAX_NEW).token_ids
        self[prompt] = out
        return out


@pytest.fixture(scope="module")
def reference(tiny_lm):
    """The plain engine at batch size 1: greedy output depends only on the prompt."""
    return _References(engine_lib.Engine(tiny_lm, spec="none", scheduler=REFERENCE_CONFIG))


def run_workload(executor, arrivals):
    """Adds each request after its number of iterations, cancels those due, and runs until every
    request finished; returns ({request id: arrival}, {request id: finished request})."""
    pending = collections.deque(arrivals)
    added, cancels, done = {}, collections.defaultdict(list), {}
    step = 0
    while pending or executor.has_work():
        while pending and pending[0].step <= step:
            a = pending.popleft()
            params = requests_lib.SamplingParams(max_new_tokens=a.max_new_tokens)
            stops = frozenset() if a.stop is None else frozenset([a.stop])
            rid = executor.add_request(a.prompt, params, stops)
            added[rid] = a
            if a.cancel_after is not None:
                cancels[step + a.cancel_after].append(rid)
        for rid in cancels.pop(step, []):
            if rid not in done:
                done[rid] = executor.cancel(rid)
        if executor.has_work():
            done.update((e.request_id, e.result) for e in executor.step() if e.finished)
        step += 1
    return added, done


@pytest.mark.parametrize("drafter", sorted(SPECS))
def test_greedy_speculation_is_lossless(drafter, tiny_lm, reference):
    totals = collections.Counter()

    @_SETTINGS
    @hypothesis.given(arrivals=workloads(), schedule=schedules(), seed=st.integers(0, 2**16))
    def check(arrivals, schedule, seed):
        kwargs = SPECS[drafter](schedule, seed)
        executor = engine_lib.Engine(tiny_lm, scheduler=CONFIG, **kwargs).executor
        dispatch = executor._dispatch

        def counted(plan, previous=None):
            totals["chained plain"] += previous is not None and plan.k == 0 and not plan.bare
            return dispatch(plan, previous)

        executor._dispatch = counted
        # Adaptive K runs every width it prefers at once, not once compiled in the background.
        with compiles.LEDGER.eager():
            added, done = run_workload(executor, arrivals)
        assert done.keys() == added.keys()
        for rid, a in added.items():
            r = done[rid]
            if r.finish_reason == "cancelled":
                assert r.output == a.expected(reference)[:len(r.output)], a
            else:
                assert r.output == a.expected(reference), a
        stats = executor.stats
        if isinstance(kwargs["spec"], RepeatLastDrafter) and "enhancer" not in kwargs:
            assert stats.drafted == kwargs["spec"].drafted
        assert sum(stats.acceptance_lengths.values()) == stats.request_steps
        # Every page is free again (finished requests release theirs).
        allocator = executor.scheduler.allocator
        assert allocator.num_free == allocator.num_pages - 1
        totals["drafted"] += stats.drafted
        totals["accepted"] += stats.accepted

    check()
    assert totals["accepted"] > 0, totals
    if drafter == "auto":
        assert totals["chained plain"] > 0, totals
