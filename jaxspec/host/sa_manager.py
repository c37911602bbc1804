"""SAManager: the standalone automaton API (DESIGN §4), device state included.

The engine keeps its automata inside its own device state and uses `SASlots` for the
bookkeeping; `SAManager` is the same bookkeeping plus a device state of its own, for callers that
drive the automata directly:

    manager = SAManager(max_slots=4, max_seq_len=1024, max_num_requests=4)
    manager.add_request("a", prompt_tokens)
    match_len, drafts = manager.extend(["a"], accepted, num_accepted, draft_len=4)
    manager.remove_request("a")
"""

from collections.abc import Hashable
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np

from jaxspec.device import ops
from jaxspec.host.sa_slots import SASlots


class SAManager(SASlots):
    """`SASlots` with its own device automata.

    Attributes:
      state: the device `SAState` over `num_slots + 1` slots.
      active_mask: device bool[num_slots + 1], the slots the global search reads.
      implementation: automaton kernels ("pallas", "xla" or None: Pallas on GPU).
    """

    def __init__(self, max_slots: int, max_seq_len: int, max_num_requests: int,
                 enable_global_pool: bool = False, global_pool_size: int | None = None, *,
                 implementation: ops.Implementation | None = None):
        super().__init__(max_slots, max_seq_len, max_num_requests, enable_global_pool,
                         global_pool_size)
        self.implementation = implementation
        self.state, self.active_mask = self.new_state()

    def prepare(self, request_ids: Sequence[Hashable]) -> np.ndarray:
        """Flushes pending automata and mask changes; returns i32[B] slots (dummy if unknown)."""
        self.state, self.active_mask = self.flush(self.state, self.active_mask)
        return self.slots(request_ids)

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
        return self._run(ops.sa_extend_and_lookup, request_ids, accepted,
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
        return self._run(ops.sa_extend_and_global_search, request_ids, accepted,
                         num_accepted, searches_pool=True, draft_len=draft_len,
                         max_ngram_size=max_ngram_size)
