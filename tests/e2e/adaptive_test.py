"""Adaptive K on the tiny model: only compiled widths run, a width the control plane wants
compiles in the background while the request goes on with what is compiled, and outputs stay
greedy (issue 32)."""

import threading

import numpy as np

import jaxspec as js
from jaxspec import engine as engine_lib
from jaxspec.device import step as step_lib
from jaxspec.host import compiles
from jaxspec.host import cost_model as cost_model_lib
from jaxspec.host import requests as requests_lib
from jaxspec.host import rest as rest_lib
from jaxspec.host import scheduler as scheduler_lib
from tests.helpers import random_prompts

CONFIG = scheduler_lib.SchedulerConfig(max_batch_size=4, max_seq_len=96, page_size=16,
                                       max_num_tokens=256, prefill_chunk=32)


def _engine(model, spec="auto", ledger=None):
    engine = engine_lib.Engine(model, spec=spec, scheduler=CONFIG,
                               cost_model=cost_model_lib.StepCostModel())
    engine.executor.compiles = ledger or compiles.CompileLedger()
    return engine


class HeldLedger(compiles.CompileLedger):
    """Background compiles wait for `release`; `in_iteration` lists the programs an iteration
    had to compile itself."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.release = threading.Event()
        self.in_iteration = []

    def _compile(self, build):
        if threading.current_thread() is not threading.main_thread():
            assert self.release.wait(60)
        return super()._compile(build)

    def get(self, key, build):
        if not self.ready(key) and not self.pending(key):
            self.in_iteration.append(key)
        return super().get(key, build)


def _first_request_programs(executor, ledger, widths=(0, 5)):
    """What a process's first request compiled: the plain step and the start width, 1 row."""
    for k in widths:
        ledger.get(*executor._program(k, (), 1))
    ledger.in_iteration.clear()


def test_adaptive_k_uses_compiled_widths_and_learns(tiny_lm, uncached_greedy):
    spec = js.SAConfig(max_draft_len=8, adaptive=True, min_match_len=1)
    engine = _engine(tiny_lm, spec)
    prompts = random_prompts(9, [10, 14], alphabet_size=3)
    with engine.executor.compiles.eager():
        out = engine.generate_batch(prompts, max_new_tokens=40)
    for p, g in zip(prompts, out.generations, strict=True):
        assert g.token_ids == uncached_greedy(tiny_lm, p, 40)
    executor = engine.executor
    assert executor.widths == (0, 1, 2, 3, 4, 6, 8)
    assert set(executor.stats.k_history) <= set(executor.widths)
    assert executor.costs.table(), "steps that compiled nothing were measured"
    assert executor.predictor.reached.sum() > 0, "verified rows were learned"


def test_a_wanted_width_compiles_in_the_background_and_runs_once_ready(tiny_lm, uncached_greedy):
    """Mid-request the planner asks for widths it has not got; the request goes on with the
    compiled ones (nothing compiles inside an iteration), and once the compiles are released
    the new widths run. The output is plain greedy decoding's throughout."""
    ledger = HeldLedger()
    executor = _engine(tiny_lm, ledger=ledger).executor
    _first_request_programs(executor, ledger)
    prompt = random_prompts(3, [14], alphabet_size=2)[0]
    rid = executor.add_request(prompt, requests_lib.SamplingParams(max_new_tokens=80),
                               frozenset())
    done, held, released_at = {}, set(), None
    while executor.has_work():
        done.update((e.request_id, e.result) for e in executor.step() if e.finished)
        pending = {key for key in list(ledger._pending) if ledger.pending(key)}
        if released_at is None and pending:
            held = {cfg.k for cfg, _, _ in pending}
            released_at = len(executor.stats.k_history) + 3
        if released_at is not None and len(executor.stats.k_history) == released_at:
            ledger.release.set()
            ledger.wait()
    assert done[rid].output == uncached_greedy(tiny_lm, prompt, 80)
    assert ledger.in_iteration == [], "an iteration waited for a compile"
    assert held, "the planner asked for a width it had not got"
    history = executor.stats.k_history
    assert set(history[:released_at]) <= {0, 5}, "only compiled widths ran while held"
    assert set(history[released_at:]) & held, (history, held)


def test_no_step_waits_for_a_slow_compile(tiny_lm, uncached_greedy):
    """With every compile taking 3 s, a request whose planner asks for new widths finishes with
    no iteration as long as one compile (and its output unchanged). The bound is the compile's
    own length, not a step's: a loaded machine slows the tiny model's steps well past a second."""
    delay = 3.0
    ledger = HeldLedger(delay=delay)
    ledger.release.set()
    executor = _engine(tiny_lm, ledger=ledger).executor
    _first_request_programs(executor, ledger)
    prompt = random_prompts(3, [14], alphabet_size=2)[0]
    rid = executor.add_request(prompt, requests_lib.SamplingParams(max_new_tokens=80),
                               frozenset())
    done = executor.run()
    assert done[rid].output == uncached_greedy(tiny_lm, prompt, 80)
    assert ledger.in_iteration == []
    assert ledger._pending, "the request asked for widths"
    assert max(seconds for _, seconds in executor.stats.decode_iterations) < delay
    ledger.wait()


def test_warmup_compiles_the_schedules_programs_in_the_background(tiny_lm, uncached_greedy):
    ledger = compiles.CompileLedger()
    engine = engine_lib.Engine(tiny_lm, spec=js.SAConfig(max_draft_len=4), scheduler=CONFIG)
    engine.executor.compiles = ledger
    engine.executor.warmup()
    ledger.wait()
    executor = engine.executor
    for rows in executor.batch_buckets:
        for k in (0, 4):
            assert ledger.ready(executor._program(k, (), rows)[0]), (k, rows)
    assert ledger.compiled_in_background == 2 * len(executor.batch_buckets)
    prompt = random_prompts(4, [12], alphabet_size=3)[0]
    traces = step_lib.trace_count("step")
    out = engine.generate(prompt, max_new_tokens=24)
    assert out.token_ids == uncached_greedy(tiny_lm, prompt, 24)
    assert step_lib.trace_count("step") == traces, "a step compiled inside the request"


def test_a_batch_whose_automata_all_rest_steps_without_them(tiny_lm, uncached_greedy,
                                                            monkeypatch):
    """Drafts that never pay (verify steps priced far above plain ones): the requests' automata
    rest, and then the plain steps leave the automata alone (a program without them) and chain,
    the host one step behind as in plain decoding, with the output unchanged and the automata
    woken up exact."""
    monkeypatch.setattr(rest_lib, "REST_AFTER", 2)
    costs = cost_model_lib.StepCostModel()
    for k in range(0, 17):
        for _ in range(cost_model_lib.MIN_SAMPLES):
            costs.observe(1, k, 1, 1.0 + 100.0 * k)
    engine = engine_lib.Engine(tiny_lm, spec="auto", scheduler=CONFIG, cost_model=costs)
    executor = engine.executor
    executor.compiles = compiles.CompileLedger()
    dispatched = []
    dispatch = executor._dispatch

    def spy(plan, previous=None):
        dispatched.append((plan.bare, previous is not None))
        assert not (plan.k and previous is not None), "a verify step chained"
        return dispatch(plan, previous)

    monkeypatch.setattr(executor, "_dispatch", spy)
    prompt = random_prompts(5, [14], alphabet_size=2)[0]
    with executor.compiles.eager():
        out = engine.generate(prompt, max_new_tokens=48)
    assert out.token_ids == uncached_greedy(tiny_lm, prompt, 48)
    assert (True, False) in dispatched, "no step ran without the automata"
    assert (True, True) in dispatched, "no bare step chained"
    assert not all(bare for bare, _ in dispatched)
    # A stop token read one step behind, in a rest: the step dispatched after it is discarded.
    prompt = random_prompts(0, [14], alphabet_size=3)[0]
    free = uncached_greedy(tiny_lm, prompt, 48)
    cut = 46                                          # its token's first occurrence
    assert free[cut] not in free[:cut]
    dispatched.clear()
    params = js.SamplingParams(max_new_tokens=48, stop_token_ids=(free[cut],))
    with executor.compiles.eager():
        out = engine.generate(prompt, params=params)
    assert out.token_ids == free[:cut + 1] and out.finish_reason == "stop"
    assert dispatched[-1] == (True, True)


def test_resting_batches_chain_while_their_bare_program_compiles(tiny_lm, uncached_greedy,
                                                                 monkeypatch):
    """The program without the automata held back (never compiled): a batch whose automata all
    rest chains its plain steps all the same, on the plain program, the host one step behind,
    with the output unchanged."""
    monkeypatch.setattr(rest_lib, "REST_AFTER", 2)
    engine = engine_lib.Engine(tiny_lm, spec="auto", scheduler=CONFIG, cost_model=_Priced(100.0))
    executor = engine.executor
    executor.compiles = ledger = compiles.CompileLedger()
    bare = {executor._program(0, (), rows, bare=True)[0] for rows in executor.batch_buckets}
    request = ledger.request
    monkeypatch.setattr(ledger, "request",
                        lambda key, build: None if key in bare else request(key, build))
    dispatched = []
    dispatch = executor._dispatch

    def spy(plan, previous=None):
        resting = all(map(executor._resting, plan.requests))
        dispatched.append((resting, plan.bare, previous is not None))
        return dispatch(plan, previous)

    monkeypatch.setattr(executor, "_dispatch", spy)
    prompt = random_prompts(5, [14], alphabet_size=2)[0]
    with ledger.eager():
        out = engine.generate(prompt, max_new_tokens=48)
    assert out.token_ids == uncached_greedy(tiny_lm, prompt, 48)
    assert not any(b for _, b, _ in dispatched) and not any(map(ledger.ready, bare))
    assert (True, False, True) in dispatched, "no resting step chained"


def test_verified_drafts_that_do_not_pay_rest_the_automaton(tiny_lm, uncached_greedy,
                                                           monkeypatch):
    """Every awake step verifies the drafts its automaton found (the width forced to the
    schedule's). Priced so that no number of accepted tokens pays for a verify step, the
    request rests after `REST_AFTER` steps, verified or not (counting verified drafts as paid,
    it rested only after `REST_AFTER` steps without one); priced as a plain step, every draft
    the target accepted pays and the automaton stays awake."""
    monkeypatch.setattr(rest_lib, "REST_AFTER", 3)
    prompt = random_prompts(5, [14], alphabet_size=2)[0]

    def run(verify_cost):
        engine = engine_lib.Engine(tiny_lm, spec="auto", scheduler=CONFIG,
                                   cost_model=_Priced(verify_cost))
        executor = engine.executor
        executor.compiles = compiles.CompileLedger()
        monkeypatch.setattr(executor.planner, "choose",
                            lambda program, rows, k, lens, matches, **_: (k, np.minimum(lens, k)))
        steps = []                      # (resting, verified rows) per dispatched step
        dispatch = executor._dispatch

        def spy(plan, previous=None):
            steps.append((all(map(executor._resting, plan.requests)), int(plan.draft_lens[0])))
            return dispatch(plan, previous)

        monkeypatch.setattr(executor, "_dispatch", spy)
        with executor.compiles.eager():
            out = engine.generate(prompt, max_new_tokens=48)
        assert out.token_ids == uncached_greedy(tiny_lm, prompt, 48)
        return steps

    dear = run(100.0)
    first = next(i for i, (resting, _) in enumerate(dear) if resting)
    assert any(n for _, n in dear[first - rest_lib.REST_AFTER:first]), dear
    cheap = run(0.0)
    assert sum(n > 0 for _, n in cheap) > rest_lib.REST_AFTER
    assert not any(resting for resting, _ in cheap), cheap


class _Priced(cost_model_lib.StepCostModel):
    """Every width timed already: a plain step 1 s, a verify position `verify_cost` s more.
    What the steps measure is kept in `seen` (rows, k, context, seconds), not learned."""

    def __init__(self, verify_cost: float):
        super().__init__()
        for k in range(0, 17):
            for _ in range(cost_model_lib.MIN_SAMPLES):
                super().observe(1, k, 1, 1.0 + verify_cost * k)
        self.seen = []

    def observe(self, *args):
        self.seen.append(args)


def test_plain_steps_of_awake_automata_chain(tiny_lm, uncached_greedy, monkeypatch):
    """Drafts that never pay and automata not resting yet: the plain steps chain with the
    automata extended inside them, the host one step behind, and the output is unchanged,
    also where a stop token ends the request inside a chain. With verify steps cheap, the
    chain ends where the last read step left a draft: verify steps follow chained plain ones."""
    monkeypatch.setattr(rest_lib, "REST_AFTER", 10**6)
    dispatched, costs = [], []

    def run(verify_cost, prompt, params):
        costs.append(_Priced(verify_cost))
        engine = engine_lib.Engine(tiny_lm, spec="auto", scheduler=CONFIG, cost_model=costs[-1])
        executor = engine.executor
        executor.compiles = compiles.CompileLedger()
        dispatch = executor._dispatch

        def spy(plan, previous=None):
            dispatched.append((plan.k, plan.bare, previous is not None))
            assert not (plan.k and previous is not None), "a verify step chained"
            return dispatch(plan, previous)

        monkeypatch.setattr(executor, "_dispatch", spy)
        with executor.compiles.eager():
            return engine.generate(prompt, params=params)

    prompt = random_prompts(5, [14], alphabet_size=2)[0]
    out = run(100.0, prompt, js.SamplingParams(max_new_tokens=48))
    assert out.token_ids == uncached_greedy(tiny_lm, prompt, 48)
    assert (0, False, True) in dispatched, "no plain step chained with its automata"
    assert out.stats["drafted"] <= 2 * 5, "drafts verified past the start steps"
    # Chained steps are timed too (from the arrival of the step before): all but the first
    # call of their program.
    plain = [seconds for _, k, _, seconds in costs[-1].seen if k == 0]
    assert len(plain) >= dispatched.count((0, False, True)) - 1 and min(plain) > 0
    # A stop token read one step behind: the chained step dispatched after it is discarded.
    prompt = random_prompts(0, [14], alphabet_size=3)[0]
    free = uncached_greedy(tiny_lm, prompt, 48)
    cut = 46                                          # its token's first occurrence
    assert free[cut] not in free[:cut]
    dispatched.clear()
    out = run(100.0, prompt, js.SamplingParams(max_new_tokens=48, stop_token_ids=(free[cut],)))
    assert out.token_ids == free[:cut + 1] and out.finish_reason == "stop"
    assert dispatched[-1] == (0, False, True)
    # Cheap verify steps: the drafts the automata find are verified, between chained plain steps.
    dispatched.clear()
    prompt = random_prompts(7, [14], alphabet_size=2)[0]
    out = run(0.001, prompt, js.SamplingParams(max_new_tokens=48))
    assert out.token_ids == uncached_greedy(tiny_lm, prompt, 48)
    widths = [k for k, _, _ in dispatched]
    assert out.stats["accepted"] > 0 and any(widths[2:]), "no verify step after the start"
    assert (0, False, True) in dispatched, "no plain step chained"
