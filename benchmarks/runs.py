"""One timed pass of one method over a list of prompts, for jaxspec and for the HF baseline.

A pass is what every benchmark here repeats: all prompts through a fresh engine (jaxspec, one
continuous batch of at most `max_batch_size` requests) or one after another (HF, batch 1). A fresh
engine per pass means no automaton, pool or gate state carries over from the previous pass, so
repeats are alike and methods start equal.

Throughput conventions, the same for both sides:
  tokens/s         generated tokens / wall seconds of the pass, prefill included (what a user
                   waits for).
  decode tokens/s  (generated - one first token per prompt) / (wall - prefill seconds): the
                   decoding loop alone, where speculation acts. jaxspec times its prefill; for HF
                   the prefill is measured apart, by 1-token generations.
"""

from collections.abc import Sequence
import dataclasses
import math
import os
import statistics
import time

from benchmarks import rss as rss_lib
from jaxspec import engine as engine_lib
from jaxspec.host import scheduler as scheduler_lib

PAGE_SIZE = 16
# From this many prompt tokens on, HF's prefill takes seconds and one sample of it is enough.
ONE_PREFILL_SAMPLE_TOKENS = 2048
# Compile events jax reports for every XLA backend compilation (jax/_src/dispatch.py).
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Run:
    """One pass of one method over all prompts.

    Attributes:
      outputs: generated token ids per prompt, in prompt order (a stop token included).
      wall_s: seconds for the whole pass.
      prefill_s: seconds of it spent in prefill, or None when unknown.
      stats: the engine's run metrics (`jaxspec.host.stats.RunStats.summary`), None for HF.
      peak_mib: highest resident memory during the pass, None without psutil.
      compiles: XLA compilations during the pass.
      compile_s: seconds XLA spent compiling during the pass.
    """

    outputs: list[list[int]]
    wall_s: float
    prefill_s: float | None = None
    stats: dict | None = None
    peak_mib: float | None = None
    compiles: int = 0
    compile_s: float = 0.0

    @property
    def generated(self) -> int:
        return sum(map(len, self.outputs))

    @property
    def tokens_per_s(self) -> float:
        return self.generated / self.wall_s

    @property
    def decode_tokens_per_s(self) -> float | None:
        if self.prefill_s is None or self.wall_s <= self.prefill_s:
            return None
        return (self.generated - len(self.outputs)) / (self.wall_s - self.prefill_s)


class CompileCounter:
    """Counts XLA backend compilations (and their seconds) while the block runs."""

    def __init__(self):
        self.count = 0
        self.seconds = 0.0

    def _listen(self, event: str, duration_s: float, **_):
        if event == BACKEND_COMPILE_EVENT:
            self.count += 1
            self.seconds += duration_s

    def __enter__(self) -> "CompileCounter":
        import jax

        jax.monitoring.register_event_duration_secs_listener(self._listen)
        return self

    def __exit__(self, *exc_info):
        import jax

        jax.monitoring.unregister_event_duration_listener(self._listen)
        return False


def load_average() -> float | None:
    """The machine's 1-minute load average (None where the OS has none)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def load_note(start: float | None, end: float | None) -> str:
    """A sentence on how busy the machine was: above the core count, timings were shared."""
    if start is None or end is None:
        return ""
    cores = os.cpu_count()
    start, end = round(start, 1), round(end, 1)    # the verdict agrees with the figures shown
    verdict = ("above the core count: other work shared the CPU" if max(start, end) > cores
               else "not above the core count")
    return (f"1-minute load average {start:.1f} at the start and {end:.1f} at the end, on "
            f"{cores} cores ({verdict}).")


def stop_ids(tokenizer) -> tuple[int, ...]:
    """The ids that end generation: the tokenizer's end tokens, none without a tokenizer."""
    return tuple(tokenizer.eos_token_ids) if tokenizer is not None else ()


def scheduler_for(prompts: Sequence[Sequence[int]], max_new_tokens: int,
                  batch_size: int) -> scheduler_lib.SchedulerConfig:
    """Capacity for `prompts` at `batch_size`: sequences just long enough, in whole KV pages."""
    longest = max(map(len, prompts)) + max_new_tokens + 1
    return scheduler_lib.SchedulerConfig(max_batch_size=batch_size, page_size=PAGE_SIZE,
                                         max_seq_len=PAGE_SIZE * math.ceil(longest / PAGE_SIZE))


def run_jaxspec(model, tokenizer, prompts: Sequence[Sequence[int]], *, spec, max_new_tokens: int,
                scheduler: scheduler_lib.SchedulerConfig, **sampling) -> Run:
    """All prompts as one continuous batch through a fresh engine with `spec`; `sampling`:
    `SamplingParams` fields other than max_new_tokens (default greedy)."""
    engine = engine_lib.Engine(model, tokenizer, spec=spec, scheduler=scheduler)
    with rss_lib.PeakRSS() as peak, CompileCounter() as compiles:
        start = time.perf_counter()
        result = engine.generate_batch([list(p) for p in prompts], max_new_tokens=max_new_tokens,
                                       **sampling)
        wall = time.perf_counter() - start
    return Run(outputs=[g.token_ids for g in result.generations], wall_s=wall,
               prefill_s=result.stats["prefill_time_s"], stats=result.stats, peak_mib=peak.mib,
               compiles=compiles.count, compile_s=compiles.seconds)


def hf_prefill_seconds(hf, prompts: Sequence[Sequence[int]], stops: Sequence[int], *,
                       repeats: int = 3) -> float:
    """HF's prefill time for a pass: per prompt the median of `repeats` 1-token generations,
    summed over `prompts` (one sample is too noisy next to a short, fast reply; a prompt of
    ONE_PREFILL_SAMPLE_TOKENS or more gets one, which takes seconds)."""
    total = 0.0
    for prompt in prompts:
        seconds = []
        for _ in range(1 if len(prompt) >= ONE_PREFILL_SAMPLE_TOKENS else repeats):
            start = time.perf_counter()
            hf.generate(prompt, max_new_tokens=1, stop_ids=stops)
            seconds.append(time.perf_counter() - start)
        total += statistics.median(seconds)
    return total


def run_hf(hf, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, stops: Sequence[int],
           prompt_lookup_num_tokens: int | None = None, prefill_s: float | None = None) -> Run:
    """The prompts one after another through `hf` (a `benchmarks.hf_baseline.HFModel`)."""
    outputs = []
    with rss_lib.PeakRSS() as peak:
        start = time.perf_counter()
        for prompt in prompts:
            outputs.append(hf.generate(prompt, max_new_tokens=max_new_tokens, stop_ids=stops,
                                       prompt_lookup_num_tokens=prompt_lookup_num_tokens))
        wall = time.perf_counter() - start
    return Run(outputs=outputs, wall_s=wall, prefill_s=prefill_s, peak_mib=peak.mib)


def first_mismatch(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first position where two token sequences differ (a length difference counts), or
    None when they are equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))
