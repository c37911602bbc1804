"""Peak resident memory over a stretch of code, sampled by a background thread.

`resource.getrusage` only knows the high-water mark of the whole process lifetime, which cannot
tell one method from the next in a benchmark that runs them all in one process. A thread polling
`psutil.Process().memory_info().rss` can:

    with PeakRSS() as peak:
        engine.generate_batch(prompts)
    print(peak.mib)        # highest RSS seen while the block ran (None without psutil)

psutil is in the `bench` extra; without it every reading is None and the tables say so.
"""

import importlib.util
import threading

INTERVAL_S = 0.01  # a decode step takes tens of ms on CPU: short spikes inside one are missed
MIB = 1 << 20


def current_mib() -> float | None:
    """The process's resident memory now, in MiB (None without psutil)."""
    if importlib.util.find_spec("psutil") is None:
        return None
    import psutil

    return psutil.Process().memory_info().rss / MIB


class PeakRSS:
    """Context manager recording the highest RSS (MiB) seen between enter and exit.

    Attributes:
      mib: the peak after the block ends; None without psutil.
      start_mib: RSS when the block started.
    """

    def __init__(self, interval_s: float = INTERVAL_S):
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        self.interval_s = interval_s
        self.mib: float | None = None
        self.start_mib: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _poll(self, process):
        while not self._stop.wait(self.interval_s):
            self.mib = max(self.mib, process.memory_info().rss / MIB)

    def __enter__(self) -> "PeakRSS":
        self.start_mib = current_mib()
        if self.start_mib is None:
            return self
        import psutil

        self.mib = self.start_mib
        self._thread = threading.Thread(target=self._poll, args=(psutil.Process(),), daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info):
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self.mib = max(self.mib, current_mib())
        return False
