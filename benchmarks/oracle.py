"""The oracle drafter: drafts each request's true greedy continuation, the ceiling for a given K.

Its drafts always match, so every verify step commits ``K + 1`` tokens (fewer only near the end of
the reply); its speedup over plain decoding is the best any drafter can reach with that K on that
model and machine. A real drafter's speedup divided by the oracle's says how much of that ceiling
it reaches. The continuations come from a plain greedy run on the same prompts.
"""

from collections.abc import Sequence

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
