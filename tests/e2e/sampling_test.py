"""Sampling with speculation stays exact.

(a) Every sampled token is keyed by the request's seed and its position (jaxspec.device.sampling),
    so a request samples the same tokens whether a position is reached by plain decoding or inside
    a verify window (or a token tree's node, at its depth): sampled outputs with speculation equal
    plain sampled outputs, token for token.
(b) And those tokens follow the model's distribution: a chi-square test of the first two generated
    tokens of many seeds, with drafts verified at the second position, against the exact joint
    distribution computed from full forwards.
"""

import dataclasses

import numpy as np
import pytest
import scipy.special
import scipy.stats

import jaxspec as js
from jaxspec import engine as engine_lib
from jaxspec.host import requests as requests_lib
from jaxspec.host import scheduler as scheduler_lib
from jaxspec.models import tiny

# Sampling verify steps are the slowest to compile, so the workload keeps to one shape: one wave of
# 16 requests prefilled in one iteration, one page per sequence, and (see `_run`) every decode step
# in the 16-row bucket.
CONFIG = scheduler_lib.SchedulerConfig(max_batch_size=16, max_seq_len=40, page_size=64,
                                       max_num_tokens=256, prefill_chunk=16)
MAX_NEW = 24
SPECS = {
    "sa": js.SAConfig(max_draft_len=4),
    "ngram": js.NGramConfig(max_draft_len=4, max_matching_ngram_size=2),
    # A tree's node samples with the key of the position its depth gives: the accepted path
    # draws what plain decoding draws there.
    "sa_tree": js.SAConfig(max_draft_len=4, selection="frequent", min_match_len=1,
                           tree_budget=8),
}


def _sampling_workload():
    """16 requests: prompts over 3 token ids (repetitive, so drafts exist) of mixed lengths, and
    mixed sampling parameters; greedy rows share the batches with the sampled ones."""
    rng = np.random.default_rng(0)
    grid = [dict(temperature=0.3), dict(temperature=0.6, top_k=3), dict(temperature=1.0, top_k=2),
            dict(temperature=0.8, top_p=0.5), dict(temperature=0.5, top_k=5, top_p=0.9),
            dict(temperature=0.0)]
    work = []
    for i in range(16):
        alphabet = rng.choice(tiny.tiny_config().vocab_size, 3, replace=False)
        prompt = [int(t) for t in rng.choice(alphabet, int(rng.integers(4, 17)))]
        params = requests_lib.SamplingParams(max_new_tokens=MAX_NEW, seed=1000 + i,
                                             **grid[i % len(grid)])
        work.append((prompt, params))
    return work


def _run(model, spec, work, min_running=1):
    """Outputs of `work`, stepping while at least `min_running` requests run (then cancelling).

    With speculation requests reach their length at different steps; stopping before fewer than 9
    run keeps every step in the 16-row bucket, and the outputs so far are prefixes to compare.
    """
    executor = engine_lib.Engine(model, spec=spec, scheduler=CONFIG).executor
    ids = [executor.add_request(prompt, params, frozenset()) for prompt, params in work]
    done = {}
    while len(ids) - len(done) >= min_running:
        done.update((e.request_id, e.result) for e in executor.step() if e.finished)
    for i in ids:
        if i not in done:
            done[i] = executor.cancel(i)
    return [done[i].output for i in ids], executor.stats


@pytest.fixture(scope="module")
def plain_outputs(tiny_lm):
    return _run(tiny_lm, None, _sampling_workload())[0]


@pytest.mark.parametrize("name", sorted(SPECS))
def test_sampled_outputs_equal_plain_sampling(name, plain_outputs, tiny_lm):
    outputs, stats = _run(tiny_lm, SPECS[name], _sampling_workload(),
                          min_running=CONFIG.max_batch_size // 2 + 1)
    for i, (got, want) in enumerate(zip(outputs, plain_outputs, strict=True)):
        assert got == want[:len(got)], f"request {i}"
    assert sum(map(len, outputs)) >= len(outputs) * MAX_NEW * 3 // 4
    assert stats.accepted > 0, stats.summary()


def test_seeds_decide_the_samples(plain_outputs, tiny_lm):
    """The comparison above has teeth: other seeds give other sampled outputs."""
    work = [(p, dataclasses.replace(params, seed=params.seed + 1))
            for p, params in _sampling_workload()]
    outputs = _run(tiny_lm, None, work)[0]
    sampled = [i for i, (_, params) in enumerate(work) if not params.greedy]
    assert sum(outputs[i] != plain_outputs[i] for i in sampled) >= len(sampled) // 2
    greedy = [i for i in range(len(work)) if i not in sampled]
    assert all(outputs[i] == plain_outputs[i] for i in greedy)


# ---------------------------------------------------------------------------- distribution

SMALL = tiny.tiny_model(seed=0, vocab_size=8)
# Every token id occurs in the prompt, so whatever the first sampled token is, the automaton
# matches it and drafts the second position.
PROMPT = list(range(8)) * 2
NUM_SAMPLES = 4096
TEMPERATURE = 1.0


def _exact_joint(forward) -> np.ndarray:
    """P(first = a, second = b) from full forwards, f64[8, 8]."""
    first = scipy.special.softmax(forward(SMALL, np.asarray([PROMPT]))[0, -1] / TEMPERATURE)
    extended = np.asarray([PROMPT + [a] for a in range(8)])
    second = scipy.special.softmax(forward(SMALL, extended)[:, -1] / TEMPERATURE, axis=-1)
    return first.astype(np.float64)[:, None] * second.astype(np.float64)


def test_first_two_tokens_follow_the_model_distribution(forward):
    config = scheduler_lib.SchedulerConfig(max_batch_size=16, max_seq_len=24, page_size=16,
                                           max_num_tokens=16 * 16, prefill_chunk=16)
    # min_match_len=1: the 1-token matches of this prompt must be drafted and verified.
    executor = engine_lib.Engine(SMALL, spec=js.SAConfig(max_draft_len=3, min_match_len=1),
                                 scheduler=config).executor
    ids = [executor.add_request(PROMPT, requests_lib.SamplingParams(
        max_new_tokens=2, temperature=TEMPERATURE, seed=seed), frozenset())
        for seed in range(NUM_SAMPLES)]
    done = executor.run()
    requests = [done[i] for i in ids]
    # Drafting really happened at the second position, for every sample, and both verify outcomes
    # are common (about 12% of the samples take the second token from an accepted draft).
    assert all(r.drafted > 0 for r in requests)
    accepted = sum(r.accepted > 0 for r in requests)
    assert NUM_SAMPLES // 20 < accepted < NUM_SAMPLES - NUM_SAMPLES // 20, accepted

    counts = np.zeros((8, 8), np.int64)
    for r in requests:
        counts[r.output[0], r.output[1]] += 1
    expected = NUM_SAMPLES * _exact_joint(forward)
    # Cells expected fewer than 5 times are pooled into one, as the chi-square approximation needs.
    small = expected < 5
    observed = np.append(counts[~small], counts[small].sum())
    wanted = np.append(expected[~small], expected[small].sum())
    result = scipy.stats.chisquare(observed, wanted * observed.sum() / wanted.sum())
    assert result.pvalue > 1e-3, (result, counts, expected.round(1))
