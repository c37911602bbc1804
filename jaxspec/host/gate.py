"""The acceptance-rate gate: stop speculating for good when drafts stop being accepted.

Vocabulary: a request's *drafted* count is the number of real draft tokens verified for it in one
step (padding to the bucket's static K never counts); *accepted* is how many of them the target
model confirmed (the bonus token is not a draft and is not counted). The executor feeds the gate one
sample per iteration: the batch's pooled rate ``sum(accepted) / sum(drafted)``, computed by
`pooled_acceptance_rate`.

The gate follows TensorRT-LLM's ``SpeculationGate``: a rolling window of the last ``window``
samples, no decision before ``window`` samples have been recorded, then speculation is disabled the
first time the window's mean is strictly below ``threshold``. Disabling is permanent until `reset`.

`ReversibleGate` (``gate="reversible"`` on a drafter config) comes back: once disabled it asks for a
short probe draft every ``interval`` iterations, the interval doubling after every failed probe,
and re-enables speculation as soon as the mean of its probes reaches the threshold again.
"""

import collections
from collections.abc import Iterable
import math

from jaxspec._validate import gate_is_active

PROBE_DRAFT_LEN = 2   # a probe verifies a short draft: cheap when the drafts are still bad


class SpeculationGate:
    """Rolling-window acceptance-rate gate.

    Example (window 2, threshold 0.5)::

        gate = SpeculationGate(2, 0.5)
        gate.record_acceptance_rate(0.2)   # (False, None): one sample is not a window
        gate.record_acceptance_rate(0.9)   # (False, 0.55)
        gate.record_acceptance_rate(0.0)   # (True, 0.45): disabled now, and from now on
        gate.record_acceptance_rate(1.0)   # (False, None): no more decisions

    Args:
      window: number of samples averaged; None or 0 means the gate never decides.
      threshold: the mean rate below which speculation stops, in [0, 1]; None means never decide.

    Raises:
      ValueError: a negative window or a threshold outside [0, 1].
    """

    def __init__(self, window: int | None, threshold: float | None):
        if window is not None and (isinstance(window, bool) or not isinstance(window, int)
                                   or window < 0):
            raise ValueError(f"window must be None or an int >= 0, got {window!r}")
        if threshold is not None and (isinstance(threshold, bool)
                                      or not isinstance(threshold, int | float)
                                      or not 0.0 <= threshold <= 1.0):
            raise ValueError(f"threshold must be None or a number in [0, 1], got {threshold!r}")
        self.window = window
        self.threshold = threshold
        self._history: collections.deque[float] = collections.deque(maxlen=window or None)
        self._num_recorded = 0
        self._disabled = False

    @property
    def active(self) -> bool:
        """Whether this gate can ever decide: a non-zero window and a threshold."""
        return gate_is_active(self.window, self.threshold)

    @property
    def disabled(self) -> bool:
        """Whether speculation has been turned off (permanent until `reset`)."""
        return self._disabled

    def allowed(self, draft_len: int) -> int:
        """How much of a `draft_len`-token draft this gate lets through now: all of it, or none
        once speculation is disabled."""
        return 0 if self._disabled else draft_len

    def reset(self) -> None:
        """Forgets every sample and re-enables speculation."""
        self._history.clear()
        self._num_recorded = 0
        self._disabled = False

    def record_acceptance_rate(self, rate: float | None) -> tuple[bool, float | None]:
        """Records one iteration's pooled acceptance rate.

        Args:
          rate: accepted / really drafted for one iteration, in [0, 1]; None (nothing drafted) is
            ignored.

        Returns:
          ``(disabled_now, average)``: `disabled_now` is True only on the call that disables;
          `average` is the window's mean once ``window`` samples have been recorded, else None.
          An inactive or already disabled gate returns ``(False, None)``.

        Raises:
          ValueError: `rate` outside [0, 1] (or NaN), checked even when the gate is inactive so a
            miscounting caller is caught early.
        """
        if rate is None:
            return False, None
        rate = float(rate)
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"acceptance rate must be in [0, 1], got {rate}")
        if self._disabled or not self.active:
            return False, None
        self._history.append(rate)
        self._num_recorded += 1
        if self._num_recorded < self.window:
            return False, None
        # fsum over the window, not a running sum: a running sum drifts by an ulp per update, and
        # a mean exactly at the threshold must not flip the strict comparison.
        average = math.fsum(self._history) / len(self._history)
        if average < self.threshold:
            self._disabled = True
            return True, average
        return False, average


class ReversibleGate(SpeculationGate):
    """A `SpeculationGate` that probes after disabling and re-enables when acceptance recovers.

    While disabled, `tick()` (once per iteration the gate's traffic decodes) returns True every
    `interval` calls: that iteration should verify a short draft, whose rate is recorded as usual.
    The window then holds probe rates only; when their mean is at or above the threshold the gate
    re-enables (and starts a fresh window), else the interval doubles, up to `max_interval`.

    Example (window 2, threshold 0.5, probe_interval 2)::

        gate = ReversibleGate(2, 0.5, probe_interval=2)
        gate.record_acceptance_rate(0.0); gate.record_acceptance_rate(0.2)   # disabled
        gate.tick(), gate.tick()              # (False, True): probe on the second iteration
        gate.record_acceptance_rate(0.1)      # a failed probe: next one after 4 iterations
        [gate.tick() for _ in range(4)]       # [False, False, False, True]
        gate.record_acceptance_rate(0.9)      # probes' mean (0.1 + 0.9) / 2 = 0.5: enabled

    Args:
      window, threshold: as `SpeculationGate`.
      probe_interval: iterations between the first probes, >= 1.
      max_interval: the longest wait between probes.
    """

    def __init__(self, window: int | None, threshold: float | None, *, probe_interval: int = 8,
                 max_interval: int = 256):
        super().__init__(window, threshold)
        if not 1 <= probe_interval <= max_interval:
            raise ValueError(f"need 1 <= probe_interval <= max_interval, got {probe_interval} "
                             f"and {max_interval}")
        self.probe_interval = probe_interval
        self.max_interval = max_interval
        self._interval = probe_interval
        self._waited = 0

    def reset(self) -> None:
        super().reset()
        self._interval = self.probe_interval
        self._waited = 0

    def allowed(self, draft_len: int) -> int:
        """All of the draft while enabled; while disabled, a probe's `PROBE_DRAFT_LEN` tokens
        every `interval` calls (each call counts one iteration, `tick`), else nothing."""
        if not self._disabled:
            return draft_len
        return min(draft_len, PROBE_DRAFT_LEN) if self.tick() else 0

    def tick(self) -> bool:
        """Counts one iteration; True when a disabled gate wants this one to probe."""
        if not self._disabled:
            return False
        self._waited += 1
        if self._waited < self._interval:
            return False
        self._waited = 0
        return True

    def record_acceptance_rate(self, rate: float | None) -> tuple[bool, float | None]:
        """As `SpeculationGate.record_acceptance_rate`; while disabled, `rate` is a probe's."""
        was_disabled = self._disabled
        if was_disabled and rate is not None:
            rate = float(rate)
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"acceptance rate must be in [0, 1], got {rate}")
            self._history.append(rate)
            average = math.fsum(self._history) / len(self._history)
            if average >= self.threshold:
                self.reset()
            else:
                self._interval = min(2 * self._interval, self.max_interval)
            return False, average
        disabled_now, average = super().record_acceptance_rate(rate)
        if disabled_now:
            self._history.clear()          # the window now collects probes
            self._interval, self._waited = self.probe_interval, 0
        return disabled_now, average


def pooled_acceptance_rate(pairs: Iterable[tuple[int, int]]) -> float | None:
    """A batch's acceptance rate, pooled over the requests that really drafted.

    Example: ``pooled_acceptance_rate([(2, 4), (0, 0), (1, 1)])`` is ``3 / 5``; the request with
    nothing drafted is skipped, not counted as a zero.

    Args:
      pairs: ``(accepted, drafted)`` per request, with ``0 <= accepted <= drafted``; `drafted`
        is the real draft length, never the padded one.

    Returns:
      ``sum(accepted) / sum(drafted)`` over the requests with ``drafted > 0``, or None when no
      request drafted anything.

    Raises:
      ValueError: a pair with ``drafted < 0`` or `accepted` outside ``[0, drafted]``.
    """
    total_accepted = total_drafted = 0
    for accepted, drafted in pairs:
        if drafted < 0 or not 0 <= accepted <= drafted:
            raise ValueError(f"need 0 <= accepted <= drafted, got (accepted, drafted) = "
                             f"({accepted}, {drafted})")
        if drafted:
            total_accepted += accepted
            total_drafted += drafted
    if total_drafted == 0:
        return None
    return total_accepted / total_drafted
