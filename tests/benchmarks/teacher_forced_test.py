"""The teacher-forced divergence report: every generated position computed by a plain step and by
a verify step over the same tokens, positions counted exactly, and differences found where they
are planted."""

import numpy as np
import pytest

from benchmarks import teacher_forced
from jaxspec.device import step as step_lib
from jaxspec.models import precision
from tests.helpers import random_prompts

PROMPTS = random_prompts(3, [9, 14])
# One K, length and prefill width for every test: one compilation of each entry point.
K, N, WIDTH = 2, 10, teacher_forced.PREFILL_BUCKET


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_every_generated_position_is_compared_once(tiny_lm, uncached_greedy, dtype):
    model = precision.cast(tiny_lm, dtype)
    k, n = K, N
    report = teacher_forced.teacher_forced(model, PROMPTS, k=k, max_new_tokens=n)
    assert (report["k"], report["numerics"], report["dtype"]) == (k, "fast", dtype)
    for prompt, row in zip(PROMPTS, report["prompts"], strict=True):
        assert row["prompt_tokens"] == len(prompt)
        assert row["positions"] == n and len(row["tokens"]) == n + 1
        assert row["verify_steps"] == 4                      # windows 0-2, 3-5, 6-8, 9 (padded)
        assert len(row["max_abs_diff_per_position"]) == len(row["bitwise_equal"]) == n
        assert row["not_bitwise_equal"] == n - sum(row["bitwise_equal"])
        assert row["argmax_flips"] == len(row["flips"])
        if dtype == "float32":
            assert row["tokens"] == uncached_greedy(model, prompt, n + 1)
    totals = report["totals"]
    assert (totals["prompts"], totals["positions"], totals["verify_steps"]) == (2, 2 * n, 8)
    assert totals["not_bitwise_equal"] == sum(r["not_bitwise_equal"] for r in report["prompts"])
    assert len(totals["max_abs_diff_by_window_index"]) == k + 1


def test_both_runs_compute_the_models_logits(tiny_lm, forward):
    """Plain and verify logits at position i are the model's logits after generated token i
    (a whole uncached forward over prompt + generated tokens agrees up to rounding)."""
    prompt = PROMPTS[1]
    tokens, plain, verify = teacher_forced.logits(tiny_lm, prompt, k=K, max_new_tokens=N,
                                                  prefill_width=WIDTH)
    full = forward(tiny_lm, [prompt + tokens[:-1]])[0, len(prompt):]
    np.testing.assert_allclose(plain, full, atol=1e-5)
    np.testing.assert_allclose(verify, full, atol=1e-5)
    np.testing.assert_array_equal(np.argmax(plain, axis=-1), tokens[1:])


def test_a_planted_verify_difference_is_found(tiny_lm, monkeypatch):
    """Verify steps whose row 1 favours token 5 by 100: every position in row 1 of a window
    differs by about 100, flips to 5 (unless plain chose 5), with plain's own margin there."""
    k, n, bump, token = K, N, 100.0, 5
    step = step_lib.step

    def planted(params, state, inputs, *, cfg):
        state, out = step(params, state, inputs, cfg=cfg)
        if cfg.k:
            out = out.replace(logits=out.logits.at[:, 1, token].add(bump))
        return state, out

    monkeypatch.setattr(step_lib, "step", planted)
    tokens, plain, verify = teacher_forced.logits(tiny_lm, PROMPTS[0], k=k, max_new_tokens=n,
                                                  prefill_width=WIDTH)
    report = teacher_forced.compare(plain, verify, k=k)
    in_row_1 = [p for p in range(n) if p % (k + 1) == 1]                 # 1, 4, 7
    assert report["max_abs_diff"] == pytest.approx(bump, abs=1e-3)
    assert report["max_abs_diff_by_window_index"][1] == pytest.approx(bump, abs=1e-3)
    assert max(report["max_abs_diff_by_window_index"][::2]) < 1e-3
    flipped = [p for p in in_row_1 if tokens[p + 1] != token]
    assert [f["position"] for f in report["flips"]] == flipped and flipped
    for f in report["flips"]:
        top2 = np.sort(plain[f["position"]])[-2:]
        assert f["window"] == [f["position"] // (k + 1), 1]
        assert (f["plain_token"], f["verify_token"]) == (tokens[f["position"] + 1], token)
        assert f["plain_margin"] == float(top2[1] - top2[0])


def test_compare_counts_from_the_logits():
    """Hand-made logits, K=1 (windows of 2 positions): -0.0 against 0.0 is equal in value but
    not bitwise, a flip is reported with both margins."""
    plain = np.asarray([[3.0, 1.0, 0.0], [2.0, 2.5, 0.0], [1.0, 0.0, 0.0], [0.0, 4.0, 1.0],
                        [5.0, 0.0, 0.0]], np.float32)
    verify = plain.copy()
    verify[1, 0] = 2.75                     # position 1 flips: 2.75 > 2.5
    verify[2, 1] = -0.0                     # position 2: same value, other bits
    verify[3, 2] = 1.5                      # position 3: a difference, no flip
    report = teacher_forced.compare(plain, verify, k=1)
    assert (report["positions"], report["verify_steps"]) == (5, 3)
    assert report["bitwise_equal"] == [True, False, False, False, True]
    assert report["not_bitwise_equal"] == 3
    assert report["max_abs_diff"] == 0.75
    assert report["max_abs_diff_per_position"] == [0.0, 0.75, 0.0, 0.5, 0.0]
    assert report["max_abs_diff_by_window_index"] == [0.0, 0.75]
    assert report["flips"] == [dict(position=1, window=[0, 1], plain_token=1, verify_token=0,
                                    plain_top=2.5, plain_margin=0.5, verify_margin=0.25)]
    assert report["min_plain_margin"] == 0.5
    with pytest.raises(ValueError, match="two equal"):
        teacher_forced.compare(plain, verify[:4], k=1)


def test_bad_arguments(tiny_lm):
    with pytest.raises(ValueError, match="k and max_new_tokens"):
        teacher_forced.teacher_forced(tiny_lm, PROMPTS, k=0, max_new_tokens=4)
    with pytest.raises(ValueError, match="prompt"):
        teacher_forced.teacher_forced(tiny_lm, [], k=2, max_new_tokens=4)
    with pytest.raises(ValueError, match="numerics"):
        teacher_forced.teacher_forced(tiny_lm, PROMPTS, k=2, max_new_tokens=4, numerics="slow")
