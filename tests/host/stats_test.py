"""Acceptance metrics: one count of accepted drafts, windows cut by a stop or the length limit,
and the steady rate apart from the iterations that compiled."""

import pytest

from jaxspec.host import stats as stats_lib


@pytest.mark.parametrize("kept, num_new, accepted", [
    (3, 3, 2),     # two drafts accepted, bonus kept
    (2, 3, 2),     # a stop on the second draft: both drafts kept, the bonus cut
    (1, 3, 1),     # the length limit after the first draft
    (1, 1, 0),     # nothing accepted: the bonus alone
    (1, 6, 1),
])
def test_accepted_drafts(kept, num_new, accepted):
    assert stats_lib.accepted_drafts(kept, num_new) == accepted


def test_a_cut_window_counts_its_drafts_and_its_kept_tokens():
    stats = stats_lib.RunStats()
    # Row 0 drafted 3, all accepted, a stop token cut the bonus: kept 3. Row 1 drafted 2,
    # accepted 1, kept the accepted draft and the bonus.
    stats.record_step(3, draft_lens=[3, 2], accepted=[3, 1], kept=[3, 2], seconds=0.5,
                      draft_seconds=0.1, decide_seconds=0.02)
    assert (stats.drafted, stats.accepted, stats.committed) == (5, 4, 5)
    assert stats.acceptance_rate == 4 / 5
    assert stats.mean_acceptance_length == 5 / 2
    assert stats.acceptance_lengths == {3: 1, 2: 1}
    assert stats.per_position_acceptance() == [1.0, 0.5, 1.0]
    assert (stats.decode_steps, stats.spec_steps, stats.request_steps) == (1, 1, 2)
    summary = stats.summary()
    assert (summary["drafting_overhead_ms_per_step"], summary["decision_overhead_ms_per_step"]) == (
        100.0, 20.0)


def test_plain_decoding_has_acceptance_length_one():
    stats = stats_lib.RunStats()
    stats.record_step(0, draft_lens=[0, 0], accepted=[0, 0], kept=[1, 1], seconds=0.1,
                      draft_seconds=0.0, decide_seconds=0.0)
    assert stats.mean_acceptance_length == 1.0
    assert stats.acceptance_rate is None
    assert stats.spec_steps == 0


def test_steady_rate_leaves_out_compiling_iterations():
    stats = stats_lib.RunStats()
    stats.generated_tokens = 1 + 9
    stats.record_iteration(4.0, tokens=1, compiled=True)
    stats.record_iteration(0.5, tokens=4, compiled=False)
    stats.record_iteration(0.5, tokens=5, compiled=False)
    assert stats.wall_time == 5.0 and stats.first_call_time == 4.0
    assert stats.tokens_per_second == 10 / 5.0
    assert stats.steady_tokens_per_second == 9 / 1.0
    summary = stats.summary()
    assert (summary["steady_tokens_per_s"], summary["first_call_time_s"]) == (9.0, 4.0)


def test_steady_rate_is_unknown_when_every_iteration_compiled():
    stats = stats_lib.RunStats()
    stats.generated_tokens = 3
    stats.record_iteration(2.0, tokens=3, compiled=True)
    assert stats.steady_tokens_per_second is None


def test_the_stall_ratio_compares_each_width_with_itself():
    stats = stats_lib.RunStats()
    for k, seconds in [(0, 1.0), (0, 1.2), (0, 1.1), (16, 4.0), (16, 4.4), (16, 4.2),
                       (8, 9.0), (8, 2.0)]:           # too few steps at 8 to judge
        stats.record_iteration(seconds, tokens=1, compiled=False, decode_k=k)
    stats.record_iteration(50.0, tokens=1, compiled=True)   # a prefill: not a step gap
    assert stats.stall_ratio == pytest.approx(max(1.2 / 1.1, 4.4 / 4.2))
    stats.record_iteration(11.0, tokens=1, compiled=False, decode_k=0)
    assert stats.stall_ratio == pytest.approx(11.0 / 1.15)
    summary = stats.summary()
    assert summary["max_step_gap_ms"] == 11000.0 and summary["stall_ratio"] > 9
