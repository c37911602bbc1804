"""What this process has compiled, what a compile costs, and when a new width is worth one.

Adaptive K picks among compiled widths for free, but a width not yet compiled for a batch bucket
costs a compilation first (6-12 s for SmolLM2 on a CPU, 20-150 steps), which a short run never
earns back. A width is compiled when either
  - the live requests' remaining tokens would save more than a compile costs with it, or
  - the time already lost without it reaches a compile's cost: the ski-rental rule (buy once the
    rent paid equals the price), which loses at most twice the best choice in hindsight however
    long the process goes on decoding after these requests.
A compile's cost is the median of those measured in this process. Under `eager()` (a server's
warm-up traffic, a benchmark's untimed pass) every width the estimate prefers compiles at once.

One ledger serves the whole process (`LEDGER`), as jit's caches do: an executor built after
another finds the widths its predecessor compiled ready. Call `forget_programs()` with
`jax.clear_caches()`.
"""

import collections
from collections.abc import Hashable
import contextlib
import statistics

WINDOW = 16          # compile times kept; their median is the price of the next


class CompileLedger:
    """Compiled programs, measured compile times, and the time lost waiting for each program."""

    def __init__(self):
        self._ready: set[Hashable] = set()
        self._seconds: collections.deque = collections.deque(maxlen=WINDOW)
        self._lost: collections.Counter = collections.Counter()
        self._eager = False

    def ran(self, key: Hashable, seconds: float | None = None) -> None:
        """A call of the program `key`; `seconds` is its wall time where it compiled."""
        self._ready.add(key)
        self._lost.pop(key, None)
        if seconds is not None:
            self._seconds.append(float(seconds))

    def forget_programs(self) -> None:
        """Nothing is compiled any more (after `jax.clear_caches()`); the price stays."""
        self._ready.clear()
        self._lost.clear()

    @property
    def is_eager(self) -> bool:
        return self._eager

    def ready(self, key: Hashable) -> bool:
        return key in self._ready

    def compile_seconds(self) -> float:
        """The median measured compile (0 before any was measured: nothing to weigh against)."""
        return statistics.median(self._seconds) if self._seconds else 0.0

    def worth_compiling(self, key: Hashable, lost_per_step: float, steps_left: float) -> bool:
        """Whether to compile `key` now, given the seconds each step is expected to lose without
        it and the steps the live requests have left; a step that does not compile it adds its
        loss to `key`'s account."""
        lost = max(lost_per_step, 0.0)
        price = self.compile_seconds()
        if self._eager or lost * steps_left >= price or self._lost[key] + lost >= price:
            return True
        self._lost[key] += lost
        return False

    @contextlib.contextmanager
    def eager(self):
        """Within it, every width worth anything compiles as soon as it is preferred."""
        self._eager, before = True, self._eager
        try:
            yield self
        finally:
            self._eager = before


LEDGER = CompileLedger()
