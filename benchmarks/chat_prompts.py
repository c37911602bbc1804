"""Workload conversations -> prompt token ids, the same ids for every method and for HF.

A conversation of several user turns is played out first: the model's greedy reply to each earlier
turn (plain decoding, at most `max_new_tokens`) is appended as the assistant's message, and the
prompt is the chat up to the last user turn. The reply to that last turn is what gets measured, so
MT-bench's turn 2 ("rewrite your previous response...") can draft from the reply to turn 1.
Raw text (`chat=False`) is encoded as it is.
"""

from collections.abc import Sequence

from benchmarks import runs
from benchmarks.workloads import Conversation


def render(tokenizer, conversation: Conversation, replies: Sequence[str]) -> list[int]:
    """Token ids of the chat: user turns interleaved with `replies`, ending with the open assistant
    header after user turn ``len(replies)``; of the text alone for raw text."""
    if not conversation.chat:
        return tokenizer.encode(conversation.turns[0])
    if len(replies) >= len(conversation.turns):
        raise ValueError(f"{conversation.name}: {len(replies)} replies leave no user turn to answer"
                         f" ({len(conversation.turns)} turns)")
    messages = [] if conversation.system is None else [
        {"role": "system", "content": conversation.system}]
    for turn, reply in zip(conversation.turns[:len(replies)], replies, strict=True):
        messages += [{"role": "user", "content": turn}, {"role": "assistant", "content": reply}]
    messages.append({"role": "user", "content": conversation.turns[len(replies)]})
    return tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True))


def prompt_ids(model, tokenizer, conversations: Sequence[Conversation], *, max_new_tokens: int,
               batch_size: int = 8) -> list[list[int]]:
    """The prompt of each conversation's last turn, earlier turns answered greedily by `model`.

    Args:
      model, tokenizer: what generates the earlier replies (plain greedy decoding).
      conversations: the workload.
      max_new_tokens: length cap of each earlier reply.
      batch_size: how many earlier replies are generated at once.
    """
    stops = set(runs.stop_ids(tokenizer))
    replies: list[list[str]] = [[] for _ in conversations]
    for turn in range(max((len(c.turns) for c in conversations), default=1) - 1):
        pending = [i for i, c in enumerate(conversations) if len(c.turns) > turn + 1]
        prompts = [render(tokenizer, conversations[i], replies[i]) for i in pending]
        run = runs.run_jaxspec(
            model, tokenizer, prompts, spec=None, max_new_tokens=max_new_tokens,
            scheduler=runs.scheduler_for(prompts, max_new_tokens, batch_size))
        for i, output in zip(pending, run.outputs, strict=True):
            replies[i].append(tokenizer.decode([t for t in output if t not in stops]))
    return [render(tokenizer, c, r) for c, r in zip(conversations, replies, strict=True)]
