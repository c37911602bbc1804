"""The engine on the tiny model: plain greedy equals the uncached argmax loop, bad input changes
nothing, stop tokens, cancellation, and bounded compilation."""

import pytest

from jaxspec import engine as engine_lib
from jaxspec.device import step as step_lib
from jaxspec.host import compiles
from jaxspec.host import requests as requests_lib
from jaxspec.host import scheduler as scheduler_lib
from jaxspec.models import tiny
from tests.helpers import random_prompts as prompts

CONFIG = scheduler_lib.SchedulerConfig(max_batch_size=4, max_seq_len=96, page_size=8,
                                       max_num_tokens=128, prefill_chunk=32)


def traces() -> tuple[int, int]:
    return step_lib.trace_count("prefill"), step_lib.trace_count("step")


def test_greedy_equals_uncached_argmax_loop(tiny_lm, uncached_greedy):
    engine = engine_lib.Engine(tiny_lm, spec="none", scheduler=CONFIG)
    batch = prompts(0, [5, 40, 17])            # 40 spans two prefill chunks
    result = engine.generate_batch(batch, max_new_tokens=24)
    for p, g in zip(batch, result.generations, strict=True):
        assert g.token_ids == uncached_greedy(tiny_lm, p, 24)
        assert g.finish_reason == "length"
    assert result.stats["generated_tokens"] == 72


def test_generation_is_deterministic(tiny_lm):
    engine = engine_lib.Engine(tiny_lm, spec="none", scheduler=CONFIG)
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
def test_bad_prompts_raise_and_change_nothing(tiny_lm, bad, match):
    engine = engine_lib.Engine(tiny_lm, spec="none", scheduler=CONFIG)
    good = prompts(2, [6])[0]
    with pytest.raises(ValueError, match=match):
        engine.generate_batch([good, bad], max_new_tokens=8)
    assert not engine.executor.has_work()
    allocator = engine.executor.scheduler.allocator
    assert allocator.num_free == allocator.num_pages - 1


@pytest.mark.parametrize("kwargs, match", [
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(max_new_tokens=-3), "max_new_tokens"),
    (dict(temperature=-1.0), "temperature"),
    (dict(top_p=0.0), "top_p"),
])
def test_bad_sampling_params(tiny_lm, kwargs, match):
    engine = engine_lib.Engine(tiny_lm, spec="none", scheduler=CONFIG)
    with pytest.raises(ValueError, match=match):
        engine.generate([1, 2, 3], **kwargs)
    assert not engine.executor.has_work()


def test_stop_token_ends_generation(tiny_lm, uncached_greedy):
    engine = engine_lib.Engine(tiny_lm, spec="none", scheduler=CONFIG)
    p = prompts(3, [9])[0]
    free = uncached_greedy(tiny_lm, p, 12)
    stop = free[5]
    first = free.index(stop)
    g = engine.generate(p, max_new_tokens=12, stop_token_ids=(stop,))
    assert g.token_ids == free[:first + 1]
    assert g.finish_reason == "stop"


def test_cancel_frees_pages(tiny_lm):
    engine = engine_lib.Engine(tiny_lm, spec="none", scheduler=CONFIG)
    ex = engine.executor
    params = requests_lib.SamplingParams(max_new_tokens=40)
    a = ex.add_request(prompts(4, [10])[0], params, frozenset())
    b = ex.add_request(prompts(5, [10])[0], params, frozenset())
    for _ in range(3):
        ex.step()
    assert ex.cancel(a).finish_reason == "cancelled"
    done = ex.run()
    assert list(done) == [b] and len(done[b].output) == 40
    assert ex.scheduler.allocator.num_free == ex.scheduler.allocator.num_pages - 1
    for finished in (a, b, 12345):
        with pytest.raises(ValueError, match="no live request"):
            ex.cancel(finished)


def test_stream_yields_token_ids_without_tokenizer(tiny_lm, uncached_greedy):
    engine = engine_lib.Engine(tiny_lm, spec="none", scheduler=CONFIG)
    p = prompts(6, [7])[0]
    assert list(engine.stream(p, max_new_tokens=10)) == uncached_greedy(tiny_lm, p, 10)
    assert engine.last_stats["generated_tokens"] == 10


def test_compiles_once_per_bucket(tiny_lm):
    """A mix of prompt lengths and batch sizes compiles each bucket once, whatever the lengths;
    a rerun (even in a new engine over the same model) compiles nothing."""
    mixes = [prompts(7, [3]), prompts(8, [20, 5, 9]), prompts(9, [31, 2]), prompts(10, [6])]

    def run():
        engine = engine_lib.Engine(tiny_lm, spec="none", scheduler=CONFIG)
        for batch in mixes:
            engine.generate_batch(batch, max_new_tokens=12)

    step_lib.prefill.clear_cache()
    step_lib.step.clear_cache()
    compiles.LEDGER.forget_programs()       # the steps' compiled programs (compiles.py)
    start = traces()
    run()
    first = tuple(t - t0 for t, t0 in zip(traces(), start, strict=True))
    before = traces()
    run()
    assert traces() == before
    # Decode buckets: rows {1, 2, 4}, whose chained steps (the overlap scheduler's) run the
    # same programs; prefill: rows {1, 2, 4} x chunk widths {16, 32}.
    assert first[1] == 3
    assert first[0] <= 3 * 2


def test_user_buckets_bound_the_compiled_shapes(tiny_lm):
    """With batch_buckets=(4,) and one prefill bucket, every call pads to those shapes: one
    compilation of each, for prompts and sequences of any length."""
    config = scheduler_lib.SchedulerConfig(max_batch_size=4, max_seq_len=96, page_size=8,
                                           max_num_tokens=128, prefill_chunk=32,
                                           batch_buckets=(4,), prefill_buckets=(32,))
    engine = engine_lib.Engine(tiny_lm, spec="none", scheduler=config)
    assert engine.executor.batch_buckets == (4,)
    step_lib.prefill.clear_cache()
    step_lib.step.clear_cache()
    compiles.LEDGER.forget_programs()
    start = traces()
    for batch in (prompts(11, [3]), prompts(12, [20, 5, 9]), prompts(13, [70])):
        engine.generate_batch(batch, max_new_tokens=6)
    # One step program, chained steps (the overlap scheduler's) included.
    assert tuple(t - t0 for t, t0 in zip(traces(), start, strict=True)) == (1, 1)


def test_capacity_beyond_the_model_fails_before_allocating():
    short = tiny.tiny_model(seed=0, max_position_embeddings=64)
    with pytest.raises(ValueError, match="max_seq_len=96 exceeds the model's context length of 64"):
        engine_lib.Engine(short, spec="sa", scheduler=CONFIG)


def test_capacity_beyond_memory_fails_before_allocating(tiny_lm):
    huge = scheduler_lib.SchedulerConfig(max_batch_size=64, max_seq_len=10**7)
    with pytest.raises(ValueError, match="GB of device memory"):
        engine_lib.Engine(tiny_lm, spec="sa", scheduler=huge)
