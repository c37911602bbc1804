"""Adaptive draft length: each iteration, the K that maximises expected committed tokens per second.

For a batch of rows with drafts waiting, row r behind a match of length m_r with d_r real draft
tokens, and a compiled width K:

    tokens(K)  = sum_r 1 + E_r(min(K, d_r))       (acceptance.py: expected accepted drafts)
    seconds(K) = the step-cost model's estimate at (rows bucket, K, context)

and the chosen K maximises tokens(K) / seconds(K) over the compiled widths (`widths`); K = 0 is
plain decoding. A row whose own gain does not pay for the extra positions, `(1 + E_r(K)) /
seconds(K) < 1 / seconds(0)`, gets a zero-length draft: it is not verified and does not count as
drafted (the other rows' drafts decide the width).

Widths are a small fixed set, so each is one compilation per batch bucket, made the first time it
is chosen and worth its compile (compiles.py); until then the best compiled width runs.
"""

import dataclasses

import numpy as np

DRAFT_WIDTHS = (1, 2, 3, 4, 6, 8, 12, 16)


def widths_up_to(max_draft_len: int) -> tuple[int, ...]:
    """K = 0, the widths of `DRAFT_WIDTHS` below `max_draft_len`, and `max_draft_len` itself."""
    return tuple(sorted({0, max_draft_len} | {w for w in DRAFT_WIDTHS if w < max_draft_len}))


@dataclasses.dataclass(frozen=True)
class Choice:
    """A planned width and the rows' draft lengths under it.

    Attributes:
      k: the step's width.
      lens: i32[rows] draft lengths to verify (0 for rows that do not pay).
      expected_tokens: predicted tokens committed by the step.
      seconds: the cost model's estimate of the step.
    """

    k: int
    lens: np.ndarray
    expected_tokens: float
    seconds: float


def choose(widths, seconds, curves, available) -> Choice:
    """The width with the most expected tokens per second, and each row's draft length under it.

    Args:
      widths: the candidate widths, ascending, starting with 0.
      seconds: f64[len(widths)] estimated step time at each width.
      curves: per row, f64[>= max(widths) + 1] expected accepted drafts when verifying L
        positions (`AcceptancePredictor.expected_accepted`).
      available: i32[rows] real draft tokens per row.

    Returns:
      The `Choice`; ties go to the smaller width.
    """
    widths = np.asarray(widths)
    seconds = np.asarray(seconds, np.float64)
    available = np.asarray(available)
    curves = np.asarray(curves, np.float64).reshape(len(available), -1)
    lens = np.minimum(widths[None, :], available[:, None])                  # [rows, widths]
    gains = np.take_along_axis(curves, lens, axis=1)                         # E_r(min(K, d_r))
    tokens = (1 + gains).sum(axis=0)
    best = int(np.argmax(tokens / seconds - 1e-12 * widths))
    k = int(widths[best])
    pays = (1 + gains[:, best]) / seconds[best] >= 1 / seconds[0]
    chosen = np.where(pays, lens[:, best], 0).astype(np.int32)
    return Choice(k=k, lens=chosen, expected_tokens=float(tokens[best]),
                  seconds=float(seconds[best]))
