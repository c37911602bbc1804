"""Passes, throughput conventions, compile counting and the capacity a benchmark asks for."""

import os

import jax
import jax.numpy as jnp
import pytest

from benchmarks import runs


@pytest.mark.parametrize("a, b, want", [
    ([1, 2, 3], [1, 2, 3], None),
    ([1, 2, 3], [1, 9, 3], 1),
    ([1, 2], [1, 2, 3], 2),             # a shorter output differs where it stops
    ([], [], None),
    ([4], [], 0),
])
def test_first_mismatch(a, b, want):
    assert runs.first_mismatch(a, b) == want
    assert runs.first_mismatch(b, a) == want


def test_throughputs():
    run = runs.Run(outputs=[[1] * 10, [2] * 6], wall_s=4.0, prefill_s=1.0)
    assert run.generated == 16
    assert run.tokens_per_s == 4.0
    # One first token per prompt comes from prefill: (16 - 2) tokens in (4 - 1) seconds.
    assert run.decode_tokens_per_s == pytest.approx(14 / 3)
    assert runs.Run(outputs=[[1]], wall_s=1.0).decode_tokens_per_s is None


def test_scheduler_fits_the_longest_prompt_in_whole_pages():
    cfg = runs.scheduler_for([[0] * 30, [0] * 47], max_new_tokens=20, batch_size=3)
    assert cfg.max_batch_size == 3
    assert cfg.max_seq_len % runs.PAGE_SIZE == 0
    assert 47 + 20 + 1 <= cfg.max_seq_len < 47 + 20 + 1 + runs.PAGE_SIZE


def test_compile_counter_counts_new_compilations_only():
    f = jax.jit(lambda x: x * 3 + 1)
    x = jnp.arange(7, dtype=jnp.int32)
    with runs.CompileCounter() as first:
        f(x).block_until_ready()
    with runs.CompileCounter() as again:
        f(x).block_until_ready()
    assert first.count >= 1 and first.seconds > 0
    assert again.count == 0


def test_load_note():
    assert runs.load_note(None, 1.0) == ""
    note = runs.load_note(3.25, 0.5)
    assert note.startswith("1-minute load average 3.2 at the start and 0.5 at the end, on ")
    busy = os.cpu_count() + 0.5
    assert runs.load_note(0.1, busy).endswith("(above the core count: other work shared the CPU).")
    assert runs.load_note(0.1, 0.2).endswith("(not above the core count).")
    assert runs.load_note(0.1, os.cpu_count() + 0.04).endswith("(not above the core count).")
    assert isinstance(runs.load_average(), float)


def test_hf_prefill_is_the_median_per_prompt_summed(monkeypatch):
    class ClockedHF:
        """Each 1-token generation advances a fake clock by the next scripted duration."""

        def __init__(self, durations):
            self.durations = list(durations)
            self.now = 0.0

        def generate(self, prompt, *, max_new_tokens, stop_ids):
            assert max_new_tokens == 1
            self.now += self.durations.pop(0)

    hf = ClockedHF([1.0, 9.0, 2.0, 5.0, 4.0, 3.0])   # prompt 0: median 2; prompt 1: median 4
    monkeypatch.setattr(runs.time, "perf_counter", lambda: hf.now)
    assert runs.hf_prefill_seconds(hf, [[1], [2]], ()) == 6.0


def test_hf_prefill_takes_one_sample_of_a_long_prompt():
    calls = []

    class CountingHF:
        def generate(self, prompt, *, max_new_tokens, stop_ids):
            calls.append(len(prompt))

    runs.hf_prefill_seconds(CountingHF(), [[1] * 10, [1] * runs.ONE_PREFILL_SAMPLE_TOKENS], ())
    assert calls == [10, 10, 10, runs.ONE_PREFILL_SAMPLE_TOKENS]
