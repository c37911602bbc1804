"""Automaton slots on the host: which request owns which slot (TensorRT-LLM's
SuffixAutomatonManager bookkeeping). No device arrays live here: whoever owns the device state
passes it to `flush`, which copies the automata built since the last flush into their slots.

Lifecycle:

    add_request(rid, prompt)   take a slot (free first, then the oldest retained one) and build
                               the prompt's automaton on the host; its copy is pending
    flush(sa, active_mask)     copy pending automata and mask changes into the device arrays
    slots(request_ids)         the batch's slots (unknown ids, e.g. padding, -> the dummy slot)
    advance(request_ids, n)    record the tokens each row's automaton took on the device
    remove_request(rid)        free the slot, or with the global pool keep it searchable
                               (retained, FIFO) while `pool_size > max_num_requests`

The host tracks each request's text length, so a sequence that would outgrow `max_seq_len` is
refused with a ValueError before anything reaches the device.
"""

import collections
from collections.abc import Hashable
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np

from jaxspec import sa_layout
from jaxspec.device import sa_state
from jaxspec.host import sa_build

DEFAULT_GLOBAL_POOL_SIZE = 64  # TensorRT-LLM's floor on the pool when the global pool is on


class SASlots:
    """Slot bookkeeping for up to `max_num_requests` concurrent requests' automata.

    Attributes:
      num_slots: the pool size; slot `num_slots` is the zeroed dummy slot.
    """

    def __init__(self, max_slots: int, max_seq_len: int, max_num_requests: int,
                 enable_global_pool: bool = False, global_pool_size: int | None = None):
        for name, value in (("max_slots", max_slots), ("max_seq_len", max_seq_len),
                            ("max_num_requests", max_num_requests)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if global_pool_size is not None and (not isinstance(global_pool_size, int)
                                             or global_pool_size < 1):
            raise ValueError(f"global_pool_size must be a positive int or None, got "
                             f"{global_pool_size!r}")
        if global_pool_size is not None:
            pool = global_pool_size
        elif enable_global_pool:
            pool = max(DEFAULT_GLOBAL_POOL_SIZE, max_slots)
        else:
            pool = max_slots
        if pool < max_num_requests:
            raise ValueError(f"pool size {pool} (global_pool_size, else max_slots) must be >= "
                             f"max_num_requests {max_num_requests}")
        self.num_slots = pool
        self.max_seq_len = max_seq_len
        self.max_num_requests = max_num_requests
        self.enable_global_pool = enable_global_pool
        self._mask = np.zeros(pool + 1, np.bool_)
        self._mask_changed = False
        # TensorRT-LLM pops free slots from the end: the first request gets slot pool - 1.
        self._free = list(range(pool))
        self._retained: collections.OrderedDict[int, Hashable] = collections.OrderedDict()
        self._slot: dict[Hashable, int] = {}
        self._length: dict[Hashable, int] = {}
        self._pending: dict[Hashable, sa_layout.SAState] = {}

    @property
    def dummy_slot(self) -> int:
        return self.num_slots

    @property
    def _retains(self) -> bool:
        return self.enable_global_pool and self.num_slots > self.max_num_requests

    def _set_mask(self, slot: int, value: bool) -> None:
        if self.enable_global_pool:
            self._mask[slot] = value
            self._mask_changed = True

    def _allocate(self, rid) -> int:
        if self._free:
            return self._free.pop()
        if self._retained:
            slot, _ = self._retained.popitem(last=False)
            self._set_mask(slot, False)
            return slot
        raise RuntimeError(f"no free or retained suffix automaton slot for request {rid!r}: "
                           f"all {self.num_slots} slots are in use")

    def add_request(self, rid: Hashable, tokens: Sequence[int]) -> None:
        """Builds `tokens`' automaton for `rid` (again, if `rid` is known) and queues its copy.

        Raises:
          ValueError: if the tokens exceed `max_seq_len` or are not int32 values.
          RuntimeError: if every slot is taken by a live request.
        """
        if len(tokens) > self.max_seq_len:
            raise ValueError(f"request {rid!r}: {len(tokens)} tokens exceed max_seq_len="
                             f"{self.max_seq_len}")
        built = sa_build.build(tokens, self.max_seq_len)
        if rid not in self._slot:
            self._slot[rid] = self._allocate(rid)
            self._set_mask(self._slot[rid], True)
        self._pending[rid] = built
        self._length[rid] = len(tokens)

    def remove_request(self, rid: Hashable) -> None:
        """Releases `rid`'s slot; unknown ids are ignored (the engine frees every request).

        With the global pool and `pool_size > max_num_requests`, the slot is retained: still
        searched, reused last (FIFO). A request whose automaton never reached the device is
        never retained.
        """
        if rid not in self._slot:
            return
        slot = self._slot.pop(rid)
        never_copied = self._pending.pop(rid, None) is not None
        del self._length[rid]
        if self._retains and not never_copied:
            self._retained[slot] = rid
        else:
            self._set_mask(slot, False)
            self._free.append(slot)

    def remaining(self, rid: Hashable) -> int:
        """Tokens `rid`'s automaton can still take (`advance` refuses more)."""
        if rid not in self._length:
            raise ValueError(f"unknown request {rid!r}")
        return self.max_seq_len - self._length[rid]

    @property
    def has_pending(self) -> bool:
        """Whether `flush` has automata or mask changes to copy."""
        return bool(self._pending) or self._mask_changed

    def new_state(self) -> tuple[sa_layout.SAState, jnp.ndarray]:
        """Zeroed device arrays of this pool's size: `(SAState, active_mask)`, the mask
        bool[num_slots + 1]."""
        return sa_layout.init_state(self.num_slots, self.max_seq_len), jnp.asarray(self._mask)

    def flush(self, sa: sa_layout.SAState, active_mask):
        """Copies pending automata and mask changes into `sa` (donated) and the mask.

        Returns:
          `(sa, active_mask)`, updated.
        """
        for rid, built in self._pending.items():
            sa = sa_state.write_slot(sa, jnp.int32(self._slot[rid]), built)
        self._pending.clear()
        if self._mask_changed:
            active_mask = jnp.asarray(self._mask)
            self._mask_changed = False
        return sa, active_mask

    def slots(self, request_ids: Sequence[Hashable]) -> np.ndarray:
        """i32[B] each id's slot; the dummy slot for unknown ids (padding rows)."""
        return np.asarray([self._slot.get(rid, self.dummy_slot) for rid in request_ids],
                          np.int32)

    def advance(self, request_ids: Sequence[Hashable], num_accepted) -> None:
        """Records that the rows' automata took `num_accepted[b]` tokens (unknown ids: none).

        Raises:
          ValueError: if a request would outgrow `max_seq_len` (naming it), before recording.
        """
        for rid, n in self._growth(request_ids, num_accepted):
            self._length[rid] += n

    def _growth(self, request_ids, num_accepted) -> list[tuple[Hashable, int]]:
        """`(rid, n)` for the known rows, refusing growth past `max_seq_len`."""
        counts = np.asarray(num_accepted)
        if counts.shape != (len(request_ids),):
            raise ValueError(f"num_accepted must have shape ({len(request_ids)},), got "
                             f"{counts.shape}")
        known = [(rid, int(n)) for rid, n in zip(request_ids, counts, strict=True)
                 if rid in self._slot]
        for rid, n in known:
            if self._length[rid] + n > self.max_seq_len:
                raise ValueError(f"request {rid!r} would grow to {self._length[rid] + n} tokens, "
                                 f"beyond max_seq_len={self.max_seq_len}")
        return known

