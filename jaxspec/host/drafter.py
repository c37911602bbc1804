"""The host drafter interface: who drafts, how far, and whether to speculate at all this step.

A *drafter* proposes up to K tokens per request from the text already seen; the target model then
verifies them in one forward over ``1+K`` positions. The executor drives a drafter every iteration:

1. ``K = drafter.draft_len_for_batch_size(batch_size)`` and ``drafter.update_draft_len(K)``;
2. ``drafter.should_use_spec_decode(...)`` decides whether this iteration speculates at all;
3. ``drafts = drafter.prepare_draft_tokens(requests)`` gives one list of 0..K tokens per request;
4. ``tokens, lengths = pad_drafts(drafts, K_bucket)`` pads them to the static K of the compiled
   bucket; `lengths` keeps the real draft lengths, because padding is never verified as a draft and
   never counts as drafted;
5. ``drafter.release(request_id)`` when a request finishes or is cancelled.

A user-defined drafter subclasses `Drafter` and implements `prepare_draft_tokens`. This one drafts
the last token repeated, which pays off inside runs of spaces, dashes or padding::

    class RepeatLastDrafter(Drafter):
        def prepare_draft_tokens(self, requests):
            drafts = []
            for request in requests:
                room = request.max_sequence_length - 1 - len(request.tokens)
                length = max(0, min(self.draft_len, room))
                drafts.append([request.tokens[-1]] * length if request.tokens else [])
            return drafts

    drafter = RepeatLastDrafter(max_draft_len=4, max_concurrency=8)

``room`` keeps the drafts inside the request's token budget: a request that may still generate g
tokens can verify at most g-1 drafts plus the bonus token.
"""

import abc
from collections.abc import Hashable
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from jaxspec import _validate
from jaxspec import schedule as schedule_lib


class DraftRequest(Protocol):
    """What a drafter sees of a request.

    Attributes:
      request_id: unique among live requests; a drafter keys its per-request state by it.
      tokens: the prompt followed by every token generated so far; it only grows.
      max_sequence_length: prompt length plus the request's max_new_tokens.
    """

    request_id: Hashable
    tokens: Sequence[int]
    max_sequence_length: int


class Drafter(abc.ABC):
    """Base class of host drafters: draft-length schedule, batch gate, request lifecycle.

    Args:
      max_draft_len: the largest K this drafter is asked for, >= 1.
      max_concurrency: speculate only while at most this many requests run; stored as the schedule
        ``((max_concurrency, max_draft_len),)``.
      draft_len_schedule: K per batch size (see `jaxspec.schedule`); exclusive with
        `max_concurrency`.
      acceptance_rate_window_size, acceptance_rate_threshold: the acceptance gate the executor
        keeps for this drafter (see `jaxspec.config`); unset means no gate.
      gate: "permanent" or "reversible" (see `jaxspec.config`).

    Raises:
      ValueError: an invalid length, limit, schedule or gate field, or both `max_concurrency` and
        a schedule.
    """

    def __init__(
        self,
        max_draft_len: int,
        max_concurrency: int | None = None,
        draft_len_schedule: Mapping[int, int] | Iterable[tuple[int, int]] | None = None,
        *,
        acceptance_rate_window_size: int | None = None,
        acceptance_rate_threshold: float | None = None,
        gate: str = "permanent",
    ):
        self.max_draft_len = _validate.check_int("max_draft_len", max_draft_len, minimum=1)
        self.draft_len_schedule = schedule_lib.normalize_schedule(
            draft_len_schedule, self.max_draft_len, max_concurrency)
        self.max_concurrency = (None if max_concurrency is None
                                else _validate.check_int("max_concurrency", max_concurrency))
        self.draft_len = self.max_draft_len
        self.acceptance_rate_window_size, self.acceptance_rate_threshold = (
            _validate.check_gate_fields(acceptance_rate_window_size, acceptance_rate_threshold))
        self.gate = _validate.check_gate(gate)

    @property
    def gate_enabled(self) -> bool:
        """Whether the executor watches this drafter's acceptance with a `SpeculationGate`."""
        return _validate.gate_is_active(self.acceptance_rate_window_size,
                                        self.acceptance_rate_threshold)

    @abc.abstractmethod
    def prepare_draft_tokens(self, requests: Sequence[DraftRequest]) -> list[list[int]]:
        """Drafts for every request, in order: each a list of at most `draft_len` tokens.

        A draft may be shorter than `draft_len`, or empty, when nothing good is known.
        """

    def prepare_drafts(self, requests: Sequence[DraftRequest]
                       ) -> tuple[list[list[int]], list[int] | None]:
        """Drafts and, where the drafter knows it, the length of the text match behind each one
        (adaptive K predicts acceptance from it). By default `prepare_draft_tokens`' drafts and
        no match lengths."""
        return self.prepare_draft_tokens(requests), None

    def update_draft_len(self, draft_len: int) -> None:
        """Sets the runtime K, called by the executor every iteration with the scheduled K.

        Raises:
          ValueError: `draft_len` outside ``[0, max_draft_len]``.
        """
        self.draft_len = _validate.check_int("draft_len", draft_len, minimum=0,
                                                maximum=self.max_draft_len)

    def draft_len_for_batch_size(self, batch_size: int) -> int:
        """K for a batch of `batch_size` requests under this drafter's schedule."""
        return schedule_lib.draft_len_for_batch_size(
            self.draft_len_schedule, batch_size, self.max_draft_len)

    def should_use_spec_decode(
        self,
        num_requests: int,
        max_batch_size: int,
        max_num_tokens: int,
        max_total_draft_tokens: int,
    ) -> bool:
        """Whether the batch has the capacity and the concurrency to speculate, under this
        drafter's schedule (`jaxspec.schedule.should_use_spec_decode` says how).

        Raises:
          ValueError: negative `max_total_draft_tokens`.
        """
        return schedule_lib.should_use_spec_decode(
            self.draft_len_schedule, self.max_draft_len, num_requests, max_batch_size,
            max_num_tokens, max_total_draft_tokens)

    def release(self, request_id: Hashable) -> None:  # noqa: B027 (optional hook)
        """Forgets a finished or cancelled request; drafters without per-request state keep this."""


def pad_drafts(drafts: Sequence[Sequence[int]], k: int) -> tuple[np.ndarray, np.ndarray]:
    """Pads (or truncates) drafts to the static K of a compiled bucket.

    Example: ``pad_drafts([[7, 8], [], [1, 2, 3, 4]], 3)`` gives tokens
    ``[[7, 8, 0], [0, 0, 0], [1, 2, 3]]`` and lengths ``[2, 0, 3]``.

    Args:
      drafts: one list of draft tokens per row.
      k: the static draft length, >= 0.

    Returns:
      ``(tokens, lengths)``: tokens int32[B, k] padded with token 0, and lengths int32[B], the real
      draft length of each row after truncation to `k`.

    Raises:
      ValueError: negative `k`.
    """
    k = _validate.check_int("k", k, minimum=0)
    tokens = np.zeros((len(drafts), k), np.int32)
    lengths = np.zeros((len(drafts),), np.int32)
    for row, draft in enumerate(drafts):
        length = min(len(draft), k)
        tokens[row, :length] = draft[:length]
        lengths[row] = length
    return tokens, lengths
