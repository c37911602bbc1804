"""Acceptance metrics, per request and per run.

Conventions (the same as vLLM's spec-decode metrics):
  drafted              real draft tokens verified (padding to the bucket's K never counts).
  accepted             drafts that matched the target.
  acceptance rate      pooled: sum(accepted) / sum(drafted) over the steps that drafted anything.
  acceptance length    tokens committed by one request in one verify step = accepted + 1: the
                       bonus token is included, so plain decoding has acceptance length 1.
  per-position rate    of the steps that drafted at least j+1 tokens, the share that accepted the
                       draft at position j.
"""

import collections
import dataclasses

import numpy as np


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
    draft_time: float = 0.0          # host drafting (NGram, user drafters); SA drafts on device
    wall_time: float = 0.0
    spec_steps: int = 0              # verify steps with K > 0
    acceptance_lengths: collections.Counter = dataclasses.field(
        default_factory=collections.Counter)
    position_drafted: collections.Counter = dataclasses.field(
        default_factory=collections.Counter)
    position_accepted: collections.Counter = dataclasses.field(
        default_factory=collections.Counter)
    k_history: list[int] = dataclasses.field(default_factory=list)

    def record_step(self, k: int, draft_lens, num_new, seconds: float, draft_seconds: float):
        """One verify step: per-row real draft lengths and committed (kept) token counts."""
        self.decode_steps += 1
        self.spec_steps += int(k > 0)
        self.step_time += seconds
        self.draft_time += draft_seconds
        self.k_history.append(k)
        for d, n in zip(draft_lens, num_new):
            d, a = int(d), int(n) - 1
            self.request_steps += 1
            self.drafted += d
            self.accepted += a
            self.acceptance_lengths[a + 1] += 1
            for j in range(d):
                self.position_drafted[j] += 1
            for j in range(a):
                self.position_accepted[j] += 1

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def mean_acceptance_length(self) -> float | None:
        """Committed tokens per request per verify step (bonus token included)."""
        if not self.request_steps:
            return None
        return (self.accepted + self.request_steps) / self.request_steps

    @property
    def tokens_per_second(self) -> float | None:
        return self.generated_tokens / self.wall_time if self.wall_time > 0 else None

    def per_position_acceptance(self) -> list[float]:
        return [self.position_accepted[j] / self.position_drafted[j]
                for j in sorted(self.position_drafted)]

    def summary(self) -> dict:
        """A JSON-ready dict of every metric."""
        rnd = lambda x, n=4: None if x is None else round(float(x), n)  # noqa: E731
        return {
            "prompt_tokens": self.prompt_tokens,
            "generated_tokens": self.generated_tokens,
            "wall_time_s": rnd(self.wall_time),
            "tokens_per_s": rnd(self.tokens_per_second, 2),
            "decode_steps": self.decode_steps,
            "spec_steps": self.spec_steps,
            "mean_step_time_ms": rnd(1e3 * self.step_time / self.decode_steps
                                     if self.decode_steps else None, 2),
            "prefill_time_s": rnd(self.prefill_time),
            "drafting_overhead_ms_per_step": rnd(1e3 * self.draft_time / self.decode_steps
                                                 if self.decode_steps else None, 3),
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": rnd(self.acceptance_rate),
            "mean_acceptance_length": rnd(self.mean_acceptance_length),
            "acceptance_length_histogram": {str(k): v for k, v in
                                            sorted(self.acceptance_lengths.items())},
            "per_position_acceptance": [rnd(x) for x in self.per_position_acceptance()],
            "k_mean": rnd(np.mean(self.k_history) if self.k_history else None, 3),
        }
