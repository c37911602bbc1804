"""The acceptance-rate gate: stop speculating for good when drafts stop being accepted.

Vocabulary: a request's *drafted* count is the number of real draft tokens verified for it in one
step (padding to the bucket's static K never counts); *accepted* is how many of them the target
model confirmed (the bonus token is not a draft and is not counted). The executor feeds the gate one
sample per iteration: the batch's pooled rate ``sum(accepted) / sum(drafted)``, computed by
`pooled_acceptance_rate`.

The gate follows TensorRT-LLM's ``SpeculationGate``: a rolling window of the last ``window``
samples, no decision before ``window`` samples have been recorded, then speculation is disabled the
first time the window's mean is strictly below ``threshold``. Disabling is permanent until `reset`.
"""

import collections
from collections.abc import Iterable
import math

from jaxspec._validate import gate_is_active


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
