"""Capacity checks before anything is allocated: a configuration the model or the device cannot
hold is a ValueError naming the numbers, not an out-of-memory crash halfway through start-up.

The device arrays an executor allocates up front are the KV pages (`SchedulerConfig.num_pages`,
by default enough for `max_batch_size` sequences of `max_seq_len` plus a draft window) and, with
device automata, `num_slots + 1` automaton slots (`jaxspec.sa_layout.bytes_per_slot`). Weights
are already in memory when the check runs; activations are small next to the cache.
"""

import os

import jax
import numpy as np

from jaxspec import sa_layout
from jaxspec.device import model as model_lib

# Room left for activations, logits and the compiled programs' scratch space.
HEADROOM = 0.9


def kv_bytes(spec: model_lib.CacheSpec, num_pages: int, page_size: int,
             dtype=np.float32) -> int:
    """Bytes of the K and V pages of every layer."""
    per_slot = 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * np.dtype(dtype).itemsize
    return num_pages * page_size * per_slot


def available_bytes(device: jax.Device | None = None) -> int | None:
    """Memory free for new arrays on `device` (default: this process's first), or None if unknown.

    Accelerators report their allocator's limit; the CPU backend reports nothing, so there it is
    the host's available physical memory.
    """
    device = device or jax.local_devices()[0]
    stats = device.memory_stats()
    if stats and "bytes_limit" in stats:
        return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"


def check(spec: model_lib.CacheSpec, config, *, max_draft_len: int, automata=None,
          kv_dtype=np.float32, available: int | None = None) -> None:
    """Raises ValueError when `config` cannot run on this model and device.

    Args:
      spec: the model's cache spec (layers, KV heads, head size, context length).
      config: the `SchedulerConfig`.
      max_draft_len: the largest K (the cache holds 1 + K slots past a sequence's last token).
      automata: the `SASlots` whose device state will be allocated, or None.
      kv_dtype: the KV cache's dtype.
      available: free bytes to check against (default: `available_bytes()`).

    Raises:
      ValueError: `max_seq_len` beyond the model's context length, or KV pages plus automata
        beyond `HEADROOM` of the available memory.
    """
    if spec.max_context_len is not None and config.max_seq_len > spec.max_context_len:
        raise ValueError(f"max_seq_len={config.max_seq_len} exceeds the model's context length "
                         f"of {spec.max_context_len} tokens")
    kv = kv_bytes(spec, config.total_pages(max_draft_len), config.page_size, kv_dtype)
    sa = 0
    if automata is not None:
        sa = (automata.num_slots + 1) * sa_layout.bytes_per_slot(automata.max_seq_len)
    available = available_bytes() if available is None else available
    if available is not None and kv + sa > HEADROOM * available:
        raise ValueError(
            f"max_batch_size={config.max_batch_size} x max_seq_len={config.max_seq_len} needs "
            f"{_gb(kv + sa)} of device memory (KV cache {_gb(kv)}, automata {_gb(sa)}), more "
            f"than {HEADROOM:.0%} of the {_gb(available)} available; lower max_seq_len, "
            f"max_batch_size or num_pages")
