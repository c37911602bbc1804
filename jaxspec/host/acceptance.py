"""Acceptance prediction: how many of a row's drafts the target will accept, from the length of the
match the drafter found (the automaton's match length, or the n-gram pattern size).

Vocabulary: a draft of `d` tokens is verified position by position; position j is *reached* when
positions 0..j-1 were accepted. `p[m, j]` is the probability that position j is accepted once
reached, for a draft behind a match of length bucket m. The expected number of accepted drafts of
a draft verified up to `L` positions is

    E(L) = sum_{i=1..L} prod_{j<i} p[m, j]

`p` is calibrated online from every verified row: each reached position adds one to its bucket's
`reached` count, and one to `accepted` if it was accepted. Each estimate shrinks towards a prior
mean with `PRIOR_WEIGHT` pseudo-observations: position 0's is the bucket's `PRIOR_MEAN` (chosen from
SmolLM2's acceptance on the benchmark workloads: 1-token matches are rarely right, long ones
usually) or, if higher, the estimate of position 0 in the bucket below (a longer match is not
worse than a shorter one), capped by the estimate of any bucket above that was observed (nor is
it better: where long matches fail, as in a prompt that quotes code the reply then departs from,
the shorter ones are not each verified before they are believed to fail); position j's is the
estimate of position j - 1. A position or bucket never reached so far thus inherits what the
ones before it learned: with a fixed prior there instead, a width never verified keeps looking as
poor as the prior says however well the shorter drafts do, and the draft length never grows to
find out.

Decisions explore (`explore=True`): position 0's estimate is raised by one standard deviation of
its estimate, `sqrt(p (1 - p) / (reached + PRIOR_WEIGHT))`, which shrinks as the bucket is
observed. A prior is one guess for every workload; without the raise, a bucket whose prior says a
draft does not pay for its step is never verified, so its real acceptance is never seen (SmolLM2's
n-gram drafts on code editing: prior 0.45, measured 0.55 with runs of 4 tokens, never drafted once
the step costs were known). With it, an unproven bucket is verified a few times and then judged on
what it did.

A process remembers (`carried`): every predictor of one model and drafter also teaches the
process's, and a new one starts from what the process's learned, scaled down to at most `CARRY`
observations per bucket. An executor already pools every request it serves; a fresh engine per
request (as a script calling `Engine(...).generate` runs) otherwise relearned from the priors in
every request, its first steps judged by guesses the requests before it had corrected. The cap
is the prior's weight, so a request corrects what it inherits as fast as it corrects a prior. At
16 rows, an MT-bench prompt whose drafts were rarely right (1.27 tokens a step), run after three
whose drafts were long and right, kept a mean width of 2.7 and ran at 0.83x plain (as_user, 2
CPU cores).
"""

import bisect
import weakref

import numpy as np

# Lower edges of the match-length buckets: 1, 2, 3, 4-5, 6-7, 8-11, 12-15, 16-23, 24-31, 32+.
BUCKET_EDGES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
PRIOR_MEAN = (0.08, 0.3, 0.45, 0.55, 0.62, 0.7, 0.75, 0.8, 0.85, 0.9)
PRIOR_WEIGHT = 4.0           # pseudo-observations behind each prior mean
CARRY = PRIOR_WEIGHT         # observations per bucket a new predictor takes from its process's


def match_bucket(match_len: int) -> int:
    """The bucket index of a match length (>= 1; 0 has no draft and no bucket)."""
    return max(0, bisect.bisect_right(BUCKET_EDGES, match_len) - 1)


class AcceptancePredictor:
    """Per-position acceptance probabilities by match-length bucket, calibrated online.

    Args:
      max_positions: the longest draft predicted (the largest K).
      memory: a predictor this one starts from (at most `CARRY` observations per bucket) and
        teaches everything it observes (`carried`).
    """

    def __init__(self, max_positions: int, *, memory: "AcceptancePredictor | None" = None):
        if max_positions < 1:
            raise ValueError(f"max_positions must be >= 1, got {max_positions}")
        shape = (len(BUCKET_EDGES), max_positions)
        self.reached = np.zeros(shape)
        self.accepted = np.zeros(shape)
        if memory is not None:
            if memory.max_positions != max_positions:
                raise ValueError(f"a memory of {memory.max_positions} positions for a predictor "
                                 f"of {max_positions}")
            scale = CARRY / np.maximum(memory.reached[:, :1], CARRY)
            self.reached = memory.reached * scale
            self.accepted = memory.accepted * scale
        self._memory = memory

    @property
    def max_positions(self) -> int:
        return self.reached.shape[1]

    def probabilities(self, match_len: int, *, explore: bool = False) -> np.ndarray:
        """f64[max_positions] p[m, j] for the bucket of `match_len`; with `explore`, position 0
        raised by one standard deviation (the module docstring)."""
        m = match_bucket(match_len)
        p = np.empty(self.max_positions)
        prior = self._first_prior(m)
        for j in range(self.max_positions):
            weight = self.reached[m, j] + PRIOR_WEIGHT
            prior = p[j] = (self.accepted[m, j] + PRIOR_WEIGHT * prior) / weight
            if explore and j == 0:
                prior = p[0] = min(1.0, prior + np.sqrt(prior * (1 - prior) / weight))
        return p

    def _first_prior(self, m: int) -> float:
        """Position 0's prior in bucket m: its `PRIOR_MEAN`, or what the bucket below learned
        if that is higher (a longer match is not worse than a shorter one), or what an observed
        bucket above learned if that is lower (nor is a shorter match better)."""
        prior = PRIOR_MEAN[0]
        for b in range(m):
            prior = max(PRIOR_MEAN[b], prior)
            prior = (self.accepted[b, 0] + PRIOR_WEIGHT * prior) / (self.reached[b, 0]
                                                                   + PRIOR_WEIGHT)
        above = [(self.accepted[b, 0] + PRIOR_WEIGHT * PRIOR_MEAN[b])
                 / (self.reached[b, 0] + PRIOR_WEIGHT)
                 for b in range(m + 1, len(BUCKET_EDGES)) if self.reached[b, 0]]
        return min([max(PRIOR_MEAN[m], prior), *above])

    def expected_accepted(self, match_len: int, draft_len: int, *,
                          explore: bool = False) -> np.ndarray:
        """f64[max_positions + 1]: E(L) for L = 0..max_positions, flat past `draft_len` (a draft
        cannot be accepted beyond its real length)."""
        reach = np.cumprod(self.probabilities(match_len, explore=explore))
        reach[min(draft_len, self.max_positions):] = 0.0
        return np.concatenate([[0.0], np.cumsum(reach)])

    def observe(self, match_len: int, draft_len: int, accepted: int) -> None:
        """One verified row: `accepted` of its `draft_len` drafts, behind a match of `match_len`."""
        if draft_len <= 0 or match_len <= 0:
            return
        m = match_bucket(match_len)
        reached = min(accepted + 1, draft_len, self.max_positions)
        self.reached[m, :reached] += 1
        self.accepted[m, :min(accepted, self.max_positions)] += 1
        if self._memory is not None:
            self._memory.observe(match_len, draft_len, accepted)


_PROCESS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # model -> {key: predictor}


def carried(model, drafter, max_positions: int) -> AcceptancePredictor:
    """A new predictor for `model`'s drafts by `drafter` (a hashable name of the drafting
    method and its settings) that starts from, and teaches, what this process learned of them
    (the module docstring). The memory goes with the model object."""
    memory = _PROCESS.setdefault(model, {})
    key = (drafter, max_positions)
    if key not in memory:
        memory[key] = AcceptancePredictor(max_positions)
    return AcceptancePredictor(max_positions, memory=memory[key])


def forget() -> None:
    """Drops what every model's predictors taught this process."""
    _PROCESS.clear()
