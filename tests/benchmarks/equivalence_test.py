"""The greedy-equivalence report: divergences found, placed in their verify window, and judged."""

import pytest

from benchmarks import equivalence
from jaxspec import engine as engine_lib
from tests.helpers import random_prompts


def _gen(tokens, top2, windows):
    return engine_lib.Generation(token_ids=tokens, text=None, finish_reason="length", stats={},
                                 top2=top2, windows=windows)


def test_identical_outputs_have_no_divergence():
    g = _gen([1, 2], [(5.0, 1.0), (4.0, 2.0)], [(0, 0, 0), (1, 0, 0)])
    assert equivalence.first_divergence(g, g, "float32") is None


def test_a_near_tie_is_a_numerics_tie_and_a_confident_split_is_a_bug():
    plain = _gen([1, 2, 3, 4], [(9.0, 1.0), (8.0, 7.0), (10.0, 9.99), (5.0, 0.0)],
                 [(0, 0, 0), (1, 0, 0), (2, 0, 0), (3, 0, 0)])
    spec = _gen([1, 2, 7, 4], [(9.0, 1.0), (8.01, 7.0), (10.001, 9.999), (5.0, 0.0)],
                [(0, 0, 0), (1, 0, 4), (1, 1, 4), (1, 2, 4)])
    d = equivalence.first_divergence(plain, spec, "bfloat16")
    assert (d.position, d.plain_token, d.spec_token) == (2, 3, 7)
    assert d.window == (1, 1, 4) and d.source == "verify K=4, position 1"
    assert d.noise == pytest.approx(0.01)
    assert d.verdict == "numerics tie"
    assert d.tolerance == pytest.approx(equivalence.TIE_ULPS * 2**-7 * 10.001)
    confident = _gen([1, 2, 7, 4], [(9.0, 1.0), (8.0, 7.0), (10.0, 2.0), (5.0, 0.0)],
                     spec.windows)
    assert equivalence.first_divergence(plain, confident, "bfloat16").verdict == "bug"
    # The same margins are far beyond float32's rounding: a bug there.
    assert equivalence.first_divergence(plain, spec, "float32").verdict == "bug"


def test_a_shorter_output_diverges_where_it_ends():
    plain = _gen([1, 2, 3], [(2.0, 1.0)] * 3, [(0, 0, 0), (1, 0, 0), (2, 0, 0)])
    spec = _gen([1, 2], [(2.0, 1.0)] * 2, [(0, 0, 0), (1, 0, 2)])
    assert equivalence.first_divergence(plain, spec, "float32").position == 1


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", pytest.param("bfloat16", marks=pytest.mark.extended)])
def test_tiny_model_report(tiny_lm, dtype):
    """float32 speculation is token-identical; in bfloat16 whatever diverges is a numerics tie."""
    prompts = random_prompts(4, [9, 13, 7], alphabet_size=4)
    reports = equivalence.compare(tiny_lm, None, prompts, methods=("sa", "ngram"), dtype=dtype,
                                  max_new_tokens=24, batch_size=2)
    assert [r["method"] for r in reports] == ["sa", "ngram"]
    for report in reports:
        assert report["requests"] == 3 and report["bugs"] == 0
        assert report["plain_tokens_per_s"] > 0 and report["tokens_per_s"] > 0
        if dtype == "float32":
            assert report["identical"] == 3
    text = equivalence.markdown("tiny", reports)
    assert f"| sa | {dtype} |" in text and f"| ngram | {dtype} |" in text


def test_dtype_speeds_line():
    reports = [dict(method="sa", dtype=d, plain_tokens_per_s=p, tokens_per_s=t, requests=1,
                    identical=1, median_first_divergence=None, ties=0, bugs=0, rows=[])
               for d, p, t in (("float32", 20.0, 40.0), ("bfloat16", 10.0, 30.0))]
    assert "plain 0.50x, sa 0.75x." in equivalence.markdown("w", reports)


def test_main_rejects_unknown_names():
    with pytest.raises(ValueError, match="unknown methods"):
        equivalence.main(["--methods", "sa,bogus"])


def test_teacher_forced_reports_judge_every_flip(tiny_lm):
    """The tiny model, then the benchmark's model (the tiny one again here), in each dtype; the
    counts add up and any flip carries a verdict."""
    prompts = random_prompts(5, [8, 12])
    reports = equivalence.teacher_forced_reports(tiny_lm, prompts, dtypes=("float32",), k=2,
                                                 max_new_tokens=6, model_name="tiny again",
                                                 tiny_prompts=1)
    assert [(r["model"], r["dtype"], r["totals"]["prompts"]) for r in reports] == [
        ("tiny", "float32", 1), ("tiny again", "float32", 2)]
    for r in reports:
        assert r["totals"]["positions"] == 6 * r["totals"]["prompts"]
        flips = [f for row in r["prompts"] for f in row["flips"]]
        assert r["totals"]["bugs"] == sum(f["verdict"] == "bug" for f in flips)
    text = equivalence.markdown("w", [], reports)
    assert "| tiny again | float32 | fast | 2 | 12 |" in text


def test_teacher_forced_flips_are_listed_with_verdicts():
    flip = dict(position=3, window=[1, 0], plain_token=1, verify_token=2, plain_top=10.0,
                plain_margin=1e-6, verify_margin=1e-6, tolerance=1e-5, verdict="numerics tie")
    report = dict(model="m", dtype="float32", numerics="fast", k=2, prompts=[dict(flips=[flip])],
                  totals=dict(positions=6, not_bitwise_equal=6, max_abs_diff=2e-6,
                              max_abs_diff_by_window_index=[1e-6, 2e-6, 0.0], argmax_flips=1,
                              min_flip_margin=1e-6, bugs=0))
    text = equivalence.markdown("w", [], [report])
    assert "| m | float32 | fast | 2 | 6 | 6 | 2e-06 | 1e-06 / 2e-06 / 0 | 1 | 1e-06 |" in text
    assert "| m | float32 | 0 | 3 | 1, 0 | 1e-06 | 1e-05 | numerics tie |" in text
