"""Plain helpers shared by test modules (fixtures live in conftest.py)."""

import numpy as np


def random_prompts(seed: int, lengths, *, vocab_size: int = 128,
                   alphabet_size: int | None = None) -> list[list[int]]:
    """Prompts of the given lengths, drawn from `alphabet_size` distinct tokens (all of the
    vocabulary when None); a small alphabet makes text repeat, so drafters find matches."""
    rng = np.random.default_rng(seed)
    alphabet = (np.arange(vocab_size) if alphabet_size is None
                else rng.choice(vocab_size, alphabet_size, replace=False))
    return [[int(t) for t in rng.choice(alphabet, n)] for n in lengths]


def draft_rows(match_len, draft, lens) -> list[tuple[int, list[int]]]:
    """Per row `(match_len, real draft)` of an automaton lookup, checking the zero fill past each
    row's real length."""
    out = []
    for m, d, n in zip(np.asarray(match_len), np.asarray(draft), np.asarray(lens), strict=True):
        np.testing.assert_array_equal(d[n:], 0)
        out.append((int(m), d[:n].tolist()))
    return out


def random_tree(rows, num_new, seed=2):
    """bool[rows, T, T] the ancestor masks of random token trees (a parent before its child)."""
    rng = np.random.default_rng(seed)
    tree = np.zeros((rows, num_new, num_new), bool)
    for b in range(rows):
        for t in range(num_new):
            tree[b, t, t] = True
            if t:
                tree[b, t] |= tree[b, rng.integers(0, t)]
    return tree
