"""Capacity a model or device cannot hold fails before allocation, naming the numbers."""

import pytest

from jaxspec import sa_layout
from jaxspec.device import model as model_lib
from jaxspec.host import capacity
from jaxspec.host import sa_slots
from jaxspec.host import scheduler as scheduler_lib

SMOLLM2 = model_lib.CacheSpec(num_layers=30, num_kv_heads=3, head_dim=64, max_context_len=8192)


def test_kv_bytes():
    # 2 (K, V) x 30 layers x 3 heads x 64 x 4 bytes = 46080 bytes per token slot.
    assert capacity.kv_bytes(SMOLLM2, num_pages=10, page_size=16) == 10 * 16 * 46080


def test_max_seq_len_beyond_the_context_is_refused():
    config = scheduler_lib.SchedulerConfig(max_seq_len=10_000)
    with pytest.raises(ValueError, match="max_seq_len=10000 exceeds the model's context length "
                                         "of 8192"):
        capacity.check(SMOLLM2, config, max_draft_len=5, available=10**12)


def test_memory_beyond_the_device_is_refused_with_the_numbers():
    config = scheduler_lib.SchedulerConfig(max_batch_size=8, max_seq_len=8192)
    slots = sa_slots.SASlots(max_slots=8, max_seq_len=8192 + 6, max_num_requests=8)
    kv = capacity.kv_bytes(SMOLLM2, config.total_pages(5), config.page_size)
    sa = 9 * sa_layout.bytes_per_slot(8192 + 6)
    with pytest.raises(ValueError, match=r"max_batch_size=8 x max_seq_len=8192 needs "
                                         rf"{(kv + sa) / 1e9:.2f} GB") as error:
        capacity.check(SMOLLM2, config, max_draft_len=5, automata=slots, available=2 * 10**9)
    assert "2.00 GB available" in str(error.value)
    capacity.check(SMOLLM2, config, max_draft_len=5, automata=slots,
                   available=int((kv + sa) / capacity.HEADROOM) + 1)


def test_unknown_context_and_memory_check_nothing():
    spec = model_lib.CacheSpec(num_layers=1, num_kv_heads=1, head_dim=2)
    capacity.check(spec, scheduler_lib.SchedulerConfig(max_seq_len=10**6), max_draft_len=0,
                   available=10**15)


def test_available_bytes_on_this_machine():
    available = capacity.available_bytes()
    assert available is None or available > 0
