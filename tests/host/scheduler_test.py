"""Scheduler: admission, placeholder reservation, the token budget shared by decode rows and
prompt chunks, chunking, finishing; plus random workloads against a brute-force schedule."""

import dataclasses

from absl.testing import parameterized
import hypothesis
from hypothesis import strategies as st
import pytest

from jaxspec.host import requests as requests_lib
from jaxspec.host import scheduler as scheduler_lib

State = requests_lib.State


def make_request(rid, prompt_len, max_new_tokens=8):
    return requests_lib.Request(request_id=rid, prompt=list(range(1, prompt_len + 1)),
                                params=requests_lib.SamplingParams(max_new_tokens=max_new_tokens),
                                stop_ids=frozenset())


def commit_prefill(batch):
    """What the executor does after a prefill: cache the chunk; a whole prompt starts decoding."""
    for c in batch.prefill:
        c.request.num_cached += c.length
        if c.completes_prompt:
            c.request.state = State.DECODE
            c.request.append([7])


def config(**kwargs):
    defaults = dict(max_batch_size=4, max_num_tokens=32, max_seq_len=64, page_size=4,
                    prefill_chunk=16)
    return scheduler_lib.SchedulerConfig(**(defaults | kwargs))


class SchedulerConfigTest(parameterized.TestCase):

    @parameterized.parameters("max_batch_size", "max_num_tokens", "max_seq_len", "page_size",
                              "prefill_chunk")
    def test_positive_ints(self, name):
        for bad in (0, -1, 2.0):
            with pytest.raises(ValueError, match=name):
                config(**{name: bad})

    def test_num_pages(self):
        with pytest.raises(ValueError, match="num_pages"):
            config(num_pages=1)

    def test_pages(self):
        cfg = config(max_seq_len=61, page_size=4, max_batch_size=3)
        assert cfg.pages_per_seq(2) == 16                # 61 + 1 + 2 slots
        assert cfg.pages_per_seq(3) == 17
        assert cfg.total_pages(2) == 3 * 16 + 1          # + the null page
        assert config(num_pages=9).total_pages(2) == 9


class SchedulerTest(parameterized.TestCase):

    def test_add_refuses_what_can_never_run(self):
        # (Prompt lengths against max_seq_len are requests.check_prompt's, tested there.)
        small = scheduler_lib.Scheduler(config(num_pages=4), max_draft_len=3)
        with pytest.raises(ValueError, match="needs 4 KV pages, the cache has 3"):
            small.add(make_request(0, 8, max_new_tokens=4))     # 8 + 4 + 1 + 3 = 16 slots
        assert not small.has_work()

    def test_admission_stops_at_the_batch_size(self):
        s = scheduler_lib.Scheduler(config(max_batch_size=2), max_draft_len=0)
        for rid in range(3):
            s.add(make_request(rid, 4))
        batch = s.schedule(tokens_per_decode=1)
        assert [c.request.request_id for c in batch.prefill] == [0, 1]
        assert s.num_active == 2 and len(s.waiting) == 1

    def test_admission_waits_for_pages_in_order(self):
        # Each request's worst case is 8 + 8 + 1 + 3 = 20 slots = 5 pages; the cache has 9.
        s = scheduler_lib.Scheduler(config(num_pages=10), max_draft_len=3)
        first, second, third = (make_request(i, 8) for i in range(3))
        for r in (first, second, third):
            s.add(r)
        s.schedule(tokens_per_decode=4)
        assert s.running == [first] and list(s.waiting) == [second, third]
        assert s.allocator.num_free == 4
        s.finish(first, "length")
        s.schedule(tokens_per_decode=4)
        assert s.running == [second] and list(s.waiting) == [third]

    def test_placeholders_come_first_then_prompt_chunks_oldest_first(self):
        s = scheduler_lib.Scheduler(config(max_num_tokens=20, prefill_chunk=16), max_draft_len=3)
        decoding = [make_request(i, 3) for i in range(2)]
        for r in decoding:
            s.add(r)
        commit_prefill(s.schedule(tokens_per_decode=4))
        prompts = [make_request(2, 10), make_request(3, 10)]
        for r in prompts:
            s.add(r)
        batch = s.schedule(tokens_per_decode=4)
        assert batch.decode == decoding
        # 20 - 2 * (1 + 3) = 12 tokens left: 10 for the older prompt, 2 for the next one.
        assert [(c.request.request_id, c.start, c.length) for c in batch.prefill] == [
            (2, 0, 10), (3, 0, 2)]
        assert batch.num_tokens == 12
        assert batch.prefill[0].completes_prompt and not batch.prefill[1].completes_prompt
        # Pages for each chunk; the decode rows' pages wait for the executor's final K.
        assert prompts[0].pages.capacity >= 10 and prompts[1].pages.capacity >= 2

    def test_decode_rows_beyond_the_budget_wait(self):
        s = scheduler_lib.Scheduler(config(max_num_tokens=9), max_draft_len=3)
        rows = [make_request(i, 2) for i in range(3)]
        for r in rows:
            s.add(r)
        commit_prefill(s.schedule(tokens_per_decode=4))
        batch = s.schedule(tokens_per_decode=4)
        assert batch.decode == rows[:2] and batch.prefill == []

    def test_prompts_are_chunked_across_iterations(self):
        s = scheduler_lib.Scheduler(config(prefill_chunk=16, max_num_tokens=64), max_draft_len=0)
        r = make_request(0, 40)
        s.add(r)
        spans = []
        while r.state is not State.DECODE:
            batch = s.schedule(tokens_per_decode=1)
            spans += [(c.start, c.length) for c in batch.prefill]
            commit_prefill(batch)
        assert spans == [(0, 16), (16, 16), (32, 8)]

    def test_finish_releases_pages_and_keeps_the_first_reason(self):
        s = scheduler_lib.Scheduler(config(), max_draft_len=2)
        running, waiting = make_request(0, 5), make_request(1, 5)
        s.add(running)
        s.schedule(tokens_per_decode=3)
        s.add(waiting)
        running.finish_reason = "stop"
        s.finish(running, "cancelled")
        s.finish(waiting, "cancelled")
        assert (running.state, running.finish_reason) == (State.FINISHED, "stop")
        assert (waiting.state, waiting.finish_reason) == (State.FINISHED, "cancelled")
        assert not s.has_work()
        assert s.allocator.num_free == s.allocator.num_pages - 1


# ---------------------------------------------------------------------------- random workloads

@dataclasses.dataclass(frozen=True)
class Workload:
    config: scheduler_lib.SchedulerConfig
    max_draft_len: int
    requests: tuple[tuple[int, int], ...]          # (prompt length, max_new_tokens)
    ks: tuple[int, ...]                           # K per iteration (cycled)
    accepted: tuple[int, ...]                     # accepted drafts per decode row (cycled)


@st.composite
def workloads(draw):
    max_draft_len = draw(st.integers(0, 4))
    cfg = scheduler_lib.SchedulerConfig(
        max_batch_size=draw(st.integers(1, 5)), max_num_tokens=draw(st.integers(5, 40)),
        max_seq_len=40, page_size=draw(st.sampled_from([1, 4, 8])),
        prefill_chunk=draw(st.integers(1, 16)),
        num_pages=draw(st.one_of(st.none(), st.integers(12, 40))))
    requests = draw(st.lists(st.tuples(st.integers(1, 24), st.integers(1, 16)), min_size=1,
                             max_size=8))
    ks = draw(st.lists(st.integers(0, max_draft_len), min_size=1, max_size=5))
    accepted = draw(st.lists(st.integers(0, 4), min_size=1, max_size=5))
    return Workload(cfg, max_draft_len, tuple(requests), tuple(ks), tuple(accepted))


def expected_schedule(running, cfg, tokens_per_decode):
    """The definition: decode rows in order while 1 + K fits, then chunks in order."""
    budget = cfg.max_num_tokens
    decode = []
    for r in running:
        if r.state is State.DECODE and budget >= tokens_per_decode:
            decode.append(r.request_id)
            budget -= tokens_per_decode
    chunks = []
    for r in running:
        if r.state is State.PREFILL and budget > 0:
            n = min(len(r.prompt) - r.num_cached, budget, cfg.prefill_chunk)
            chunks.append((r.request_id, r.num_cached, n))
            budget -= n
    return decode, chunks


@hypothesis.settings(max_examples=120, deadline=None, derandomize=True)
@hypothesis.given(workloads())
def test_random_workloads_follow_the_budget_and_finish(w):
    cfg = w.config
    s = scheduler_lib.Scheduler(cfg, max_draft_len=w.max_draft_len)
    requests = []
    for rid, (prompt_len, max_new) in enumerate(w.requests):
        r = make_request(rid, prompt_len, max_new)
        try:
            s.add(r)
        except ValueError:
            assert s.allocator.pages_for(prompt_len + max_new + 1 + w.max_draft_len) > (
                s.allocator.num_pages - 1)
            continue
        requests.append(r)
    for it in range(400):
        if not s.has_work():
            break
        k = w.ks[it % len(w.ks)]
        batch = s.schedule(tokens_per_decode=1 + k)
        # Admission is FIFO and never overfills the batch.
        assert len(s.running) <= cfg.max_batch_size
        assert [r for r in requests if r.state is State.WAITING] == list(s.waiting)
        decode, chunks = expected_schedule(s.running, cfg, 1 + k)
        assert [r.request_id for r in batch.decode] == decode
        assert [(c.request.request_id, c.start, c.length) for c in batch.prefill] == chunks
        assert len(batch.decode) * (1 + k) + batch.num_tokens <= cfg.max_num_tokens
        # Progress: one 1 + K window always fits the budget here, so a step with running requests
        # schedules something.
        assert batch.decode or batch.prefill or not s.running
        commit_prefill(batch)
        for i, r in enumerate(batch.decode):
            r.pages.ensure(r.num_cached + 1 + k)          # the executor's step 5; never refused
            n = min(w.accepted[i % len(w.accepted)], k) + 1
            r.num_cached += n
            r.append([7] * n)
        for r in list(s.running):
            if r.finish_reason:
                s.finish(r, r.finish_reason)
        owned = [p for r in s.running for p in r.pages.pages]
        assert len(owned) == len(set(owned))
    else:
        pytest.fail("the workload did not finish in 400 iterations")
    assert all(len(r.output) == r.params.max_new_tokens for r in requests)
    assert s.allocator.num_free == s.allocator.num_pages - 1


@pytest.mark.parametrize("kwargs, match", [
    (dict(batch_buckets=()), "batch_buckets"),
    (dict(batch_buckets=(0, 2)), "batch_buckets"),
    (dict(prefill_buckets=[16, 32]), "prefill_buckets"),
    (dict(prefill_buckets=(16, -1)), "prefill_buckets"),
])
def test_bad_buckets(kwargs, match):
    with pytest.raises(ValueError, match=match):
        scheduler_lib.SchedulerConfig(**kwargs)


def test_chunk_buckets_stop_at_prefill_chunk():
    cfg = scheduler_lib.SchedulerConfig(prefill_chunk=100, prefill_buckets=(16, 64, 128, 256))
    assert cfg.chunk_buckets == (16, 64, 100)
