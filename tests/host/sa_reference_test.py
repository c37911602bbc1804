"""The pure-Python suffix automaton against hand-computed cases and the brute-force
specification."""

import doctest

from absl.testing import absltest
from absl.testing import parameterized
import hypothesis
from hypothesis import strategies as st

from jaxspec.host import sa_reference

_SETTINGS = hypothesis.settings(max_examples=150, deadline=None, derandomize=True)


def _texts(max_size=40):
    # Alphabets of 2-4 symbols force long repeats.
    return st.integers(2, 4).flatmap(
        lambda v: st.lists(st.integers(0, v - 1), min_size=0, max_size=max_size))


class SuffixAutomatonTest(parameterized.TestCase):

    @parameterized.named_parameters(
        # (tokens, draft_len, max_ngram_size, expected match_len, expected draft)
        dict(testcase_name="empty", tokens=[], k=3, m=-1, match=0, draft=[]),
        dict(testcase_name="single", tokens=[7], k=3, m=-1, match=0, draft=[]),
        dict(testcase_name="no_repeat", tokens=[1, 2, 3], k=3, m=-1, match=0, draft=[]),
        # The continuation may overlap the matched suffix (TensorRT-LLM's test).
        dict(testcase_name="run", tokens=[1, 1, 1, 1, 1], k=4, m=-1, match=4, draft=[1]),
        # First occurrence, not the most recent: "1 2" first ends at index 1 -> continue with 3.
        dict(testcase_name="first_occurrence", tokens=[1, 2, 3, 1, 2, 4, 1, 2], k=2, m=-1,
             match=2, draft=[3, 1]),
        dict(testcase_name="short_continuation", tokens=[5, 6, 5], k=4, m=-1, match=1,
             draft=[6, 5]),
        # Fixed mode reports the n-gram size; the 3-gram "2 1 2" occurs earlier.
        dict(testcase_name="fixed_3", tokens=[1, 2, 1, 2, 1, 2], k=2, m=3, match=3, draft=[1, 2]),
        dict(testcase_name="fixed_caps_longest", tokens=[1, 2, 1, 2, 1, 2], k=2, m=-1, match=4,
             draft=[1, 2]),
        # Fixed mode falls back from M to shorter sizes.
        dict(testcase_name="fixed_fallback", tokens=[4, 1, 2, 3, 9, 2, 3], k=3, m=4, match=2,
             draft=[9, 2, 3]),
        # lookupFixed(L) needs len >= L + 1: [3, 3] matches at L=1 only.
        dict(testcase_name="fixed_needs_l_plus_1", tokens=[3, 3], k=2, m=2, match=1, draft=[3]),
    )
    def test_hand_computed(self, tokens, k, m, match, draft):
        self.assertEqual(sa_reference.SuffixAutomaton(tokens).draft(k, m), (match, draft))
        self.assertEqual(sa_reference.naive_draft(tokens, k, m), (match, draft))

    def test_docstring_examples(self):
        result = doctest.testmod(sa_reference)
        self.assertEqual(result.failed, 0)
        self.assertGreater(result.attempted, 0)

    def test_states_of_worked_example(self):
        sa = sa_reference.SuffixAutomaton([1, 2, 1, 2])
        self.assertEqual(sa.len, [0, 1, 2, 3, 4])
        self.assertEqual(sa.link, [None, 0, 0, 1, 2])
        self.assertEqual(sa.firstpos, [None, 0, 1, 2, 3])

    def test_clone_keeps_first_occurrence(self):
        # "a b b": extending the second b clones state "b" out of "ab"; the clone's firstpos is
        # the original's (index 1), so "b" continues with the second b.
        sa = sa_reference.SuffixAutomaton([0, 1, 1])
        self.assertEqual(sa.num_states, 5)
        self.assertEqual(sa.lookup(), sa_reference.Match(start=2, length=1))

    @parameterized.parameters(0, -2)
    def test_bad_ngram_size(self, m):
        with self.assertRaisesRegex(ValueError, str(m)):
            sa_reference.SuffixAutomaton([1, 2]).draft(3, m)

    @hypothesis.given(tokens=_texts(), k=st.integers(1, 6), m=st.sampled_from([-1, 1, 2, 3, 5]))
    @_SETTINGS
    def test_draft_equals_naive(self, tokens, k, m):
        self.assertEqual(sa_reference.SuffixAutomaton(tokens).draft(k, m),
                         sa_reference.naive_draft(tokens, k, m))

    @hypothesis.given(tokens=_texts(30))
    @_SETTINGS
    def test_online_equals_naive_at_every_prefix(self, tokens):
        sa = sa_reference.SuffixAutomaton()
        for n, token in enumerate(tokens, 1):
            sa.extend(token)
            self.assertEqual(sa.draft(3), sa_reference.naive_draft(tokens[:n], 3))
        self.assertLessEqual(sa.num_states, max(1, 2 * len(tokens)))

    @hypothesis.given(tokens=_texts(30))
    @_SETTINGS
    def test_firstpos_is_first_end(self, tokens):
        sa = sa_reference.SuffixAutomaton(tokens)
        for s in range(1, sa.num_states):
            # Read the state's longest string off its first occurrence and check it is leftmost.
            end, length = sa.firstpos[s], sa.len[s]
            string = tokens[end + 1 - length:end + 1]
            first_end = next(i + length - 1 for i in range(len(tokens))
                             if tokens[i:i + length] == string)
            self.assertEqual(first_end, end)

    @hypothesis.given(data=st.data(), num_slots=st.integers(1, 4), k=st.integers(1, 5),
                      m=st.sampled_from([-1, 1, 2, 4]))
    @_SETTINGS
    def test_global_equals_naive(self, data, num_slots, k, m):
        texts = [data.draw(_texts(25)) for _ in range(num_slots)]
        active = data.draw(st.lists(st.booleans(), min_size=num_slots, max_size=num_slots))
        own = data.draw(st.integers(0, num_slots - 1))
        automata = [sa_reference.SuffixAutomaton(t) for t in texts]
        self.assertEqual(sa_reference.global_draft(automata, own, active, k, m),
                         sa_reference.naive_global_draft(texts, own, active, k, m))

    @parameterized.named_parameters(
        # Equal match lengths: the own slot wins over a longer continuation elsewhere.
        dict(testcase_name="own_slot_wins", texts=[[1, 2, 5, 6, 7, 8], [9, 1, 2, 3, 1, 2]],
             own=1, match=2, draft=[3, 1]),
        # Longer match elsewhere beats the own slot.
        dict(testcase_name="longer_match_wins", texts=[[7, 1, 2, 4], [1, 2, 3, 7, 1, 2]],
             own=1, match=3, draft=[4]),
        # Two other slots tie on match; the longer continuation wins.
        dict(testcase_name="longer_continuation", texts=[[8, 4, 1], [8, 4, 2, 2, 2], [3, 8]],
             own=2, match=1, draft=[4, 2]),
        # Full tie between two other slots: the lower slot index wins.
        dict(testcase_name="lower_slot", texts=[[8, 5], [8, 6], [3, 8]], own=2, match=1,
             draft=[5]),
    )
    def test_global_ranking(self, texts, own, match, draft):
        active = [True] * len(texts)
        automata = [sa_reference.SuffixAutomaton(t) for t in texts]
        self.assertEqual(sa_reference.global_draft(automata, own, active, 2, -1), (match, draft))
        self.assertEqual(sa_reference.naive_global_draft(texts, own, active, 2, -1),
                         (match, draft))

    def test_global_suffix_cap(self):
        # A 70-token repeat matches only its last 64 tokens (TensorRT-LLM's kMaxGlobalSuffixLen).
        block = [i % 5 + (i // 5) * 7 for i in range(70)]
        texts = [block + [99], block]
        automata = [sa_reference.SuffixAutomaton(t) for t in texts]
        self.assertEqual(sa_reference.global_draft(automata, 1, [True, True], 1), (64, [99]))
        self.assertEqual(sa_reference.global_draft(automata, 1, [True, True], 1, 3), (3, [99]))


if __name__ == "__main__":
    absltest.main()
