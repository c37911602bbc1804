"""Choosing the draft width: expected tokens per second, rows that do not pay, plain fallback."""

import numpy as np

from jaxspec.host import adaptive


def test_widths():
    assert adaptive.widths_up_to(5) == (0, 1, 2, 3, 4, 5)
    assert adaptive.widths_up_to(16) == (0, 1, 2, 3, 4, 6, 8, 12, 16)
    assert adaptive.widths_up_to(10) == (0, 1, 2, 3, 4, 6, 8, 10)
    assert adaptive.widths_up_to(1) == (0, 1)


def _curve(p, n=8):
    """E(L) for a constant per-position probability p."""
    return np.concatenate([[0.0], np.cumsum(np.cumprod(np.full(n, p)))])


def test_certain_drafts_go_as_far_as_they_reach():
    widths = (0, 1, 2, 4, 8)
    seconds = 1 + 0.1 * np.asarray(widths)
    choice = adaptive.choose(widths, seconds, [_curve(1.0)], [8])
    assert choice.k == 8 and choice.lens.tolist() == [8]
    assert choice.expected_tokens == 9.0
    # ...but never past the real draft.
    choice = adaptive.choose(widths, seconds, [_curve(1.0)], [3])
    assert choice.k == 2 or choice.k == 4
    assert choice.lens.tolist() == [min(choice.k, 3)]


def test_hopeless_drafts_run_plain():
    widths = (0, 1, 2, 4, 8)
    seconds = 1 + 0.1 * np.asarray(widths)
    choice = adaptive.choose(widths, seconds, [_curve(0.05), _curve(0.02)], [8, 8])
    assert choice.k == 0 and choice.lens.tolist() == [0, 0]
    assert choice.expected_tokens == 2.0


def test_a_row_that_does_not_pay_gets_no_draft():
    widths = (0, 1, 2, 4)
    seconds = 1 + 0.2 * np.asarray(widths)
    choice = adaptive.choose(widths, seconds, [_curve(0.95), _curve(0.05)], [8, 8])
    assert choice.k > 0
    assert choice.lens[0] == min(choice.k, 8) and choice.lens[1] == 0


def test_expensive_positions_shorten_the_draft():
    widths = (0, 1, 2, 4, 8)
    cheap = adaptive.choose(widths, 1 + 0.05 * np.asarray(widths), [_curve(0.8)], [8])
    dear = adaptive.choose(widths, 1 + 0.5 * np.asarray(widths), [_curve(0.8)], [8])
    assert dear.k < cheap.k
