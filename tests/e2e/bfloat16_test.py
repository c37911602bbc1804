"""bfloat16 end to end: the engine's cached decoding agrees with an uncached forward within
bfloat16's rounding, and on the real model every divergence between speculative and plain greedy
output is a numerics tie."""

import numpy as np
import pytest

from benchmarks import chat_prompts
from benchmarks import equivalence
from benchmarks import workloads
import jaxspec as js
from jaxspec.models import precision
from tests.helpers import random_prompts


def test_cached_decoding_agrees_with_an_uncached_forward(tiny_lm, forward):
    half = precision.cast(tiny_lm, "bfloat16")
    engine = js.Engine(half, spec="none", record_top2=True,
                       scheduler=js.SchedulerConfig(max_batch_size=3, max_seq_len=64))
    prompts = random_prompts(5, [9, 14, 6], alphabet_size=6)
    for prompt, g in zip(prompts, engine.generate_batch(prompts, max_new_tokens=20).generations,
                         strict=True):
        sequence = np.asarray([prompt + g.token_ids[:-1]])
        logits = forward(half, sequence)[0, len(prompt) - 1:]          # predicts each output
        top = np.sort(logits, axis=-1)[:, ::-1][:, :2]
        cached = np.asarray(g.top2)
        scale = np.abs(logits).max()
        np.testing.assert_allclose(cached, top, atol=0.02 * scale)
        # Where the uncached forward is not near a tie, the cached decoding picked its argmax.
        clear = top[:, 0] - top[:, 1] > 0.04 * scale
        assert clear.mean() > 0.5
        np.testing.assert_array_equal(np.asarray(g.token_ids)[clear], logits.argmax(-1)[clear])


@pytest.mark.extended      # the tiny model's report (tests/benchmarks/equivalence_test.py) in CI
def test_real_model_divergences_are_numerics_ties(smollm2):
    model, tokenizer = smollm2
    # The automaton only: NGram and AUTO's bfloat16 runs are `make bench`'s equivalence sections.
    prompts = chat_prompts.prompt_ids(model, tokenizer, workloads.load("code_editing", 2),
                                      max_new_tokens=32)
    reports = equivalence.compare(model, tokenizer, prompts, methods=("sa",),
                                  dtype="bfloat16", max_new_tokens=32)
    for report in reports:
        assert report["requests"] == 2 and report["bugs"] == 0, report
