"""Teacher-forced tokens per step: the walk accepts the deepest drafted path the reply follows."""

from benchmarks import draft_quality
from benchmarks import oracle

PROMPT = [1, 2, 3, 4, 9, 1, 2, 3, 5]
REPLY = [7, 1, 2, 3, 4, 9, 8, 1, 2]


def test_linear_drafts_accept_their_matching_prefix_then_a_bonus():
    def draft(text, room):
        return draft_quality._linear([2, 3, 4, 9][:room])

    # After 7 the reply goes on with 1 (none accepted); after 7, 1 with 2, 3, 4, 9 (all four,
    # then the bonus 8); after that one draft fits before the last token (rejected), and the
    # last token is a bonus alone. Every step commits its accepted drafts and one bonus.
    steps = draft_quality.accepted_steps(PROMPT, REPLY, draft)
    assert steps == [0, 4, 0, 0]
    assert sum(a + 1 for a in steps) == len(REPLY) - 1


def test_a_tree_step_accepts_the_deepest_node_on_the_replys_path():
    # After [7]: a tree with the branches 5-6 and 1-2-3; the reply takes 1, 2, 3, then 4 is the
    # bonus. Rooms cap what a step may accept.
    tree = ([5, 1, 6, 2, 3], [-1, -1, 0, 1, 3])
    steps = draft_quality.accepted_steps(PROMPT, REPLY, lambda t, r: tree if len(t) == 10
                                         else ([], []))
    assert steps[0] == 3 and sum(a + 1 for a in steps) == len(REPLY) - 1
    capped = draft_quality.accepted_steps(PROMPT, REPLY, lambda t, r: tree if len(t) == 10
                                          else ([], []), room_cap=2)
    assert capped[0] == 2


def test_first_occurrence_follows_the_automaton_as_the_text_grows():
    first = draft_quality.FirstOccurrence(3)
    assert first([1, 2, 3, 1, 2], 5) == ([3, 1, 2], [-1, 0, 1])
    assert first([1, 2, 3, 1, 2, 4], 5) == ([], [])
    assert first([1, 2, 3, 1, 2, 4, 1], 1) == ([2], [-1])


def test_per_step_reports_every_drafter_and_the_copy_bounds():
    pairs = [(PROMPT, REPLY)]
    columns = draft_quality.per_step(pairs, 4)
    assert list(columns) == ["first K=4", "frequent K=4", "tree 16", "tree 32", "tree 64",
                             "copy bound K=4", "copy bound K=8"]
    bound = oracle.copy_bound(PROMPT, REPLY, 4)
    assert columns["copy bound K=4"] == 1 + sum(bound) / len(bound)
    # No single copied draft of K beats the copy bound; a tree may (it holds several).
    assert columns["first K=4"] <= columns["copy bound K=4"]
    assert columns["frequent K=4"] <= columns["copy bound K=4"]
    text = draft_quality.markdown({"code_editing": {"prompts": 1, "columns": columns}}, k=4,
                                  max_new_tokens=8)
    assert "| code_editing | 1 |" in text and "tree of 32" in text
