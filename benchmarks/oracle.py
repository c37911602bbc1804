"""The oracle drafter: drafts each request's true greedy continuation, the ceiling for a given K.

Its drafts always match, so every verify step commits ``K + 1`` tokens (fewer only near the end of
the reply); its speedup over plain decoding is the best any drafter can reach with that K on that
model and machine. A real drafter's speedup divided by the oracle's says how much of that ceiling
it reaches. The continuations come from a plain greedy run on the same prompts.

The oracle knows text nobody has seen yet. `copy_bound` is the ceiling for a drafter that copies
from text already seen (the prompt and the reply so far), as the n-gram pool and the suffix
automaton do: each step it drafts the longest prefix of the true continuation that occurs anywhere
in that text, whichever occurrence holds it. What the reply says for the first time, no such
drafter can draft.
"""

from collections.abc import Sequence

import numpy as np

from jaxspec.host import drafter as drafter_lib


class OracleDrafter(drafter_lib.Drafter):
    """Drafts the known greedy continuation of each prompt.

    Args:
      max_draft_len: K.
      continuations: ``{tuple(prompt token ids): greedy output token ids}``; a request whose prompt
        is not in it gets no drafts.
    """

    def __init__(self, max_draft_len: int, continuations: dict[tuple[int, ...], Sequence[int]]):
        super().__init__(max_draft_len)
        self.continuations = {tuple(p): list(c) for p, c in continuations.items()}

    def prepare_draft_tokens(self, requests) -> list[list[int]]:
        drafts = []
        for request in requests:
            truth = self.continuations.get(tuple(request.prompt), [])
            done = len(request.tokens) - len(request.prompt)
            # A request that may still generate g tokens verifies at most g-1 drafts + the bonus.
            room = request.max_sequence_length - 1 - len(request.tokens)
            drafts.append(truth[done:done + max(0, min(self.draft_len, room))])
        return drafts


def longest_copied_prefix(text: np.ndarray, pattern: Sequence[int]) -> int:
    """The length of the longest prefix of `pattern` that occurs in `text` (contiguously)."""
    starts = np.arange(len(text))
    for j, token in enumerate(pattern):
        starts = starts[starts + j < len(text)]
        starts = starts[text[starts + j] == token]
        if not len(starts):
            return j
    return len(pattern)


def copy_bound(prompt: Sequence[int], output: Sequence[int], max_draft_len: int) -> list[int]:
    """Accepted drafts per verify step of the best drafter that copies from text already seen.

    Decoding starts after the first output token (the prefill's). Each step drafts the longest
    prefix of the true continuation, at most `max_draft_len` tokens and leaving the last output
    token to a bonus, found anywhere in the prompt and the output so far; the step commits those
    drafts and one bonus token.

    Returns:
      The accepted drafts of each step, in order; their mean plus one is the acceptance length.
    """
    text = np.asarray([*prompt, *output])
    accepted, done = [], 1
    while done < len(output):
        room = min(max_draft_len, len(output) - done - 1)
        seen = len(prompt) + done
        a = longest_copied_prefix(text[:seen], output[done:done + room])
        accepted.append(a)
        done += a + 1
    return accepted
