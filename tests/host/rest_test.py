"""A request's rests (`jaxspec.host.rest.Rest`): when they start and how long they last, against
the rules in the module docstring replayed over random histories."""

import hypothesis
from hypothesis import strategies as st

from jaxspec.host import rest as rest_lib


def test_first_rest_after_rest_after_idle_steps_then_rechecks_sooner():
    rest = rest_lib.Rest()
    assert [rest.planned(drafted=False) for _ in range(rest_lib.REST_AFTER)] == (
        [False] * (rest_lib.REST_AFTER - 1) + [True])
    assert rest.resting
    assert [rest.tick() for _ in range(rest_lib.FIRST_WAIT)] == (
        [False] * (rest_lib.FIRST_WAIT - 1) + [True])
    assert not rest.resting
    assert [rest.planned(drafted=False) for _ in range(rest_lib.RECHECK_AFTER)] == (
        [False] * (rest_lib.RECHECK_AFTER - 1) + [True])
    ticks = 1
    while not rest.tick():
        ticks += 1
    assert ticks == 2 * rest_lib.FIRST_WAIT


def test_a_verified_draft_starts_over():
    rest = rest_lib.Rest()
    for _ in range(rest_lib.REST_AFTER - 1):
        assert not rest.planned(drafted=False)
    assert not rest.planned(drafted=True)
    for _ in range(rest_lib.REST_AFTER - 1):
        assert not rest.planned(drafted=False)
    assert rest.planned(drafted=False)


@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.given(st.lists(st.integers(0, 19).map(lambda x: x == 0), max_size=400))
def test_rests_follow_the_rules(drafted):
    """Drive a Rest with `drafted` as its awake steps' outcomes (one in 20 drafted: idle runs
    reach every rest length),
    ticking every rest to its end; then check every rest's start and length from the history."""
    rest = rest_lib.Rest()
    history = []                      # ("draft" | "idle", rested now) and ("rest", ticks)
    for d in drafted:
        due = rest.due
        started = rest.planned(drafted=d)
        assert started == (due and not d), "`due` foretells the rest an idle step starts"
        history.append(("draft" if d else "idle", started))
        if started:
            ticks = 1
            while not rest.tick():
                ticks += 1
            history.append(("rest", ticks))
    rests_since_draft, idle = 0, 0
    for event, value in history:
        if event == "rest":
            rests_since_draft += 1
            assert value == min(rest_lib.FIRST_WAIT * 2 ** (rests_since_draft - 1),
                                rest_lib.MAX_WAIT)
            idle = 0
            continue
        if event == "draft":
            rests_since_draft, idle = 0, 0
            assert not value
            continue
        idle += 1
        due = rest_lib.RECHECK_AFTER if rests_since_draft else rest_lib.REST_AFTER
        assert value == (idle == due), (idle, due)
