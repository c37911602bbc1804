"""The overlap scheduler on the tiny model: with the host one step behind the device, every
request's output is the one it gets with every step read at once (and with plain decoding), and so
are the run's counts, through batches that shrink, stop tokens and length limits inside a verify
window, requests that join or are cancelled mid-run, sampling, the global pool, and an automaton
slot reused right after its request stopped."""

import collections
import dataclasses

import jax
import pytest

import jaxspec as js
from jaxspec.device import step as step_lib
from jaxspec.host import executor as executor_lib
from jaxspec.host import requests as requests_lib
from jaxspec.host import scheduler as scheduler_lib
from tests.helpers import random_prompts

CONFIG = scheduler_lib.SchedulerConfig(max_batch_size=4, max_seq_len=64, page_size=4,
                                       max_num_tokens=128, prefill_chunk=32)
K = 3
SA = js.SAConfig(max_draft_len=K, min_match_len=1)
# What the host counts must not depend on when it reads the steps. Not the batched steps
# (`decode_steps`): a request that takes the row of one that stopped starts a step later
# against its batch-mates, whose next step was dispatched before the stop was read.
COUNTS = ("generated_tokens", "request_steps", "drafted", "accepted", "committed",
          "acceptance_lengths")


@dataclasses.dataclass(frozen=True)
class Arrival:
    prompt: tuple[int, ...]
    max_new_tokens: int
    stop: int | None = None
    step: int = 0                 # iterations run before the request is added
    cancel_after: int | None = None
    temperature: float = 0.0


@dataclasses.dataclass
class Run:
    outputs: list[list[int]]      # per arrival
    reasons: list[str]
    counts: dict
    chained: int                  # steps dispatched before the previous one was read
    discarded: int                # rows read after their request had finished
    slots: list[int | None]       # per arrival, its automaton slot (None: no automata)
    executor: executor_lib.Executor


def run(model, spec, arrivals, *, overlap, config=CONFIG) -> Run:
    """Adds each arrival after its number of iterations, cancels those due, and steps until
    every request finished."""
    executor = executor_lib.Executor(model, scheduler_config=config, spec=spec, overlap=overlap)
    seen = collections.Counter()
    chain, commit = executor._chain, executor._commit

    def counted_commit(plan, out):
        seen["discarded"] += sum(r.finished for r in plan.requests)
        return commit(plan, out)

    executor._chain = lambda: (seen.update(["chained"]), chain())[1]
    executor._commit = counted_commit
    pending = collections.deque(sorted(arrivals, key=lambda a: a.step))
    ids, cancels, done, slots = {}, collections.defaultdict(list), {}, {}
    step = 0
    while pending or executor.has_work():
        while pending and pending[0].step <= step:
            a = pending.popleft()
            params = requests_lib.SamplingParams(max_new_tokens=a.max_new_tokens,
                                                 temperature=a.temperature, seed=7)
            stops = frozenset() if a.stop is None else frozenset([a.stop])
            ids[a] = executor.add_request(a.prompt, params, stops)
            if a.cancel_after is not None:
                cancels[step + a.cancel_after].append(ids[a])
        for rid in cancels.pop(step, []):
            if rid not in done:
                done[rid] = executor.cancel(rid)
        if executor.has_work():
            done.update((e.request_id, e.result) for e in executor.step() if e.finished)
        if executor.slots is not None:
            dummy = executor.slots.dummy_slot
            slots.update((rid, int(slot)) for rid in executor._live
                         for slot in executor.slots.slots([rid]) if slot != dummy)
        step += 1
    if executor._inflight is not None:        # a step nobody will read: all of its rows ended
        seen["discarded"] += len(executor._inflight.plan.requests)
    allocator = executor.scheduler.allocator
    assert allocator.num_free == allocator.num_pages - 1
    results = [done[ids[a]] for a in arrivals]
    return Run(outputs=[r.output for r in results], reasons=[r.finish_reason for r in results],
               counts={name: getattr(executor.stats, name) for name in COUNTS},
               chained=seen["chained"], discarded=seen["discarded"],
               slots=[slots.get(ids[a]) for a in arrivals],
               executor=executor)


def assert_overlap_changes_nothing(model, spec, arrivals, **kwargs) -> tuple[Run, Run]:
    """Overlap on == overlap off == plain decoding, token for token; the counts of on and off
    are equal too. Returns the runs (on, off)."""
    on = run(model, spec, arrivals, overlap=True, **kwargs)
    off = run(model, spec, arrivals, overlap=False, **kwargs)
    assert off.chained == off.discarded == 0
    assert on.chained > 0, "nothing overlapped: the test checks nothing"
    assert on.outputs == off.outputs
    assert on.reasons == off.reasons
    assert on.counts == off.counts
    if spec is not None:
        plain = run(model, None, arrivals, overlap=False, **kwargs)
        assert on.outputs == plain.outputs
    return on, off


def prompts(seed, lengths):
    return [tuple(p) for p in random_prompts(seed, lengths, alphabet_size=3)]


@pytest.mark.parametrize("spec", [None, SA], ids=["plain", "sa"])
def test_batch_of_one(tiny_lm, uncached_greedy, spec):
    (prompt,) = prompts(0, [9])
    on, off = assert_overlap_changes_nothing(tiny_lm, spec, [Arrival(prompt, 30)])
    assert on.executor.stats.decode_steps == off.executor.stats.decode_steps
    assert on.outputs[0] == uncached_greedy(tiny_lm, list(prompt), 30)


@pytest.mark.parametrize("spec", [None, SA], ids=["plain", "sa"])
def test_requests_finishing_at_different_times(tiny_lm, spec):
    arrivals = [Arrival(p, n) for p, n in zip(prompts(1, [7, 12, 5, 3]), [25, 6, 17, 2],
                                              strict=True)]
    on, off = assert_overlap_changes_nothing(tiny_lm, spec, arrivals)
    assert on.executor.stats.decode_steps == off.executor.stats.decode_steps


def _sa_windows(model, prompt, max_new_tokens):
    """(output, per output token its (verify step, index in that step's window)) of an SA run
    read at once; the prefill's token is step 0."""
    executor = executor_lib.Executor(model, scheduler_config=CONFIG, spec=SA, overlap=False,
                                     record_top2=True)
    rid = executor.add_request(prompt, requests_lib.SamplingParams(max_new_tokens=max_new_tokens),
                               frozenset())
    request = executor.run()[rid]
    return request.output, [(step, j) for step, j, _ in request.windows]


def _inside_a_window(output, windows):
    """Output positions whose token is an accepted draft with more tokens of its window after
    it: a cut there (stop token or length limit) drops the rest of the window."""
    sizes = collections.Counter(step for step, _ in windows)
    return [i for i, (step, j) in enumerate(windows) if step > 0 and j + 1 < sizes[step]]


@pytest.fixture(scope="module")
def echo(tiny_lm, uncached_greedy):
    """(prompt, SA output of 24 tokens, output positions inside a verify window) for a prompt
    whose SA output starts a window with a draft token new to the output: a prompt `base +
    greedy(base) + base`, which the tiny model sometimes continues as before, so that the
    automaton's drafts copy the prompt."""
    for seed in range(40):
        base = random_prompts(seed, [5])[0]
        prompt = tuple(base + uncached_greedy(tiny_lm, base, 8) + base)
        output, windows = _sa_windows(tiny_lm, prompt, 24)
        inside = _inside_a_window(output, windows)
        if any(output[i] not in output[:i] for i in inside):
            return prompt, output, inside
    raise AssertionError("no prompt of 40 gives an accepted draft new to the output")


def _new_tokens(output, after: int = 0) -> list[int]:
    """Positions from `after` on whose token the output did not have before."""
    return [i for i, t in enumerate(output) if i >= after and t not in output[:i]]


def test_a_stop_token_inside_the_accepted_drafts(tiny_lm, echo):
    prompt, output, inside = echo
    # Stopping on it ends the request mid-window, with the step after it already dispatched.
    cut = next(i for i in inside if output[i] not in output[:i])
    arrivals = [Arrival(prompt, 24, stop=output[cut]), Arrival(prompts(3, [6])[0], 20)]
    on, _ = assert_overlap_changes_nothing(tiny_lm, SA, arrivals)
    assert on.outputs[0] == output[:cut + 1] and on.reasons[0] == "stop"
    assert on.discarded == 1


def test_a_plain_stop_token_discards_the_next_step(tiny_lm, echo):
    prompt = echo[0]
    (free,) = run(tiny_lm, None, [Arrival(prompt, 24)], overlap=False).outputs
    cut = _new_tokens(free, after=4)[0]
    on, _ = assert_overlap_changes_nothing(tiny_lm, None, [Arrival(prompt, 24, stop=free[cut])])
    assert on.outputs[0] == free[:cut + 1]
    # The step dispatched after the stop token was discarded: none of its tokens counted.
    assert on.discarded == 1 and on.counts["generated_tokens"] == cut + 1


def test_the_length_limit_inside_the_accepted_drafts(tiny_lm, echo):
    prompt, output, inside = echo
    cut = inside[-1]
    on, _ = assert_overlap_changes_nothing(tiny_lm, SA, [Arrival(prompt, cut + 1)])
    assert on.outputs[0] == output[:cut + 1] and on.reasons[0] == "length"


@pytest.mark.parametrize("spec", [None, SA], ids=["plain", "sa"])
def test_requests_joining_mid_run(tiny_lm, spec):
    a, b, c = prompts(5, [6, 11, 4])
    arrivals = [Arrival(a, 24), Arrival(b, 16, step=5), Arrival(c, 10, step=9)]
    assert_overlap_changes_nothing(tiny_lm, spec, arrivals)


def test_a_request_cancelled_mid_run(tiny_lm):
    """Cancelled with a step of it in flight: that step's tokens are dropped, the others'
    requests are untouched, and its pages come back (`run` checks)."""
    a, b = prompts(10, [6, 9])
    arrivals = [Arrival(a, 20), Arrival(b, 20, cancel_after=6)]
    on = run(tiny_lm, SA, arrivals, overlap=True)
    full = run(tiny_lm, SA, [Arrival(a, 20), Arrival(b, 20)], overlap=False)
    assert on.chained > 0 and on.discarded == 1 and on.reasons == ["length", "cancelled"]
    assert on.outputs[0] == full.outputs[0]
    assert on.outputs[1] == full.outputs[1][:len(on.outputs[1])]


def test_the_global_pool(tiny_lm, echo):
    """Only the outputs are compared: a row whose request stopped extends its retained automaton
    once more in the discarded step, which may change what the pool drafts (never what is
    committed)."""
    spec = dataclasses.replace(SA, enable_global_pool=True)
    prompt, output, _ = echo
    stop = output[_new_tokens(output, after=4)[0]]
    arrivals = [Arrival(prompt, 24, stop=stop), Arrival(prompt[:9], 20)]
    on = run(tiny_lm, spec, arrivals, overlap=True)
    off = run(tiny_lm, spec, arrivals, overlap=False)
    plain = run(tiny_lm, None, arrivals, overlap=False)
    assert on.chained > 0 and on.discarded == 1 and on.reasons[0] == "stop"
    assert on.outputs == off.outputs == plain.outputs


@pytest.mark.parametrize("spec", [None, SA], ids=["plain", "sa"])
def test_sampling_stays_exact(tiny_lm, spec):
    """Each token is sampled with a key of its request's seed and its position, which a chained
    step takes from the device like its lengths."""
    arrivals = [Arrival(prompts(7, [5])[0], 20, temperature=0.8)]
    on = run(tiny_lm, spec, arrivals, overlap=True)
    off = run(tiny_lm, spec, arrivals, overlap=False)
    assert on.chained > 0
    assert on.outputs == off.outputs and on.counts == off.counts


def test_a_stopped_requests_slot_is_reused_after_its_discarded_step(tiny_lm, echo):
    """Four rows, automaton slots for four: the fifth request waits for the first to stop, then
    takes its row, its pages and its automaton slot, which the step dispatched after the stop
    still extends. The device runs that step first, and the newcomer's automaton overwrites the
    slot whole."""
    prompt, output, _ = echo
    cut = _new_tokens(output, after=4)[0]
    others = prompts(8, [6, 9, 4, 11])
    arrivals = [Arrival(prompt, 24, stop=output[cut]),
                *(Arrival(p, 20) for p in others[:3]), Arrival(others[3], 12)]
    on, _ = assert_overlap_changes_nothing(tiny_lm, SA, arrivals)
    assert on.executor.slots.num_slots == CONFIG.max_batch_size and on.discarded == 1
    assert on.slots[4] == on.slots[0] and len(set(on.slots[:4])) == 4
    assert on.outputs[0] == output[:cut + 1]


@pytest.mark.parametrize("spec", [
    js.NGramConfig(max_draft_len=K),
    dataclasses.replace(SA, acceptance_rate_window_size=2, acceptance_rate_threshold=0.3),
], ids=["host_drafts", "acceptance_gate"])
def test_decisions_from_each_steps_outputs_keep_the_host_in_step(tiny_lm, spec):
    """Host drafts and the acceptance gate need the last step's outputs before the next step is
    planned: nothing overlaps."""
    arrivals = [Arrival(p, 16) for p in prompts(12, [6, 9])]
    on = run(tiny_lm, spec, arrivals, overlap=True)
    assert on.chained == 0
    assert on.outputs == run(tiny_lm, None, arrivals, overlap=False).outputs


def test_chained_steps_run_the_unchained_program(tiny_lm):
    """Plain decoding at batch 1 compiles one step program, which its chained steps run too; a
    second executor compiles nothing."""
    config = dataclasses.replace(CONFIG, page_size=8)        # shapes no other test compiled
    (prompt,) = prompts(9, [5])
    before = step_lib.trace_count("step")
    first = run(tiny_lm, None, [Arrival(prompt, 20)], overlap=True, config=config)
    assert first.chained > 0
    assert step_lib.trace_count("step") - before == 1
    run(tiny_lm, None, [Arrival(prompt, 20)], overlap=True, config=config)
    assert step_lib.trace_count("step") - before == 1


def test_a_step_is_read_in_one_transfer(tiny_lm, monkeypatch):
    executor = executor_lib.Executor(tiny_lm, scheduler_config=CONFIG, spec=SA, overlap=False)
    executor.add_request(prompts(11, [6])[0], requests_lib.SamplingParams(max_new_tokens=8),
                         frozenset())
    executor.step()                                   # the prefill
    executor.step()                                   # priming the automaton, the first step
    reads = []
    device_get = jax.device_get
    monkeypatch.setattr(jax, "device_get", lambda tree: (reads.append(tree), device_get(tree))[1])
    (event,) = executor.step()
    assert len(reads) == 1 and isinstance(reads[0], step_lib.StepOutputs)
    assert len(event.tokens) >= 1
