"""Acceptance metrics, per request and per run.

Conventions (the same as vLLM's spec-decode metrics):
  drafted              real draft tokens verified (padding to the bucket's K never counts).
  accepted             drafts that matched the target.
  acceptance rate      pooled: sum(accepted) / sum(drafted) over the steps that drafted anything.
  acceptance length    tokens one request kept from one verify step: accepted + 1 (the bonus
                       token included, so plain decoding has acceptance length 1), unless a stop
                       token or the length limit cut the window short (`accepted_drafts`).
  per-position rate    of the steps that drafted at least j+1 tokens, the share that accepted the
                       draft at position j.
"""

import collections
import dataclasses

import numpy as np


def accepted_drafts(kept: int, num_new: int) -> int:
    """Drafts among the tokens a request kept from one verify step: the one count of accepted
    drafts (per request, per run and for the gate).

    The step committed `num_new` = accepted drafts + 1 tokens, the last one the bonus token; a
    stop token or the length limit may keep only the first `kept` of them. Every kept token is
    a verified draft except the bonus, which is kept only when nothing was cut. Example: drafts
    `[5, 7]` both accepted (num_new = 3) with stop token 7 keep `[5, 7]`: 2 accepted drafts.
    """
    return min(kept, num_new - 1)


STALL_MIN_ITERATIONS = 3


@dataclasses.dataclass
class RunStats:
    """Accumulates one run's decode steps. Times are wall-clock seconds on the host."""

    generated_tokens: int = 0
    prompt_tokens: int = 0
    decode_steps: int = 0            # executor iterations that ran a verify step
    request_steps: int = 0           # (request, verify step) pairs
    drafted: int = 0
    accepted: int = 0
    step_time: float = 0.0           # time in the verify step, device included
    prefill_time: float = 0.0
    draft_time: float = 0.0          # host planning: drafting (NGram, user drafters; SA drafts
                                     # on device), slot bookkeeping, the K decision
    decide_time: float = 0.0         # of which the K decision (adaptive K) and the gates
    wall_time: float = 0.0
    spec_steps: int = 0              # verify steps with K > 0
    committed: int = 0               # tokens kept from verify steps (accepted + bonus, as cut)
    first_call_time: float = 0.0     # iterations that traced (compiled) a jitted function
    first_call_tokens: int = 0
    acceptance_lengths: collections.Counter = dataclasses.field(
        default_factory=collections.Counter)
    position_drafted: collections.Counter = dataclasses.field(
        default_factory=collections.Counter)
    position_accepted: collections.Counter = dataclasses.field(
        default_factory=collections.Counter)
    k_history: list[int] = dataclasses.field(default_factory=list)
    # (K, seconds) of each iteration that ran a decode step and no prompt chunk
    decode_iterations: list[tuple[int, float]] = dataclasses.field(default_factory=list)

    def record_step(self, k: int, draft_lens, accepted, kept, seconds: float,
                    draft_seconds: float, decide_seconds: float):
        """One verify step: per row, the real draft length, the accepted drafts
        (`accepted_drafts`) and the tokens kept."""
        self.decode_steps += 1
        self.spec_steps += int(k > 0)
        self.step_time += seconds
        self.draft_time += draft_seconds
        self.decide_time += decide_seconds
        self.k_history.append(k)
        for d, a, n in zip(draft_lens, accepted, kept, strict=True):
            d, a, n = int(d), int(a), int(n)
            self.request_steps += 1
            self.drafted += d
            self.accepted += a
            self.committed += n
            self.acceptance_lengths[n] += 1
            for j in range(d):
                self.position_drafted[j] += 1
            for j in range(a):
                self.position_accepted[j] += 1

    def record_iteration(self, seconds: float, tokens: int, compiled: bool,
                         decode_k: int | None = None):
        """One executor iteration: its wall time and generated tokens, set apart when it traced
        (compiled) a jitted function, so the steady rate excludes compilation. `decode_k`: the
        width of the decode step it ran, if it ran one and no prompt chunk (its time is then
        the gap between two steps of the requests it decoded)."""
        self.wall_time += seconds
        if decode_k is not None:
            self.decode_iterations.append((decode_k, seconds))
        if compiled:
            self.first_call_time += seconds
            self.first_call_tokens += tokens

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def mean_acceptance_length(self) -> float | None:
        """Tokens kept per request per verify step (bonus token included)."""
        if not self.request_steps:
            return None
        return self.committed / self.request_steps

    @property
    def tokens_per_second(self) -> float | None:
        return self.generated_tokens / self.wall_time if self.wall_time > 0 else None

    @property
    def steady_tokens_per_second(self) -> float | None:
        """Tokens per second over the iterations that compiled nothing."""
        seconds = self.wall_time - self.first_call_time
        tokens = self.generated_tokens - self.first_call_tokens
        return tokens / seconds if seconds > 0 and tokens > 0 else None

    def per_position_acceptance(self) -> list[float]:
        return [self.position_accepted[j] / self.position_drafted[j]
                for j in sorted(self.position_drafted)]

    @property
    def stall_ratio(self) -> float | None:
        """The longest decode iteration over the median one of the same width (widths run at
        least `STALL_MIN_ITERATIONS` times): a step that waited for a compile shows here. Widths
        are compared with themselves, as a CPU's verify step of 16 drafts costs 4x a plain one."""
        by_k = collections.defaultdict(list)
        for k, seconds in self.decode_iterations:
            by_k[k].append(seconds)
        ratios = [max(t) / np.median(t) for t in by_k.values()
                  if len(t) >= STALL_MIN_ITERATIONS and np.median(t) > 0]
        return max(ratios) if ratios else None

    def summary(self) -> dict:
        """A JSON-ready dict of every metric."""
        gaps = [seconds for _, seconds in self.decode_iterations]
        rnd = lambda x, n=4: None if x is None else round(float(x), n)  # noqa: E731
        return {
            "prompt_tokens": self.prompt_tokens,
            "generated_tokens": self.generated_tokens,
            "wall_time_s": rnd(self.wall_time),
            "tokens_per_s": rnd(self.tokens_per_second, 2),
            "steady_tokens_per_s": rnd(self.steady_tokens_per_second, 2),
            "first_call_time_s": rnd(self.first_call_time),
            "decode_steps": self.decode_steps,
            "spec_steps": self.spec_steps,
            "mean_step_time_ms": rnd(1e3 * self.step_time / self.decode_steps
                                     if self.decode_steps else None, 2),
            "prefill_time_s": rnd(self.prefill_time),
            "drafting_overhead_ms_per_step": rnd(1e3 * self.draft_time / self.decode_steps
                                                 if self.decode_steps else None, 3),
            "decision_overhead_ms_per_step": rnd(1e3 * self.decide_time / self.decode_steps
                                                 if self.decode_steps else None, 3),
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": rnd(self.acceptance_rate),
            "mean_acceptance_length": rnd(self.mean_acceptance_length),
            "acceptance_length_histogram": {str(k): v for k, v in
                                            sorted(self.acceptance_lengths.items())},
            "per_position_acceptance": [rnd(x) for x in self.per_position_acceptance()],
            "k_mean": rnd(np.mean(self.k_history) if self.k_history else None, 3),
            "median_step_gap_ms": rnd(1e3 * np.median(gaps) if gaps else None, 2),
            "max_step_gap_ms": rnd(1e3 * max(gaps) if gaps else None, 2),
            "stall_ratio": rnd(self.stall_ratio, 2),
        }
