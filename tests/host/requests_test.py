"""Requests: prompt checks at the public boundary, sampling parameters, and appending tokens up to
a stop token or the length limit."""

import pytest

from jaxspec.host import requests as requests_lib


@pytest.mark.parametrize("prompt, match", [
    ([], "prompt is empty"),
    ([1, 2, 128], r"outside the vocabulary \[0, 128\): \[128\]"),
    ([-1], "outside the vocabulary"),
    (list(range(15)), "prompt of 15 tokens \\+ max_new_tokens 6 = 21 exceeds max_seq_len=20"),
])
def test_check_prompt_names_the_problem(prompt, match):
    with pytest.raises(ValueError, match=match):
        requests_lib.check_prompt(prompt, vocab_size=128, max_new_tokens=6, max_seq_len=20)


def test_check_prompt_returns_ints():
    import numpy as np

    out = requests_lib.check_prompt(np.asarray([3, 4], np.int64), vocab_size=8,
                                    max_new_tokens=1, max_seq_len=3)
    assert out == [3, 4] and all(type(t) is int for t in out)


@pytest.mark.parametrize("kwargs, match", [
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(temperature=-0.1), "temperature"),
    (dict(top_k=-1), "top_k"),
    (dict(top_p=1.5), "top_p"),
    (dict(seed=2**31), "seed"),
])
def test_bad_sampling_params(kwargs, match):
    with pytest.raises(ValueError, match=match):
        requests_lib.SamplingParams(**kwargs)


def _request(max_new_tokens, stops=()):
    return requests_lib.Request(request_id=0, prompt=[1], stop_ids=frozenset(stops),
                                params=requests_lib.SamplingParams(max_new_tokens=max_new_tokens))


def test_append_stops_at_a_stop_token_and_keeps_it():
    r = _request(10, stops=[7])
    assert r.append([5, 7, 9]) == [5, 7]
    assert (r.output, r.finish_reason) == ([5, 7], "stop")


def test_append_stops_at_the_length_limit():
    r = _request(3)
    assert r.append([4, 5]) == [4, 5] and r.finish_reason is None
    assert r.append([6, 7, 8]) == [6]
    assert (r.output, r.finish_reason, r.tokens) == ([4, 5, 6], "length", [1, 4, 5, 6])
