"""The suffix automaton in plain Python: the readable reference, the oracle and the documentation.

A suffix automaton of a text is the smallest automaton that accepts exactly its suffixes. Each
state stands for a set of substrings that end at the same set of positions; vocabulary used here
and in the device code (`jaxspec.sa_layout`, `jaxspec.device.sa_state`):

* `len(s)`: the length of the longest string of state `s`. The state's strings are the suffixes of
  that string whose length lies in `(len(link(s)), len(s)]`.
* `link(s)`: the suffix link, the state of the longest suffix of `s`'s strings that ends at more
  positions. Links form a tree rooted at the root (the empty string, state 0).
* `firstpos(s)`: the end index of the first (leftmost) occurrence of `s`'s strings in the text.
  Drafts continue right after it, which makes them deterministic and equal to TensorRT-LLM's.
* `last`: the state of the whole text.

Construction is the standard online algorithm (Blumer et al.), amortised O(1) per token:

    text = [1, 2, 1, 2]   states after each token (len, link, firstpos)
    extend(1): 1 = "1"              (1, root, 0)
    extend(2): 2 = "12","2"         (2, root, 1)
    extend(1): 3 = "121","21"       (3, 1, 2)     "1" occurs earlier, so link(3) = state 1
    extend(2): 4 = "1212","212"     (4, 2, 3)     link(4) = state 2 ("12","2" end at 1 and 3)
    lookup(): link(last) = 2, len 2, firstpos 1 -> match_len 2, draft continues at index 2: [1, 2]

Draft semantics (DESIGN §3, TensorRT-LLM `suffixAutomaton.h`):

* longest mode (`max_ngram_size == -1`): `match_len` is the length of the longest suffix of the text
  that also occurs earlier; the draft is the text following that suffix's first occurrence.
* fixed mode (`max_ngram_size == M > 0`): try `L = M, M-1, ..., 1` and take the first `L` whose
  length-`L` suffix occurs earlier and with `len(text) >= L + 1`; `match_len = L`.
* global search: the own text's last `min(64 or M, len)` tokens are matched against every active
  automaton; candidates rank by longer match > own slot > longer continuation > lower slot index.

The `naive_*` functions state the same semantics by brute-force substring search, independently of
the automaton; the tests hold every implementation (this one, the host builder, the XLA reference
and the Pallas kernels) to them.
"""

from collections.abc import Iterable
from collections.abc import Sequence
from typing import NamedTuple

from jaxspec import sa_layout


class Match(NamedTuple):
    """Where a draft starts in a text, and the length of the suffix that matched; unpacks as
    `start, length = automaton.lookup()`."""

    start: int  # index of the first continuation token
    length: int  # match_len


class SuffixAutomaton:
    """An online suffix automaton over integer tokens, with firstpos on every state.

    Example:
        >>> sa = SuffixAutomaton([1, 2, 3, 1, 2])
        >>> sa.lookup()
        Match(start=2, length=2)
        >>> sa.draft(draft_len=4)
        (2, [3, 1, 2])
    """

    def __init__(self, tokens: Iterable[int] = ()):
        self.tokens: list[int] = []
        self.len: list[int] = [0]
        self.link: list[int | None] = [None]
        self.firstpos: list[int | None] = [None]
        self.next: list[dict[int, int]] = [{}]
        self.last = 0
        for token in tokens:
            self.extend(token)

    @property
    def num_states(self) -> int:
        return len(self.len)

    def _new_state(self, length: int, link: int | None, firstpos: int | None,
                   edges: dict[int, int]) -> int:
        self.len.append(length)
        self.link.append(link)
        self.firstpos.append(firstpos)
        self.next.append(edges)
        return len(self.len) - 1

    def extend(self, token: int) -> None:
        """Appends one token (Blumer et al.'s online step)."""
        self.tokens.append(token)
        cur = self._new_state(self.len[self.last] + 1, None, len(self.tokens) - 1, {})
        p = self.last
        while p is not None and token not in self.next[p]:
            self.next[p][token] = cur
            p = self.link[p]
        if p is None:
            self.link[cur] = 0
        else:
            q = self.next[p][token]
            if self.len[p] + 1 == self.len[q]:
                self.link[cur] = q
            else:
                # The clone keeps q's first occurrence: its strings are suffixes of q's.
                clone = self._new_state(self.len[p] + 1, self.link[q], self.firstpos[q],
                                        dict(self.next[q]))
                while p is not None and self.next[p].get(token) == q:
                    self.next[p][token] = clone
                    p = self.link[p]
                self.link[q] = clone
                self.link[cur] = clone
        self.last = cur

    def lookup(self) -> Match | None:
        """The longest suffix that also occurs earlier, continued after its first occurrence."""
        s = self.last
        while s != 0:
            if self.firstpos[s] + 1 < len(self.tokens):
                return Match(start=self.firstpos[s] + 1, length=self.len[s])
            s = self.link[s]
        return None

    def lookup_fixed(self, length: int) -> Match | None:
        """The length-`length` suffix, if it occurs earlier (TensorRT-LLM's `lookupFixed`)."""
        if length <= 0 or len(self.tokens) < length + 1:
            return None
        s = self.last
        while s != 0:
            shortest = self.len[self.link[s]] + 1
            if shortest <= length <= self.len[s] and self.firstpos[s] < len(self.tokens) - 1:
                return Match(start=self.firstpos[s] + 1, length=length)
            if self.len[s] < length:
                return None
            s = self.link[s]
        return None

    def lookup_with_suffix(self, suffix: Sequence[int]) -> Match | None:
        """The longest suffix of `suffix` that occurs in this text with a continuation.

        A matching-statistics walk: read `suffix` left to right, dropping to the suffix link
        whenever the current match cannot be extended. A match at the very end of this text has no
        continuation, so it falls back along the links to the longest suffix that occurs earlier.
        """
        s, matched = 0, 0
        for token in suffix:
            while s != 0 and token not in self.next[s]:
                s = self.link[s]
                matched = self.len[s]
            if token in self.next[s]:
                s = self.next[s][token]
                matched += 1
        while s != 0:
            if self.firstpos[s] + 1 < len(self.tokens):
                return Match(start=self.firstpos[s] + 1, length=matched)
            s = self.link[s]
            matched = self.len[s]
        return None

    def match(self, max_ngram_size: int = -1) -> Match | None:
        """`lookup()` for -1, else the first hit of `lookup_fixed(M), ..., lookup_fixed(1)`."""
        sa_layout.check_ngram_size(max_ngram_size)
        if max_ngram_size == -1:
            return self.lookup()
        for length in range(max_ngram_size, 0, -1):
            if (found := self.lookup_fixed(length)) is not None:
                return found
        return None

    def draft(self, draft_len: int, max_ngram_size: int = -1) -> tuple[int, list[int]]:
        """Returns `(match_len, draft)` with `len(draft) <= draft_len`; `(0, [])` on no match."""
        return _draft_from(self.tokens, self.match(max_ngram_size), draft_len)


def global_draft(automata: Sequence[SuffixAutomaton], own: int, active: Sequence[bool],
                 draft_len: int, max_ngram_size: int = -1) -> tuple[int, list[int]]:
    """The global pool search of one request over the active automata.

    Args:
      automata: one automaton per slot.
      own: the requesting slot; its text supplies the query suffix whether or not it is active.
      active: which slots are searched.
      draft_len: the most draft tokens to return.
      max_ngram_size: -1 caps the query suffix at 64 tokens, `M > 0` caps it at `M`.

    Returns:
      `(match_len, draft)`; `(0, [])` when no active slot has a continuation.
    """
    sa_layout.check_ngram_size(max_ngram_size)
    own_tokens = automata[own].tokens
    suffix = own_tokens[max(0, len(own_tokens) - sa_layout.suffix_cap(max_ngram_size)):]
    best_key, best = None, (0, [])
    for slot, (sa, searched) in enumerate(zip(automata, active, strict=True)):
        if not searched or (found := sa.lookup_with_suffix(suffix)) is None:
            continue
        # Ranking: longer match > own slot > longer continuation > lower slot index.
        key = (found.length, slot == own, len(sa.tokens) - found.start, -slot)
        if best_key is None or key > best_key:
            best_key, best = key, _draft_from(sa.tokens, found, draft_len)
    return best


def naive_draft(tokens: Sequence[int], draft_len: int,
                max_ngram_size: int = -1) -> tuple[int, list[int]]:
    """`SuffixAutomaton(tokens).draft(...)` by brute-force substring search (the specification)."""
    sa_layout.check_ngram_size(max_ngram_size)
    n = len(tokens)
    lengths = range(n - 1, 0, -1) if max_ngram_size == -1 else range(min(max_ngram_size, n - 1),
                                                                       0, -1)
    for length in lengths:
        suffix = list(tokens[n - length:])
        # The leftmost occurrence; the one at the very end does not count as "earlier".
        for i in range(n - length):
            if list(tokens[i:i + length]) == suffix:
                return _draft_from(tokens, Match(start=i + length, length=length), draft_len)
    return 0, []


def naive_global_draft(texts: Sequence[Sequence[int]], own: int, active: Sequence[bool],
                       draft_len: int, max_ngram_size: int = -1) -> tuple[int, list[int]]:
    """`global_draft` over plain texts, by brute-force substring search."""
    sa_layout.check_ngram_size(max_ngram_size)
    own_tokens = list(texts[own])
    suffix = own_tokens[max(0, len(own_tokens) - sa_layout.suffix_cap(max_ngram_size)):]
    best_key, best = None, (0, [])
    for slot, (text, searched) in enumerate(zip(texts, active, strict=True)):
        if not searched:
            continue
        text = list(text)
        for length in range(len(suffix), 0, -1):
            # Occurrences followed by at least one token, leftmost first.
            starts = [i + length for i in range(len(text) - length)
                      if text[i:i + length] == suffix[len(suffix) - length:]]
            if starts:
                key = (length, slot == own, len(text) - starts[0], -slot)
                if best_key is None or key > best_key:
                    best_key = key
                    best = _draft_from(text, Match(start=starts[0], length=length), draft_len)
                break
    return best


def _draft_from(tokens: Sequence[int], found: Match | None,
                draft_len: int) -> tuple[int, list[int]]:
    if found is None:
        return 0, []
    return found.length, list(tokens[found.start:found.start + draft_len])
