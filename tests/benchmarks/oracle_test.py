"""The oracle drafter drafts the known continuation, within K and the request's token budget."""

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
