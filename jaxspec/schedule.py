"""Draft-length schedule and compile buckets.

A *draft-length schedule* maps batch sizes to the draft length K used at that batch size. Each key
is the largest batch size that uses its value (TensorRT-LLM's one-model ``bisect_left`` semantics,
the only one jaxspec has): ``{4: 4, 8: 2, 32: 1}`` gives K=4 for 1..4 requests, 2 for 5..8, 1 for
9..32 and 0 (no speculation) above 32. Speculation pays off when the verify forward is
memory-bound; as the batch grows it becomes compute-bound and extra positions cost real time, hence
smaller K.

A schedule is stored normalised, as a sorted tuple of ``(batch_size, draft_len)`` pairs, so configs
holding one stay hashable (they are static jit arguments). ``max_concurrency=C`` is the one-entry
schedule ``((C, max_draft_len),)``.

*Compile buckets* bound XLA compilations. The step function is compiled once per padded batch size,
and every compilation has a static K. Batches are padded up to the next bucket, so the buckets must
include every schedule key: then K is constant for all batch sizes that share a bucket, and one
compilation per bucket is enough.
"""

import bisect
from collections.abc import Iterable
from collections.abc import Mapping

from jaxspec._validate import check_int

Schedule = tuple[tuple[int, int], ...]


def normalize_schedule(
    draft_len_schedule: Mapping[int, int] | Iterable[tuple[int, int]] | None,
    max_draft_len: int,
    max_concurrency: int | None = None,
) -> Schedule | None:
    """Validates a schedule and returns it as a sorted tuple of pairs, or None.

    Args:
      draft_len_schedule: ``{batch_size: draft_len}`` or an iterable of such pairs, or None.
      max_draft_len: the configured maximum K; the smallest key must map to it.
      max_concurrency: translated into ``((max_concurrency, max_draft_len),)``.

    Returns:
      The schedule as a tuple of ``(batch_size, draft_len)`` pairs sorted by batch size, or None
      when neither a schedule nor a concurrency limit is given (always use ``max_draft_len``).

    Raises:
      ValueError: a key below 1, a value outside ``[0, max_draft_len]``, a smallest key not mapping
        to ``max_draft_len``, a repeated key, an empty schedule, or both arguments given. Giving
        both is accepted only when the schedule is exactly the translation of ``max_concurrency``,
        which is what ``dataclasses.replace`` hands back for a config built with
        ``max_concurrency``.
    """
    max_draft_len = check_int("max_draft_len", max_draft_len, minimum=0)
    translated = None
    if max_concurrency is not None:
        max_concurrency = check_int("max_concurrency", max_concurrency, minimum=1)
        translated = ((max_concurrency, max_draft_len),)
    if draft_len_schedule is None:
        return translated
    pairs = (draft_len_schedule.items() if isinstance(draft_len_schedule, Mapping)
             else draft_len_schedule)
    try:
        pairs = [(k, v) for k, v in pairs]
    except (TypeError, ValueError):
        raise ValueError(f"draft_len_schedule must map batch sizes to draft lengths, "
                         f"got {draft_len_schedule!r}") from None
    normalized = []
    for key, value in pairs:
        key = check_int(f"draft_len_schedule key {key!r}", key, minimum=1)
        value = check_int(f"draft_len_schedule[{key}]", value, minimum=0, maximum=max_draft_len)
        normalized.append((key, value))
    normalized.sort()
    if not normalized:
        raise ValueError(f"draft_len_schedule must not be empty, got {draft_len_schedule!r}")
    keys = [k for k, _ in normalized]
    if len(set(keys)) != len(keys):
        raise ValueError(f"draft_len_schedule repeats a batch size: {draft_len_schedule!r}")
    if normalized[0][1] != max_draft_len:
        raise ValueError(f"draft_len_schedule must map its smallest batch size {keys[0]} to "
                         f"max_draft_len={max_draft_len}, got {normalized[0][1]}")
    normalized = tuple(normalized)
    if translated is not None and normalized != translated:
        raise ValueError(f"max_concurrency={max_concurrency} and draft_len_schedule="
                         f"{draft_len_schedule!r} are mutually exclusive; give one of them")
    return normalized


def draft_len_for_batch_size(
    schedule: Mapping[int, int] | Iterable[tuple[int, int]] | None,
    batch_size: int,
    max_draft_len: int,
    min_draft_len: int = 0,
) -> int:
    """The draft length K for a batch of `batch_size` requests.

    Example: with ``{4: 4, 8: 2, 32: 1}``, batch sizes 1..4 -> 4, 5..8 -> 2, 9..32 -> 1, 33.. -> 0
    (then floored to `min_draft_len`).

    Args:
      schedule: a draft-length schedule (mapping or pairs, see `normalize_schedule`), or None.
      batch_size: the number of requests, >= 0 (0 gives the first value).
      max_draft_len: the configured maximum K.
      min_draft_len: floor applied to the scheduled value (a drafter that must keep its state warm
        drafts at least this much); not applied without a schedule, where K is ``max_draft_len``.

    Returns:
      K, an int in ``[min_draft_len, max_draft_len]``; exactly ``max_draft_len`` with no schedule.

    Raises:
      ValueError: invalid schedule, negative `batch_size`, or `min_draft_len` outside
        ``[0, max_draft_len]``.
    """
    batch_size = check_int("batch_size", batch_size, minimum=0)
    max_draft_len = check_int("max_draft_len", max_draft_len, minimum=0)
    min_draft_len = check_int("min_draft_len", min_draft_len, minimum=0, maximum=max_draft_len)
    if schedule is None:
        return max_draft_len
    pairs = normalize_schedule(schedule, max_draft_len)
    keys = [k for k, _ in pairs]
    index = bisect.bisect_left(keys, batch_size)
    draft_len = pairs[index][1] if index < len(pairs) else 0
    return max(draft_len, min_draft_len)


def batch_buckets(
    max_batch_size: int,
    schedule: Mapping[int, int] | Iterable[tuple[int, int]] | None = None,
    base: Iterable[int] | None = None,
) -> tuple[int, ...]:
    """The padded batch sizes the step function is compiled for.

    `base` (default: powers of two) up to `max_batch_size`, `max_batch_size` itself, and every
    schedule key up to `max_batch_size`, so K is constant inside each bucket. Example:
    ``batch_buckets(12, {3: 4, 8: 2})`` is ``(1, 2, 3, 4, 8, 12)``; with ``base=(4,)`` it is
    ``(3, 4, 8, 12)``.

    Raises:
      ValueError: `max_batch_size` < 1, a schedule key or base bucket below 1.
    """
    max_batch_size = check_int("max_batch_size", max_batch_size, minimum=1)
    buckets = {max_batch_size}
    if base is None:
        power = 1
        while power < max_batch_size:
            buckets.add(power)
            power *= 2
    else:
        for size in base:
            size = check_int(f"batch bucket {size!r}", size, minimum=1)
            if size <= max_batch_size:
                buckets.add(size)
    if schedule is not None:
        keys = schedule.keys() if isinstance(schedule, Mapping) else (k for k, _ in schedule)
        for key in keys:
            key = check_int(f"draft_len_schedule key {key!r}", key, minimum=1)
            if key <= max_batch_size:
                buckets.add(key)
    return tuple(sorted(buckets))


def bucket_for(n: int, buckets: Iterable[int]) -> int:
    """The smallest bucket that holds `n` requests.

    Raises:
      ValueError: `n` < 1, or `n` larger than every bucket.
    """
    n = check_int("n", n, minimum=1)
    buckets = sorted(buckets)
    index = bisect.bisect_left(buckets, n)
    if index == len(buckets):
        raise ValueError(f"no bucket holds n={n} requests; buckets are {tuple(buckets)}")
    return buckets[index]


def should_use_spec_decode(schedule: Schedule | None, max_draft_len: int, num_requests: int,
                           max_batch_size: int, max_num_tokens: int, draft_len: int) -> bool:
    """Whether a batch has the capacity and the concurrency to speculate (TensorRT-LLM's
    ``should_use_spec_decode``).

    The effective batch is ``min(num_requests, max_batch_size, max_num_tokens // (1 + K))``: each
    speculating request needs ``1+K`` tokens of the step's budget. Speculation goes ahead when the
    schedule gives a non-zero K at the effective batch size, so with ``max_concurrency=C`` exactly
    when ``effective <= C`` (inclusive, as in TensorRT-LLM). Without a schedule the answer is True
    whenever there is capacity; unlike TensorRT-LLM it is False with no requests or no capacity
    even then, since there is nothing to speculate on.

    Args:
      schedule: the normalised draft-length schedule, or None.
      max_draft_len: the configured maximum K.
      num_requests: requests that would take part in this step.
      max_batch_size: the engine's batch capacity.
      max_num_tokens: the step's token budget.
      draft_len: K, the draft tokens per request this step.

    Raises:
      ValueError: negative `draft_len`.
    """
    draft_len = check_int("max_total_draft_tokens", draft_len, minimum=0)
    if num_requests <= 0 or max_batch_size <= 0 or max_num_tokens <= 0:
        return False
    token_cap = max_num_tokens // (1 + draft_len)
    if token_cap <= 0:
        return False
    if schedule is None:
        return True
    effective = min(num_requests, max_batch_size, token_cap)
    return draft_len_for_batch_size(schedule, effective, max_draft_len) > 0
