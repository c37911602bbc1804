"""`numerics="exact"`: a verify row is computed bit for bit like a plain row, and a request's
output does not depend on its batch-mates (issue 33). Fast mode makes no such promise: on CPU its
verify logits differ from plain ones in the last bits at every position."""

import numpy as np
import pytest

from benchmarks import gpu_sections
from benchmarks import teacher_forced
import jaxspec as js
from jaxspec.models import precision
from tests.helpers import random_prompts

PROMPTS = random_prompts(5, [11, 23])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_teacher_forced_verify_logits_equal_plain_logits_bitwise(tiny_lm, dtype):
    report = teacher_forced.teacher_forced(precision.cast(tiny_lm, dtype), PROMPTS, k=3,
                                           max_new_tokens=9, numerics="exact")
    totals = report["totals"]
    assert totals["positions"] == 18
    assert (totals["not_bitwise_equal"], totals["max_abs_diff"]) == (0, 0.0)


def test_the_test_can_fail_fast_mode_differs(tiny_lm):
    """The same comparison in fast mode finds differences: the assertion above is not vacuous."""
    report = teacher_forced.teacher_forced(tiny_lm, PROMPTS, k=3, max_new_tokens=9)
    assert report["totals"]["not_bitwise_equal"] > 0


@pytest.mark.extended      # the tiny model's shapes in CI (tests above)
def test_smollm2_shapes_bitwise():
    """SmolLM2-135M's shapes (30 layers, GQA 9/3, 49k vocabulary), random weights, float32 (the
    tiny model covers bfloat16)."""
    model = gpu_sections._model("smollm2")
    prompts = teacher_forced.random_prompts(model.vocab_size, [40])
    report = teacher_forced.teacher_forced(model, prompts, k=4, max_new_tokens=10,
                                           numerics="exact")
    assert report["totals"]["not_bitwise_equal"] == 0


def _generate(model, prompts, *, spec, batch):
    engine = js.Engine(model, None, spec=spec, numerics="exact",
                       scheduler=js.SchedulerConfig(max_batch_size=batch, max_seq_len=128))
    result = engine.generate_batch(prompts, max_new_tokens=16)
    return [g.token_ids for g in result.generations]


def test_a_requests_output_does_not_depend_on_its_batch(tiny_lm):
    """One request alone, then beside seven others of other lengths and contents, plain and
    with the automaton: the same tokens."""
    target = PROMPTS[0] * 2
    others = random_prompts(9, [5, 17, 30, 8, 12, 21, 3])
    alone = _generate(tiny_lm, [target], spec="none", batch=1)[0]
    for spec in ("none", "sa"):
        batched = _generate(tiny_lm, others[:3] + [target] + others[3:], spec=spec, batch=8)
        assert batched[3] == alone, spec


def test_fast_and_exact_agree_up_to_rounding(tiny_lm):
    """Exact mode computes the same function: its logits are fast mode's to float tolerance."""
    _, fast, _ = teacher_forced.logits(tiny_lm, PROMPTS[1], k=2, max_new_tokens=6)
    _, exact, _ = teacher_forced.logits(tiny_lm, PROMPTS[1], k=2, max_new_tokens=6,
                                        numerics="exact")
    np.testing.assert_allclose(exact, fast, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("numerics, match", [("exakt", "numerics must be one of"),
                                             ("exact", "one device")])
def test_bad_numerics_are_refused_before_anything_runs(tiny_lm, numerics, match):
    import jax

    mesh = jax.make_mesh((1, 1), ("data", "model")) if numerics == "exact" else None
    with pytest.raises(ValueError, match=match):
        js.Engine(tiny_lm, None, spec="none", numerics=numerics, mesh=mesh)


def test_the_default_is_fast_on_cpu(tiny_lm):
    assert js.Engine(tiny_lm, None, spec="none").numerics == "fast"
