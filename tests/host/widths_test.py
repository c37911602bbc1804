"""Adaptive K's width decisions over compiled programs (`jaxspec.host.widths`), on a scripted
ledger: which width runs, what is asked for in the background, when the plain step is timed."""

import numpy as np

from jaxspec.host import compiles
from jaxspec.host import cost_model as cost_model_lib
from jaxspec.host import widths as widths_lib


def program(k, rows):
    return (k, rows), lambda: f"step k={k} rows={rows}"


def planner(ready=(), costs=None, start=5, max_draft_len=16):
    ledger = compiles.CompileLedger()
    for k in ready:
        ledger.get(*program(k, 1))
    return widths_lib.WidthPlanner(max_draft_len=max_draft_len, start_draft_len=start,
                                   costs=costs or cost_model_lib.StepCostModel(),
                                   compiles=ledger)


def timed(slope=0.05, plain=True):
    """A cost model with every width at 1 row measured: 1 + slope * k (and the plain step)."""
    costs = cost_model_lib.StepCostModel()
    for k in [0] * plain + list(range(1, 17)):
        for _ in range(cost_model_lib.MIN_SAMPLES):
            costs.observe(1, k, 100, 1.0 + slope * k)
    return costs


def choose(p, lens, matches=None, *, starting=False, k=16, left=100):
    lens = np.asarray(lens, np.int32)
    matches = np.asarray(matches if matches is not None else [8] * len(lens), np.int32)
    return p.choose(program, 1, k, lens, matches, context=100, starting=starting, left=left)


def test_a_request_starts_at_the_start_width():
    p = planner(ready=(0, 5, 16), costs=timed())
    k, lens = choose(p, [16], starting=True)
    assert k == 5 and lens.tolist() == [5]
    k, lens = choose(p, [3], starting=True)
    assert k == 5 and lens.tolist() == [3]


def test_start_steps_grow_past_the_start_width_after_full_acceptance():
    p = planner(ready=(0, 2, 5, 8, 12, 16), costs=timed(slope=0.5))
    p.learned(5, [(8, 5, 4)])
    assert choose(p, [16], starting=True)[0] == 5          # not all accepted: the start width
    p.learned(2, [(8, 2, 2)])
    assert choose(p, [16], starting=True)[0] == 5          # a floor of 4 is below the start
    p.learned(5, [(8, 5, 5)])
    assert choose(p, [16], starting=True)[0] >= 10
    assert choose(p, [16], starting=True, left=8)[0] == 5  # too few tokens left to grow into


def test_a_start_width_not_compiled_is_asked_for_and_the_widest_ready_one_below_runs():
    p = planner(ready=(0, 2, 8))
    k, _ = choose(p, [16], starting=True)
    assert k == 2 and p.compiles.pending((5, 1))
    p.compiles.wait()
    assert choose(p, [16], starting=True)[0] == 5


def test_full_acceptance_grows_the_width_geometrically_and_a_rejection_drops_the_floor():
    # Steep costs: the estimate alone would keep the width short.
    p = planner(ready=adaptive_widths(), costs=timed(slope=0.5))
    for _ in range(50):
        p.predictor.observe(8, 2, 0)          # what was learned says long drafts fail
    assert choose(p, [16])[0] <= 2
    p.learned(2, [(8, 2, 2)])
    assert p.floor == 4 and choose(p, [16])[0] >= 4
    p.learned(4, [(8, 4, 4)])
    assert choose(p, [16])[0] >= 8
    p.learned(8, [(8, 8, 8)])
    assert choose(p, [16])[0] == 16
    p.learned(16, [(8, 16, 3)])
    assert p.floor == 0


def test_while_no_width_at_the_floor_is_compiled_the_widest_ready_one_runs():
    p = planner(ready=(0, 2, 5), costs=timed(slope=0.5))
    for _ in range(50):
        p.predictor.observe(8, 2, 0)          # the estimates alone: plain
    assert choose(p, [16])[0] == 0
    p.learned(5, [(8, 5, 5)])
    assert choose(p, [16])[0] == 5
    assert p.compiles.pending((12, 1)) or p.compiles.pending((16, 1))
    p.compiles.wait()
    assert choose(p, [16])[0] >= 10


def test_growth_needs_full_width_drafts_nearly_all_accepted():
    p = planner(ready=adaptive_widths())
    p.learned(4, [(8, 2, 2)])                     # a short draft says nothing of width 4
    assert p.floor == 0
    p.learned(4, [(8, 4, 4), (8, 4, 3)])          # 7 of 8 < 90%
    assert p.floor == 0
    p.learned(4, [(8, 4, 4)] * 9 + [(8, 4, 3)])   # 39 of 40
    assert p.floor == 8


def test_the_floor_stops_at_the_longest_draft_and_at_the_tokens_left():
    p = planner(ready=adaptive_widths(), costs=timed(slope=0.5))
    for _ in range(50):
        p.predictor.observe(8, 2, 0)
    p.floor = 16
    assert choose(p, [6])[0] == 6                 # no longer draft to verify
    assert choose(p, [16], left=10)[0] <= 2       # too few tokens left to grow into


def test_a_preferred_width_not_compiled_compiles_in_the_background_meanwhile_a_ready_one():
    p = planner(ready=(0, 1, 2), costs=timed())
    for _ in range(50):
        p.predictor.observe(8, 16, 16)
    k, _ = choose(p, [16])
    assert k == 2 and p.compiles.pending((16, 1))
    p.compiles.wait()
    assert choose(p, [16])[0] == 16


def test_a_width_is_compiled_only_for_a_gain_worth_a_compile():
    # Drafts rarely right behind 1-token matches: K=1 beats plain by under COMPILE_GAIN.
    p = planner(ready=(0,), costs=timed(slope=0.05))
    for _ in range(200):
        p.predictor.observe(1, 1, 0)
    for _ in range(12):
        p.predictor.observe(1, 1, 1)
    gain = (1 + 12 / 212) / 1.05
    assert 1 < gain < 1 + widths_lib.COMPILE_GAIN
    assert choose(p, [1], [1])[0] == 0 and not p.compiles.pending((1, 1))
    # Drafts behind long matches, believed right: worth compiling a wide width.
    assert choose(p, [16], [32])[0] == 0
    assert [w for w in p.widths if p.compiles.pending((w, 1))] == [12]


def test_with_nothing_compiled_the_choice_compiles_in_the_iteration():
    p = planner(costs=timed())
    k, lens = choose(p, [16])
    assert k > 0 and not p.compiles.pending((k, 1)) and lens.tolist() == [min(16, k)]


def test_the_plain_step_is_timed_only_where_it_could_change_the_decision():
    # Verify widths measured, the plain step never: drafts that are nearly always accepted
    # leave no doubt, and no plain step runs; doubtful ones get the plain step timed.
    sure = planner(ready=adaptive_widths(), costs=timed(plain=False))
    for _ in range(50):
        sure.predictor.observe(8, 16, 16)
    assert choose(sure, [16])[0] == 16
    doubtful = planner(ready=adaptive_widths(), costs=timed(plain=False))
    for _ in range(50):
        doubtful.predictor.observe(8, 4, 0)
        doubtful.predictor.observe(8, 4, 1)
    assert choose(doubtful, [16]) [0] == 0


def test_rows_pad_into_a_compiled_bucket_while_their_own_compiles():
    ledger = compiles.CompileLedger()
    ledger.get(*program(5, 4))
    p = widths_lib.WidthPlanner(max_draft_len=16, start_draft_len=5,
                                costs=cost_model_lib.StepCostModel(), compiles=ledger)
    assert p.rows(program, 1, (1, 2, 4, 8)) == 4 and ledger.pending((5, 1))
    ledger.wait()
    assert p.rows(program, 1, (1, 2, 4, 8)) == 1
    assert p.rows(program, 8, (1, 2, 4, 8)) == 8, "nothing larger compiled: its own"


def test_nothing_to_verify_runs_plain_or_while_it_compiles_the_narrowest_ready_width():
    p = planner(ready=(3, 8))
    assert p.plain_width(program, 1) == 3 and p.compiles.pending((0, 1))
    p.compiles.wait()
    assert p.plain_width(program, 1) == 0


def adaptive_widths():
    return (0, 1, 2, 3, 4, 5, 6, 8, 12, 16)


def test_a_run_where_every_draft_is_accepted_reaches_the_largest_width_within_20_steps():
    """From a fresh planner (priors only, plain and verify steps timed with a steep slope that
    alone would keep drafts short), each step's drafts all accepted."""
    p = planner(ready=adaptive_widths(), costs=timed(slope=0.5))
    history = []
    for step in range(20):
        k, lens = choose(p, [16], [2], starting=step < widths_lib.START_STEPS)
        history.append(k)
        p.learned(k, [(2, int(lens[0]), int(lens[0]))])
    assert history[0] == 5 and history[1] >= widths_lib.GROWTH * 5, history
    assert 16 in history, history
    assert history[history.index(16):] == [16] * (20 - history.index(16))
