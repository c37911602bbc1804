"""Frequency-scored drafts (`SAConfig(selection="frequent")`): SuffixDecoding's choice of draft.

`selection="first"` drafts what followed the first occurrence of the longest suffix of the text
that occurred before (TensorRT-LLM's semantics, the device automaton). Here, every suffix length
m from `min_match_len` to `max_match_len` proposes the path its occurrences agree on most, and the
best-scoring path is drafted (SuffixDecoding, arXiv 2411.04975; ArcticInference's
`suffix_tree.cc`):

    occurrences   every end position e < n with text[e-m:e] == text[n-m:] (the text's own end
                  excluded); a position e "continues" with text[e] if e is not the end of a text.
    path          from the occurrences, repeatedly the token most of them continue with (ties:
                  the token continued by the most recent occurrence); the occurrences that took
                  it go on (the request's own text is searched last, so its latest occurrence
                  is the most recent). The token's probability is the running product of
                  (occurrences taking it) / (occurrences before the choice, ended ones included),
                  and the path stops before a token under `min_token_prob`, at the draft length,
                  or at `max_spec_factor * m` tokens.
    score         the sum of the path's probabilities: its expected number of accepted tokens
                  if each probability were exact. Ties go to the longer match.

Several suffix lengths share the same occurrences (the set only shrinks as m grows); one path is
built per distinct set, at the longest length having it, which is what enumerating every length
would choose. Only the `MAX_SETS` longest distinct sets are scored: in periodic text (a run of
indentation, a repeated row) every other length has a set of its own, and scoring 33 of them
took 5.5 ms a call on the agentic workload, while the shorter sets' paths changed no linear
draft offline (`MAX_SETS`). With the global pool, the other live requests' texts and recently
finished ones are searched too: the texts are joined with a separator no suffix contains, so an
occurrence never spans two texts, and a path ends where its text ends.

Measured offline at K=16 against plain greedy output (8 code-editing prompts, 4 agentic, 4
translation, 2 document QA; 192 tokens each; tokens per verify step, bonus included): first
occurrence 5.28 / 13.80 / 3.86 / 2.36, frequent 5.22 / 15.92 / 5.89 / 2.37. `max_spec_factor` 4
and 2 lost 5-13% on code editing and translation; `min_token_prob` 0.3 lost 3%. Choosing with
hindsight, on code editing, the best occurrence of the longest match gives 6.32 and the best
occurrence of any matched suffix 6.58: what any choice among these occurrences can reach (the
copy bound's 8.39 also counts continuations no suffix of the text precedes). Counting the
occurrence after the one the last accepted draft came from three times (a copy pointer) gave
5.53 on code editing and 6.10 on translation, but 2.27 on document QA and 15.53 on agentic: not
taken.

`frequent_tree` drafts a tree instead: the most probable continuations of every suffix length,
best first, up to a node budget (SuffixDecoding's tree mode). Teacher-forced over the same replies
a tree of N nodes commits at least what a single draft of N does (`benchmarks.draft_quality`,
BENCHMARKS.md); `FrequentDrafter.prepare_trees` hands them to the engine's tree steps
(`SAConfig(tree_budget=N)`, `jaxspec.device.tree`). At 32 nodes on code editing (6.49 tokens a
step), scores decayed by 0.95-0.7 per level of depth gave 6.43-6.02 (deep single paths pay more
than branches), and the copy pointer above at weight 2 or 4 gave 6.58 or 6.65 but 7.21 or 6.93 on
translation (from 7.21): neither taken.
Most of what a tree of 32 leaves on code editing follows no suffix of the text: the reply
rewraps a docstring or renames a name and then copies on. Matching suffixes with whitespace-only
tokens left out (occurrences whose whitespace-free context runs longer than the plain match) gave
6.71-6.74 there but 6.86-6.93 on translation and 4.02 on MT-bench (from 4.04); "resync"
branches (the source after a match of 3+ tokens ending 1-3 tokens back, skipping 0-3 source
tokens) gave 6.68 and 6.93-7.07: neither taken.

This runs on the host, beside the device automaton rather than in it: scoring needs the count of
every continuation of a state, which the automaton's transition layout cannot enumerate, and
keeping occurrence counts online walks every suffix link of each new token (BENCHMARKS.md gives
the host cost per step).
"""

import collections
from collections.abc import Hashable
from collections.abc import Sequence
import heapq

import numpy as np

from jaxspec.config import SAConfig
from jaxspec.host.drafter import Drafter
from jaxspec.host.drafter import DraftRequest

# Longest suffix scored when `max_matching_ngram_size` is -1 (SuffixDecoding's tree depth is 24;
# lengths past 24 changed no draft offline).
MAX_MATCH_LEN = 64
# Distinct occurrence sets scored, the longest matches'. Replayed over plain replies (code
# editing, translation, agentic), 8 commits what scoring every set does with K=16 drafts and
# trees of 16 and 32 (a tree of 64: 7.52 tokens a step on translation, from 7.68), and cut the
# p90 of a call at every position of the agentic replies from 4.98 to 1.42 ms (a tree of 32:
# from 6.30 to 2.14); 4 sets lost 1% on translation.
MAX_SETS = 8
SEPARATOR = -1


def occurrence_sets(text: np.ndarray, end: int, min_len: int, max_len: int
                    ) -> list[tuple[int, np.ndarray]]:
    """`(m, ends)` for each of the `MAX_SETS` longest distinct occurrence sets of the suffix
    `text[end-m:end]`, m ascending within `[min_len, max_len]`, each at the longest m having it.

    Args:
      text: i64[N] the texts, each followed by `SEPARATOR`; the suffix is the one ending at `end`.
      end: where the request's own text ends (its own occurrence, excluded); its text is the
        one that starts after the previous separator.
    """
    separators = np.flatnonzero(text[:end] == SEPARATOR)
    limit = min(max_len, end - (separators[-1] + 1 if len(separators) else 0))
    if limit < 1:
        return []
    ends = np.flatnonzero(text[:-1] == text[end - 1]) + 1
    ends = ends[ends != end]
    sets, m = [], 1
    while len(ends):
        if m == limit:
            if m >= min_len:
                sets.append((m, ends))
            break
        longer = ends[ends > m]
        longer = longer[text[longer - m - 1] == text[end - m - 1]]
        if m >= min_len and len(longer) != len(ends):
            sets.append((m, ends))
        ends, m = longer, m + 1
    return sets[-MAX_SETS:]


def best_path(text: np.ndarray, ends: np.ndarray, cap: int, min_token_prob: float
              ) -> tuple[list[int], float]:
    """The most frequent continuation of the occurrences `ends` (module docstring): (tokens of
    at most `cap`, score)."""
    path, prob, score = [], 1.0, 0.0
    alive = ends
    while len(path) < cap and len(alive):
        if len(alive) == 1:     # one occurrence: its text, at the probability reached
            rest = text[alive[0]:alive[0] + cap - len(path)]
            stop = np.flatnonzero(rest == SEPARATOR)
            rest = rest[:stop[0]] if len(stop) else rest
            path += rest.tolist()
            score += prob * len(rest)
            break
        nxt = alive[text[alive] != SEPARATOR]
        if not len(nxt):
            break
        following = text[nxt]
        if (following == following[0]).all():
            token, top = following[0], len(nxt)
        else:
            tokens, counts = np.unique(following, return_counts=True)
            top = counts.max()
            if (counts == top).sum() == 1:
                token = tokens[counts.argmax()]
            else:       # a tie: the token of the most recent occurrence among the tied ones
                token = following[np.flatnonzero(np.isin(following, tokens[counts == top]))[-1]]
        p = prob * top / len(alive)
        if p < min_token_prob:
            break
        prob = p
        path.append(int(token))
        score += prob
        alive = nxt[following == token] + 1
    return path, score


def frequent_draft(text: np.ndarray, end: int, draft_len: int, *, min_match_len: int = 1,
                   max_match_len: int = MAX_MATCH_LEN, min_token_prob: float = 0.1,
                   max_spec_factor: float | None = None) -> tuple[list[int], int]:
    """(draft of at most `draft_len` tokens, the match length behind it; 0 without a draft)."""
    if draft_len <= 0:
        return [], 0
    best, match = ([], 0.0), 0
    # Longest first: a shorter match must score strictly more, which no path can once one
    # scored its full length (every probability 1).
    for m, ends in reversed(occurrence_sets(text, end, min_match_len, max_match_len)):
        cap = draft_len if max_spec_factor is None else min(draft_len,
                                                            int(m * max_spec_factor))
        if best[1] >= cap:
            continue
        path, score = best_path(text, ends, cap, min_token_prob)
        if score > best[1]:
            best, match = (path, score), m
    return best[0], match


def frequent_tree(text: np.ndarray, end: int, budget: int, *, min_match_len: int = 1,
                  max_match_len: int = MAX_MATCH_LEN, min_token_prob: float = 0.1,
                  max_depth: int | None = None) -> tuple[list[int], list[int], int]:
    """A draft tree of at most `budget` nodes, the most probable continuations first
    (SuffixDecoding's tree mode).

    A node is a path of tokens after the text's end; its score is the largest, over the suffix
    lengths m that `occurrence_sets` scores, of the share of m's occurrences whose
    continuation starts with the path (`best_path`'s running probability along it). The tree
    holds the `budget` highest-scoring paths of score at least `min_token_prob` (ties: the
    longer match, then the path found first); every prefix of a path scores at least what the
    path does, so the set is closed under prefixes. Paths end where their text ends, and at
    `max_depth` tokens (None: the budget).

    Args:
      text, end: as in `occurrence_sets`.

    Returns:
      (tokens, parents, match): node i drafts `tokens[i]` after node `parents[i]` (-1: the text's
      end; a parent comes before its children), and the longest suffix length behind a node
      (0 without one).
    """
    depth_cap = budget if max_depth is None else max_depth
    if budget <= 0 or depth_cap <= 0:
        return [], [], 0
    heap, seq = [], 0

    def push(m, total, parent, alive):
        """The continuations of a path by one more token, among `alive`, the positions after
        the path in each of the `total` occurrences of the suffix of length `m`."""
        nonlocal seq
        nxt = alive[text[alive] != SEPARATOR]
        for token in np.unique(text[nxt]):
            took = nxt[text[nxt] == token]
            heapq.heappush(heap, (-len(took) / total, -m, seq, parent, int(token), took + 1,
                                  total))
            seq += 1

    for m, ends in occurrence_sets(text, end, min_match_len, max_match_len):
        push(m, len(ends), -1, ends)
    tokens, parents, depths, index, match = [], [], [], {}, 0
    while heap and len(tokens) < budget:
        neg_prob, neg_m, _, parent, token, alive, total = heapq.heappop(heap)
        if -neg_prob < min_token_prob:
            break
        node = index.get((parent, token))
        if node is None:            # else the path is in the tree already, at a higher score
            node = index[(parent, token)] = len(tokens)
            tokens.append(token)
            parents.append(parent)
            depths.append(1 + (depths[parent] if parent >= 0 else 0))
            match = max(match, -neg_m)
        if depths[node] < depth_cap:
            push(-neg_m, total, node, alive)
    return tokens, parents, match


class FrequentDrafter(Drafter):
    """The host drafter of `SAConfig(selection="frequent")`.

    Args:
      config: its config; `max_matching_ngram_size` M >= 1 scores suffixes of at most M tokens
        (-1: `MAX_MATCH_LEN`); `min_match_len` the shortest; with `enable_global_pool`, the other
        live requests and up to `global_pool_size` (default: 8) finished ones are searched too.
        With `tree_budget` N > 0 the drafter's width (`max_draft_len`, `draft_len`) counts tree
        nodes, up to N: a schedule's full K stands for N, and `max_draft_len` of the config
        caps the depth.
    """

    def __init__(self, config: SAConfig):
        if config.selection != "frequent":
            raise ValueError(f"FrequentDrafter drafts selection='frequent', got "
                             f"{config.selection!r}")
        width = config.tree_budget or config.max_draft_len
        schedule = config.draft_len_schedule
        if config.tree_budget and schedule is not None:
            schedule = tuple((b, width if k == config.max_draft_len else k) for b, k in schedule)
        super().__init__(width, draft_len_schedule=schedule,
                         acceptance_rate_window_size=config.acceptance_rate_window_size,
                         acceptance_rate_threshold=config.acceptance_rate_threshold,
                         gate=config.gate)
        self.config = config
        self.tree = config.tree_budget > 0
        m = config.max_matching_ngram_size
        self.max_match_len = MAX_MATCH_LEN if m == -1 else m
        self._texts: dict[Hashable, np.ndarray] = {}
        self._finished: collections.deque = collections.deque(
            maxlen=config.global_pool_size or 8)

    def _text(self, request: DraftRequest) -> np.ndarray:
        """The request's tokens as an array, extended by what it committed since the last call."""
        text = self._texts.get(request.request_id)
        tokens = request.tokens
        if text is None or len(text) > len(tokens):
            text = np.asarray(tokens, np.int64)
        elif len(text) < len(tokens):
            text = np.concatenate([text, np.asarray(tokens[len(text):], np.int64)])
        self._texts[request.request_id] = text
        return text

    def _searched(self, requests: Sequence[DraftRequest]):
        """Per request `(joined texts, the room its drafts have)`."""
        texts = [self._text(r) for r in requests]
        for i, request in enumerate(requests):
            # The request's own text goes last, so that "most recent" in a tie means its own.
            others = ([t for j, t in enumerate(texts) if j != i] + list(self._finished)
                      if self.config.enable_global_pool else [])
            parts = [x for t in others for x in (t, [SEPARATOR])] + [texts[i], [SEPARATOR]]
            yield np.concatenate(parts), request.max_sequence_length - 1 - len(texts[i])

    def prepare_draft_tokens(self, requests: Sequence[DraftRequest]) -> list[list[int]]:
        return self.prepare_drafts(requests)[0]

    def prepare_drafts(self, requests: Sequence[DraftRequest]
                       ) -> tuple[list[list[int]], list[int]]:
        """Drafts of at most the runtime K (and the depth cap), and the match length behind
        each."""
        cfg = self.config
        drafts, matches = [], []
        for joined, room in self._searched(requests):
            draft, match = frequent_draft(
                joined, len(joined) - 1, max(0, min(self.draft_len, cfg.max_draft_len, room)),
                min_match_len=cfg.min_match_len, max_match_len=self.max_match_len,
                min_token_prob=cfg.min_token_prob, max_spec_factor=cfg.max_spec_factor)
            drafts.append(draft)
            matches.append(match)
        return drafts, matches

    def prepare_trees(self, requests: Sequence[DraftRequest]
                      ) -> tuple[list[list[int]], list[list[int]], list[int]]:
        """Token trees of at most the runtime width in nodes (`frequent_tree`), as step inputs:
        (tokens, the input each node continues: 0 the request's last token, j the j-th node;
        the match length behind each tree)."""
        cfg = self.config
        trees, parents, matches = [], [], []
        for joined, room in self._searched(requests):
            tokens, up, match = frequent_tree(
                joined, len(joined) - 1, self.draft_len, min_match_len=cfg.min_match_len,
                max_match_len=self.max_match_len, min_token_prob=cfg.min_token_prob,
                max_depth=max(0, min(cfg.max_draft_len, room)))
            trees.append(tokens)
            parents.append([p + 1 for p in up])
            matches.append(match)
        return trees, parents, matches

    def release(self, request_id: Hashable) -> None:
        """Forgets the request; with the global pool its text stays searchable a while."""
        text = self._texts.pop(request_id, None)
        if text is not None and self.config.enable_global_pool:
            self._finished.append(text)
