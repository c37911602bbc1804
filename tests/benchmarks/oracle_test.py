"""The oracle drafter drafts the known continuation, within K and the request's token budget."""

import hypothesis
from hypothesis import strategies as st
import pytest

from benchmarks import oracle
from jaxspec.host import requests as requests_lib

PROMPT = [5, 6, 7]
TRUTH = [10, 11, 12, 13, 14, 15, 16, 17]


def request(prompt, output, max_new_tokens=8):
    r = requests_lib.Request(request_id=0, prompt=list(prompt),
                             params=requests_lib.SamplingParams(max_new_tokens=max_new_tokens),
                             stop_ids=frozenset())
    r.output.extend(output)
    return r


@pytest.mark.parametrize("done, want", [
    (1, [11, 12, 13]),          # after the first (prefill) token: the next K of the truth
    (4, [14, 15, 16]),
    (6, [16]),                  # 8 - 1 - 6 = 1 draft fits the budget (plus the bonus token)
    (7, []),                    # the last token is the bonus token alone
])
def test_drafts_the_truth_within_k_and_budget(done, want):
    drafter = oracle.OracleDrafter(3, {tuple(PROMPT): TRUTH})
    assert drafter.prepare_draft_tokens([request(PROMPT, TRUTH[:done])]) == [want]


def test_follows_the_runtime_draft_len_and_each_prompt():
    other = [1, 2]
    drafter = oracle.OracleDrafter(4, {tuple(PROMPT): TRUTH, tuple(other): [40, 41, 42, 43, 44]})
    drafter.update_draft_len(2)
    drafts = drafter.prepare_draft_tokens([request(PROMPT, TRUTH[:1]), request(other, [40])])
    assert drafts == [[11, 12], [41, 42]]


def test_unknown_prompt_gets_no_drafts():
    drafter = oracle.OracleDrafter(3, {tuple(PROMPT): TRUTH})
    assert drafter.prepare_draft_tokens([request([9, 9], [1])]) == [[]]


def brute_force_copy_bound(prompt, output, k):
    """The same bound by slicing: the longest draft that is a substring of the text seen."""
    accepted, done = [], 1
    while done < len(output):
        seen, room = prompt + output[:done], min(k, len(output) - done - 1)
        subs = {tuple(seen[i:j]) for i in range(len(seen) + 1) for j in range(i, len(seen) + 1)}
        a = max(n for n in range(room + 1) if tuple(output[done:done + n]) in subs)
        accepted.append(a)
        done += a + 1
    return accepted


def test_copy_bound_copies_from_anywhere_seen_and_stops_at_new_text():
    prompt = [1, 2, 3, 4, 9, 2, 3, 5]
    # After 2, 3 the first occurrence continues with 4, the later one with 5: the bound takes 5.
    output = [7, 2, 3, 5, 8, 8, 8]
    assert oracle.copy_bound(prompt, output, 4) == [3, 1]        # 8 is seen once drafted past
    assert oracle.copy_bound(prompt, output, 2) == [2, 0, 1]     # the first 8 is new text


@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.given(prompt=st.lists(st.integers(0, 3), max_size=12),
                  output=st.lists(st.integers(0, 3), min_size=1, max_size=12),
                  k=st.integers(1, 5))
def test_copy_bound_matches_brute_force(prompt, output, k):
    assert oracle.copy_bound(prompt, output, k) == brute_force_copy_bound(prompt, output, k)
