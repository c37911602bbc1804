"""The engine on the tiny model: plain greedy equals the uncached argmax loop, bad input changes
nothing, stop tokens, cancellation, and bounded compilation."""

import chex
import jax
import numpy as np
import pytest

from jaxspec import engine as engine_lib
from jaxspec.device import step as step_lib
from jaxspec.host import requests as requests_lib
from jaxspec.host import scheduler as scheduler_lib
from jaxspec.models import tiny

MODEL = tiny.tiny_model(seed=0)
CONFIG = scheduler_lib.SchedulerConfig(max_batch_size=4, max_seq_len=96, page_size=8,
                                       max_num_tokens=128, prefill_chunk=32)


def prompts(seed, lengths, vocab=128):
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(0, vocab, n)] for n in lengths]


def test_greedy_equals_uncached_argmax_loop(uncached_greedy):
    engine = engine_lib.Engine(MODEL, spec="none", scheduler=CONFIG)
    batch = prompts(0, [5, 40, 17])            # 40 spans two prefill chunks
    result = engine.generate_batch(batch, max_new_tokens=24)
    for p, g in zip(batch, result.generations):
        assert g.token_ids == uncached_greedy(MODEL, p, 24)
        assert g.finish_reason == "length"
    assert result.stats["generated_tokens"] == 72


def test_generation_is_deterministic():
    engine = engine_lib.Engine(MODEL, spec="none", scheduler=CONFIG)
    (p,) = prompts(1, [12])
    a = engine.generate(p, max_new_tokens=16).token_ids
    b = engine.generate(p, max_new_tokens=16).token_ids
    assert a == b


@pytest.mark.parametrize("bad, match", [
    ([], "empty"),
    ([1, 2, 128], "outside the vocabulary"),
    ([-1], "outside the vocabulary"),
    (list(range(90)), "exceeds max_seq_len"),
])
def test_bad_prompts_raise_and_change_nothing(bad, match):
    engine = engine_lib.Engine(MODEL, spec="none", scheduler=CONFIG)
    good = prompts(2, [6])[0]
    with pytest.raises(ValueError, match=match):
        engine.generate_batch([good, bad], max_new_tokens=8)
    assert not engine.executor.has_work()
    assert engine.executor.scheduler.allocator.num_free == engine.executor.scheduler.allocator.num_pages - 1


@pytest.mark.parametrize("kwargs, match", [
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(max_new_tokens=-3), "max_new_tokens"),
    (dict(temperature=-1.0), "temperature"),
    (dict(top_p=0.0), "top_p"),
])
def test_bad_sampling_params(kwargs, match):
    engine = engine_lib.Engine(MODEL, spec="none", scheduler=CONFIG)
    with pytest.raises(ValueError, match=match):
        engine.generate([1, 2, 3], **kwargs)
    assert not engine.executor.has_work()


def test_stop_token_ends_generation(uncached_greedy):
    engine = engine_lib.Engine(MODEL, spec="none", scheduler=CONFIG)
    p = prompts(3, [9])[0]
    free = uncached_greedy(MODEL, p, 12)
    stop = free[5]
    first = free.index(stop)
    g = engine.generate(p, max_new_tokens=12, stop_token_ids=(stop,))
    assert g.token_ids == free[:first + 1]
    assert g.finish_reason == "stop"


def test_cancel_frees_pages():
    engine = engine_lib.Engine(MODEL, spec="none", scheduler=CONFIG)
    ex = engine.executor
    params = requests_lib.SamplingParams(max_new_tokens=40)
    a = ex.add_request(prompts(4, [10])[0], params, frozenset())
    b = ex.add_request(prompts(5, [10])[0], params, frozenset())
    for _ in range(3):
        ex.step()
    ex.cancel(a)
    assert ex.requests[a].finish_reason == "cancelled"
    while ex.has_work():
        ex.step()
    assert len(ex.requests[b].output) == 40
    assert ex.scheduler.allocator.num_free == ex.scheduler.allocator.num_pages - 1
    with pytest.raises(ValueError, match="unknown request id"):
        ex.cancel(12345)


def test_stream_yields_token_ids_without_tokenizer(uncached_greedy):
    engine = engine_lib.Engine(MODEL, spec="none", scheduler=CONFIG)
    p = prompts(6, [7])[0]
    assert list(engine.stream(p, max_new_tokens=10)) == uncached_greedy(MODEL, p, 10)
    assert engine.last_stats["generated_tokens"] == 10


def _limit_traces(monkeypatch, *, steps: int, prefills: int):
    """Swaps the jitted step and prefill for copies that fail when traced more than the limits."""
    for name, limit, donated in (("step", steps, ("kv", "sa", "buf")),
                                 ("prefill", prefills, ("kv",))):
        fn = chex.assert_max_traces(getattr(step_lib, name).__wrapped__, n=limit)
        monkeypatch.setattr(step_lib, name, jax.jit(fn, static_argnames=("cfg",),
                                                    donate_argnames=donated))


def test_compiles_once_per_bucket(monkeypatch):
    """A mix of prompt lengths and batch sizes compiles each bucket once, whatever the lengths;
    a rerun (even in a new engine over the same model) compiles nothing."""
    mixes = [prompts(7, [3]), prompts(8, [20, 5, 9]), prompts(9, [31, 2]), prompts(10, [6])]
    # Decode buckets: rows {1, 2, 4}; prefill: rows {1, 2, 4} x chunk widths {16, 32}.
    _limit_traces(monkeypatch, steps=3, prefills=3 * 2)
    for _ in range(2):
        engine = engine_lib.Engine(MODEL, spec="none", scheduler=CONFIG)
        for batch in mixes:
            engine.generate_batch(batch, max_new_tokens=12)


def test_user_buckets_bound_the_compiled_shapes(monkeypatch):
    """With batch_buckets=(4,) and one prefill bucket, every call pads to those shapes: one
    compilation of each, for prompts and sequences of any length."""
    config = scheduler_lib.SchedulerConfig(max_batch_size=4, max_seq_len=96, page_size=8,
                                           max_num_tokens=128, prefill_chunk=32,
                                           batch_buckets=(4,), prefill_buckets=(32,))
    engine = engine_lib.Engine(MODEL, spec="none", scheduler=config)
    assert engine.executor.batch_buckets == (4,)
    _limit_traces(monkeypatch, steps=1, prefills=1)
    for batch in (prompts(11, [3]), prompts(12, [20, 5, 9]), prompts(13, [70])):
        engine.generate_batch(batch, max_new_tokens=6)
