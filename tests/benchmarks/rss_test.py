"""The background sampler sees a peak that is gone by the time the block ends."""

import time

import numpy as np
import pytest

from benchmarks import rss

pytest.importorskip("psutil")


def test_peak_seen_inside_the_block():
    with rss.PeakRSS(interval_s=0.005) as peak:
        block = np.ones(64 << 20, np.uint8)       # 64 MiB, touched
        time.sleep(0.1)
        del block                                 # large arrays go back to the OS at once
        time.sleep(0.02)
    assert peak.mib - peak.start_mib > 48
    assert peak.mib - rss.current_mib() > 48


def test_bad_interval():
    with pytest.raises(ValueError, match="interval_s"):
        rss.PeakRSS(interval_s=0)
