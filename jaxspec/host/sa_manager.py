"""SAManager: request slots for the device suffix automata (TensorRT-LLM's SuffixAutomatonManager).

Lifecycle:

    add_request(rid, prompt)   take a slot (free first, then the oldest retained one) and build
                               the prompt's automaton on the host; the copy is pending
    prepare(request_ids)       copy pending automata and mask changes to the device; map the
                               batch to slots (unknown ids, e.g. padding, -> the dummy slot)
    extend(...)/extend_global  (standalone use) extend + draft in one jitted call; the engine
                               instead runs the same ops inside its step on `manager.state`
    remove_request(rid)        free the slot, or with the global pool keep it searchable
                               (retained, FIFO) while `pool_size > max_num_requests`

The host tracks each request's text length, so a sequence that would outgrow `max_seq_len` is
refused with a ValueError before anything reaches the device. An engine that extends inside its
own step checks `remaining(rid)` before scheduling `1 + K` tokens and reports commits with
`advance`.
"""

import collections
from collections.abc import Hashable, Sequence

import jax.numpy as jnp
import numpy as np

from jaxspec import pallas_kernels
from jaxspec.device import sa_state
from jaxspec.host import sa_build

DEFAULT_GLOBAL_POOL_SIZE = 64  # TensorRT-LLM's floor on the pool when the global pool is on


class SAManager:
    """Slots of device suffix automata for up to `max_num_requests` concurrent requests.

    Attributes:
      num_slots: the pool size; slot `num_slots` is the zeroed dummy slot.
      state: the device `SAState` over `num_slots + 1` slots. The engine's jitted step takes it
        (donated) and writes the result back: `manager.state = new_state`.
      active_mask: device bool[num_slots + 1], the slots the global search reads.
    """

    def __init__(self, max_slots: int, max_seq_len: int, max_num_requests: int,
                 enable_global_pool: bool = False, global_pool_size: int | None = None, *,
                 implementation: pallas_kernels.Implementation | None = None):
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
        self.implementation = implementation
        self.state = sa_state.init_state(pool, max_seq_len)
        self._mask = np.zeros(pool + 1, np.bool_)
        self.active_mask = jnp.asarray(self._mask)
        self._mask_changed = False
        # TensorRT-LLM pops free slots from the end: the first request gets slot pool - 1.
        self._free = list(range(pool))
        self._retained: collections.OrderedDict[int, Hashable] = collections.OrderedDict()
        self._slot: dict[Hashable, int] = {}
        self._length: dict[Hashable, int] = {}
        self._pending: dict[Hashable, sa_state.SAState] = {}

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
        """Tokens `rid`'s automaton can still take."""
        if rid not in self._length:
            raise ValueError(f"unknown request {rid!r}")
        return self.max_seq_len - self._length[rid]

    def prepare(self, request_ids: Sequence[Hashable]) -> np.ndarray:
        """Flushes pending automata and mask changes; returns i32[B] slots (dummy if unknown)."""
        for rid, built in self._pending.items():
            self.state = sa_state.write_slot(self.state, jnp.int32(self._slot[rid]), built)
        self._pending.clear()
        if self._mask_changed:
            self.active_mask = jnp.asarray(self._mask)
            self._mask_changed = False
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

    def _run(self, op, request_ids, accepted, num_accepted, *, searches_pool: bool, **static):
        """Validates the batch, runs `op` on the state, then records the growth."""
        accepted = np.asarray(accepted)
        counts = np.asarray(num_accepted)
        rows = len(request_ids)
        if accepted.ndim != 2 or accepted.shape[0] != rows or counts.shape != (rows,):
            raise ValueError(f"want accepted [{rows}, K+1] and num_accepted [{rows}], got "
                             f"{accepted.shape} and {counts.shape}")
        if counts.size and (counts.min() < 0 or counts.max() > accepted.shape[1]):
            raise ValueError(f"num_accepted must lie in [0, {accepted.shape[1]}], got {counts}")
        live = [rid for rid in request_ids if rid in self._slot]
        if len(set(live)) != len(live):
            raise ValueError(f"a request appears twice in one batch: {list(request_ids)}")
        growth = self._growth(request_ids, counts)
        slots = self.prepare(request_ids)
        extra = (self.active_mask,) if searches_pool else ()  # after prepare's mask flush
        self.state, match_len, draft_tokens, _ = op(
            self.state, jnp.asarray(slots), jnp.asarray(accepted, jnp.int32),
            jnp.asarray(np.where(slots == self.dummy_slot, 0, counts), jnp.int32), *extra,
            implementation=self.implementation, **static)
        for rid, n in growth:
            self._length[rid] += n
        return match_len, draft_tokens

    def extend(self, request_ids: Sequence[Hashable], accepted, num_accepted, draft_len: int,
               max_ngram_size: int = -1):
        """Appends each row's committed tokens to its automaton and drafts from it.

        Args:
          request_ids: B ids; unknown ids (padding) use the dummy slot.
          accepted: int[B, K+1] committed tokens; only the first `num_accepted[b]` are valid.
          num_accepted: int[B] in [0, K+1].
          draft_len: K.
          max_ngram_size: -1 for the longest match, M >= 1 for fixed sizes M..1.

        Returns:
          `(match_len i32[B], draft_tokens i32[B, K])`, zero past each real continuation.

        Raises:
          ValueError: on bad shapes or a request that would outgrow `max_seq_len`.
        """
        return self._run(pallas_kernels.sa_extend_and_lookup, request_ids, accepted,
                         num_accepted, searches_pool=False, draft_len=draft_len,
                         max_ngram_size=max_ngram_size)

    def extend_global(self, request_ids: Sequence[Hashable], accepted, num_accepted,
                      draft_len: int, max_ngram_size: int = -1):
        """`extend`, drafting from the best active slot of the global pool instead.

        Raises:
          ValueError: without `enable_global_pool`, or as `extend`.
        """
        if not self.enable_global_pool:
            raise ValueError("extend_global needs SAManager(enable_global_pool=True)")
        return self._run(pallas_kernels.sa_extend_and_global_search, request_ids, accepted,
                         num_accepted, searches_pool=True, draft_len=draft_len,
                         max_ngram_size=max_ngram_size)
