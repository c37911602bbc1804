"""Frequency-scored drafts: hand-computed cases and a brute-force oracle over every occurrence.

The oracle follows the definition in `jaxspec.host.frequent`'s docstring literally: every match
length, every occurrence found by comparing token lists, the path by counting continuations one
token at a time. The drafter's shortcuts (one path per distinct occurrence set, longest first,
stopping once a path scored its full length, the single-occurrence copy) must change nothing.
"""

import collections
import dataclasses

from absl.testing import absltest
import hypothesis
from hypothesis import strategies as st
import numpy as np

from jaxspec.config import SAConfig
from jaxspec.host import frequent
from jaxspec.host import policy as policy_lib

# Up to three texts over a 4-token alphabet: many repeats, ties and texts ending mid-path.
TEXTS = st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=30), min_size=1, max_size=3)
MAX_MATCH_LENS = st.sampled_from([1, 2, 5, frequent.MAX_MATCH_LEN])
MIN_TOKEN_PROBS = st.sampled_from([0.0, 0.1, 0.4])


def scored(texts, min_match_len, max_match_len):
    """`(m, occurrences)` of every suffix length scored: each length whose occurrences, (text
    index, end position) of every one but the own text's end, are one of the `MAX_SETS` longest
    lengths' distinct lists. The own text is searched last, so that order is recency."""
    own, found = texts[-1], []
    for m in range(min_match_len, min(max_match_len, len(own)) + 1):
        suffix = own[len(own) - m:]
        occurrences = [(i, e) for i, t in enumerate(texts) for e in range(m, len(t) + 1)
                       if t[e - m:e] == suffix and not (i == len(texts) - 1 and e == len(own))]
        if occurrences:
            found.append((m, occurrences))
    kept = []
    for _, occurrences in found:
        if occurrences not in kept:
            kept.append(occurrences)
    kept = kept[-frequent.MAX_SETS:]
    return [(m, occurrences) for m, occurrences in found if occurrences in kept]


def oracle(texts, draft_len, *, min_match_len=1, max_match_len=frequent.MAX_MATCH_LEN,
           min_token_prob=0.1, max_spec_factor=None):
    """(draft, match length) for the last text of `texts`, searching all of them."""
    best, best_score, best_m = [], 0.0, 0
    for m, alive in scored(texts, min_match_len, max_match_len):
        cap = draft_len if max_spec_factor is None else min(draft_len, int(m * max_spec_factor))
        path, prob, score = [], 1.0, 0.0
        while len(path) < cap and alive:
            going = [(i, e) for i, e in alive if e < len(texts[i])]
            if not going:
                break
            counts = collections.Counter(texts[i][e] for i, e in going)
            top = max(counts.values())
            token = [texts[i][e] for i, e in going if counts[texts[i][e]] == top][-1]
            if prob * top / len(alive) < min_token_prob:
                break
            prob *= top / len(alive)
            path.append(token)
            score += prob
            alive = [(i, e + 1) for i, e in going if texts[i][e] == token]
        if path and score >= best_score:
            best, best_score, best_m = path, score, m
    return best, best_m


def tree_oracle(texts, budget, *, min_match_len=1, max_match_len=frequent.MAX_MATCH_LEN,
                min_token_prob=0.1, max_depth=None):
    """{path: (score, the longest suffix length giving that score)} of every path of at most
    `budget` (and `max_depth`) tokens after the last text scoring at least `min_token_prob`
    (the definition in `frequent.frequent_tree`'s docstring, by counting)."""
    best = {}
    longest = budget if max_depth is None else min(budget, max_depth)
    for m, occurrences in scored(texts, min_match_len, max_match_len):
        counts = collections.Counter(tuple(texts[i][e:e + d]) for i, e in occurrences
                                     for d in range(1, longest + 1) if e + d <= len(texts[i]))
        for path, n in counts.items():
            score = n / len(occurrences)
            if score >= min_token_prob and score >= best.get(path, (0.0, 0))[0]:
                best[path] = (score, m)
    return best


def tree_paths(tokens, parents):
    paths = []
    for token, parent in zip(tokens, parents, strict=True):
        paths.append((paths[parent] if parent >= 0 else ()) + (token,))
    return paths


def joined(texts):
    parts = [x for t in texts for x in (t, [frequent.SEPARATOR])]
    return np.concatenate([np.asarray(p, np.int64) for p in parts])


@dataclasses.dataclass
class Req:
    request_id: int
    tokens: list
    max_sequence_length: int = 10_000


class FrequentDraftTest(absltest.TestCase):

    def test_the_most_frequent_continuation_wins(self):
        # The longest earlier suffix is [1, 2]: 4 followed it first ("first" drafts 4), 3 twice
        # since (p = 2/3). After [1, 2, 3], 8 and 9 tie (the latest, 9, wins: p = 1/3), then 1.
        text = [1, 2, 4, 7, 1, 2, 3, 8, 1, 2, 3, 9, 1, 2]
        draft, match = frequent.frequent_draft(joined([text]), len(text), 3)
        self.assertEqual(draft, [3, 9, 1])
        self.assertEqual(match, 2)
        self.assertEqual((draft, match), oracle([text], 3))

    def test_a_tie_goes_to_the_most_recent_occurrence(self):
        text = [7, 1, 7, 2, 7]
        self.assertEqual(frequent.frequent_draft(joined([text]), len(text), 1), ([2], 1))

    def test_only_the_longest_distinct_occurrence_sets_are_scored(self):
        # Periodic text: every suffix length has a set of its own (12 in all), one occurrence
        # fewer each. Among the 8 longest, the path 2, 1, 2, 1 scores best at length 9; every
        # set would have given it to length 1, whose occurrences all continue that way.
        text = [5, 6] + [1, 2] * 12 + [1]
        sets = frequent.occurrence_sets(joined([text]), len(text), 1, 64)
        self.assertEqual(len(sets), frequent.MAX_SETS)
        got = frequent.frequent_draft(joined([text]), len(text), 4)
        self.assertEqual(got, ([2, 1, 2, 1], 9))
        self.assertEqual(got, oracle([text], 4))

    def test_min_token_prob_stops_the_path(self):
        text = [5, 1, 5, 2, 5, 3, 5]       # after 5: 1, 2, 3 once each, p = 1/3
        self.assertEqual(frequent.frequent_draft(joined([text]), len(text), 4,
                                                 min_token_prob=0.5), ([], 0))
        self.assertEqual(frequent.frequent_draft(joined([text]), len(text), 1,
                                                 min_token_prob=0.3), ([3], 1))

    def test_no_occurrence_spans_two_texts(self):
        # The own text [3, 4] occurs across the join of [.., 3] and [4, ..] only.
        other, own = [1, 3], [4, 8, 3, 4]
        draft, match = frequent.frequent_draft(joined([other, own]), 6 + 1, 4)
        self.assertEqual((draft, match), oracle([other, own], 4))

    @hypothesis.settings(max_examples=300, deadline=None)
    @hypothesis.given(
        texts=TEXTS,
        draft_len=st.integers(1, 8), min_match_len=st.integers(1, 3),
        max_match_len=MAX_MATCH_LENS, min_token_prob=MIN_TOKEN_PROBS,
        max_spec_factor=st.sampled_from([None, 0.5, 1.0, 2.5]))
    def test_matches_the_brute_force_oracle(self, texts, draft_len, min_match_len,
                                            max_match_len, min_token_prob, max_spec_factor):
        kw = dict(min_match_len=min_match_len, max_match_len=max_match_len,
                  min_token_prob=min_token_prob, max_spec_factor=max_spec_factor)
        got = frequent.frequent_draft(joined(texts), sum(map(len, texts)) + len(texts) - 1,
                                      draft_len, **kw)
        self.assertEqual(got, oracle(texts, draft_len, **kw))


class FrequentTreeTest(absltest.TestCase):

    def test_both_continuations_of_a_tie_are_drafted(self):
        # After [1, 2]: 3 then 4 once, 5 then 6 once (p = 1/2 each, under the match of 2 as of
        # 1): a budget of 4 holds both paths.
        text = [1, 2, 3, 4, 1, 2, 5, 6, 1, 2]
        tokens, parents, match = frequent.frequent_tree(joined([text]), len(text), 4)
        self.assertEqual(sorted(tree_paths(tokens, parents)),
                         [(3,), (3, 4), (5,), (5, 6)])
        self.assertEqual(match, 2)
        self.assertEqual(frequent.frequent_tree(joined([text]), len(text), 0), ([], [], 0))

    def test_a_tree_of_one_path_is_the_single_occurrence_copy(self):
        text = [4, 5, 6, 7, 8, 4, 5]
        tokens, parents, match = frequent.frequent_tree(joined([text]), len(text), 3)
        self.assertEqual((tokens, parents, match), ([6, 7, 8], [-1, 0, 1], 2))

    # Fewer sets than MAX_SETS, across two texts: all of them are scored.
    @hypothesis.example(texts=[[0, 2, 0, 2, 0], [2, 0, 2, 0, 2, 0]], budget=3, min_match_len=1,
                        max_match_len=5, min_token_prob=0.0, max_depth=None)
    @hypothesis.settings(max_examples=300, deadline=None)
    @hypothesis.given(
        texts=TEXTS,
        budget=st.integers(1, 12), min_match_len=st.integers(1, 3),
        max_match_len=MAX_MATCH_LENS, min_token_prob=MIN_TOKEN_PROBS,
        max_depth=st.sampled_from([None, 1, 2, 4]))
    def test_holds_the_highest_scoring_paths_of_the_brute_force_oracle(
            self, texts, budget, min_match_len, max_match_len, min_token_prob, max_depth):
        kw = dict(min_match_len=min_match_len, max_match_len=max_match_len,
                  min_token_prob=min_token_prob, max_depth=max_depth)
        tokens, parents, match = frequent.frequent_tree(
            joined(texts), sum(map(len, texts)) + len(texts) - 1, budget, **kw)
        expected = tree_oracle(texts, budget, **kw)
        paths = tree_paths(tokens, parents)
        self.assertTrue(all(-1 <= p < i for i, p in enumerate(parents)), parents)
        self.assertEqual(len(set(paths)), len(paths))
        self.assertLessEqual(len(paths), budget)
        # The tree holds `budget` of the best paths (which ones among equal scores is a tie).
        self.assertTrue(set(paths) <= set(expected))
        self.assertEqual(sorted((expected[p][0] for p in paths), reverse=True),
                         sorted((s for s, _ in expected.values()), reverse=True)[:budget])
        self.assertEqual(match, max((expected[p][1] for p in paths), default=0))


class FrequentDrafterTest(absltest.TestCase):

    def config(self, **kw):
        return SAConfig(max_draft_len=4, selection="frequent", min_match_len=1, **kw)

    def test_drafts_follow_the_growing_text_and_the_room(self):
        drafter = frequent.FrequentDrafter(self.config())
        req = Req(0, [1, 2, 3, 1, 2])
        self.assertEqual(drafter.prepare_drafts([req]), ([[3, 1, 2]], [2]))
        req.tokens += [3]
        self.assertEqual(drafter.prepare_drafts([req]), ([[1, 2, 3]], [3]))
        req.max_sequence_length = len(req.tokens) + 2     # room for one draft and the bonus
        self.assertEqual(drafter.prepare_drafts([req])[0], [[1]])
        drafter.update_draft_len(0)
        self.assertEqual(drafter.prepare_drafts([req]), ([[]], [0]))

    def test_trees_count_nodes_as_width_and_cap_depth_by_k_and_room(self):
        drafter = frequent.FrequentDrafter(SAConfig(max_draft_len=2, selection="frequent",
                                                    min_match_len=1, tree_budget=4))
        self.assertEqual(drafter.max_draft_len, 4)
        text = [1, 2, 3, 4, 1, 2, 5, 6, 1, 2]
        req = Req(0, list(text))
        tokens, parents, matches = drafter.prepare_trees([req])
        # Both continuations of [1, 2], two tokens deep (max_draft_len); parents are step
        # inputs: 0 the last token, j the j-th node.
        paths = tree_paths(tokens[0], [p - 1 for p in parents[0]])
        self.assertEqual(sorted(paths), [(3,), (3, 4), (5,), (5, 6)])
        self.assertEqual(matches, [2])
        drafter.update_draft_len(2)
        self.assertEqual(len(drafter.prepare_trees([req])[0][0]), 2)
        drafter.update_draft_len(4)
        req.max_sequence_length = len(text) + 2           # room for one token and the bonus
        tokens, parents, _ = drafter.prepare_trees([req])
        self.assertEqual(sorted(tokens[0]), [3, 5])
        self.assertEqual(parents, [[0, 0]])

    def test_global_pool_searches_live_and_finished_requests(self):
        drafter = frequent.FrequentDrafter(self.config(enable_global_pool=True,
                                                       global_pool_size=1))
        done, live = Req(0, [6, 7, 8, 9]), Req(1, [5, 6, 7])
        drafter.prepare_drafts([done, live])
        drafter.release(0)
        self.assertEqual(drafter.prepare_drafts([live]), ([[8, 9]], [2]))
        private = frequent.FrequentDrafter(self.config())
        self.assertEqual(private.prepare_drafts([Req(1, [5, 6, 7])]), ([[]], [0]))

    def test_min_match_len_and_max_matching_ngram_size_bound_the_match(self):
        text = [1, 2, 3, 9, 2, 3, 8, 2, 3]
        short = frequent.FrequentDrafter(self.config(max_matching_ngram_size=1))
        self.assertEqual(short.prepare_drafts([Req(0, list(text))])[1], [1])
        strict = frequent.FrequentDrafter(SAConfig(max_draft_len=4, selection="frequent",
                                                   min_match_len=3))
        self.assertEqual(strict.prepare_drafts([Req(0, list(text))]), ([[]], [0]))

    def test_policy_resolves_frequent_selection_to_the_host_drafter(self):
        policy = policy_lib.resolve(self.config(adaptive=True), max_batch_size=4)
        self.assertEqual(policy.source, "host")
        self.assertIsInstance(policy.drafter, frequent.FrequentDrafter)
        self.assertTrue(policy.adaptive)
        self.assertEqual(policy_lib.resolve(SAConfig(max_draft_len=4), max_batch_size=4).source,
                         "sa")

    def test_config_validation_names_the_bad_value(self):
        for kw, pattern in [(dict(selection="best"), "selection"),
                            (dict(min_token_prob=1.5), "min_token_prob"),
                            (dict(min_token_prob="x"), "min_token_prob"),
                            (dict(max_spec_factor=0), "max_spec_factor"),
                            (dict(max_spec_factor=True), "max_spec_factor")]:
            with self.assertRaisesRegex(ValueError, pattern):
                SAConfig(max_draft_len=4, **kw)
        with self.assertRaisesRegex(ValueError, "selection='frequent'"):
            frequent.FrequentDrafter(SAConfig(max_draft_len=4))


if __name__ == "__main__":
    absltest.main()
