"""The background sampler sees a peak that is gone by the time the block ends."""

import mmap
import time

import pytest

from benchmarks import rss

pytest.importorskip("psutil")

PAGE = 4096


def test_peak_seen_inside_the_block():
    size = 64 << 20
    with rss.PeakRSS(interval_s=0.005) as peak:
        # A fresh anonymous mapping with every page written: resident whatever the allocator
        # holds (a test worker that freed compiled code reuses its heap without growing), and
        # returned to the OS when closed.
        block = mmap.mmap(-1, size)
        for offset in range(0, size, PAGE):
            block[offset] = 1
        deadline = time.monotonic() + 2.0             # the sampler may wait on a busy core
        while peak.mib - peak.start_mib <= 48 and time.monotonic() < deadline:
            time.sleep(0.01)
        block.close()
        time.sleep(0.02)
    assert peak.mib - peak.start_mib > 48
    assert peak.mib - rss.current_mib() > 48


def test_bad_interval():
    with pytest.raises(ValueError, match="interval_s"):
        rss.PeakRSS(interval_s=0)
