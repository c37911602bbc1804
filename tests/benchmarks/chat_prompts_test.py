"""Conversations become prompt ids; earlier turns are answered by plain greedy decoding."""

import pytest

from benchmarks import chat_prompts
from benchmarks.workloads import Conversation
from jaxspec.models import tiny

MODEL = tiny.tiny_model(seed=0)


class CharTokenizer:
    """One token per ASCII character; the chat template tags each message with its role."""

    eos_token_ids = ()

    def encode(self, text):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(map(chr, ids))

    def apply_chat_template(self, messages, add_generation_prompt=True):
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")


TOK = CharTokenizer()


def test_render_interleaves_turns_and_replies():
    conv = Conversation(turns=("first?", "second?"), system="be brief", name="t/0")
    assert TOK.decode(chat_prompts.render(TOK, conv, [])) == (
        "<system>be brief<user>first?<assistant>")
    assert TOK.decode(chat_prompts.render(TOK, conv, ["one"])) == (
        "<system>be brief<user>first?<assistant>one<user>second?<assistant>")
    with pytest.raises(ValueError, match="no user turn"):
        chat_prompts.render(TOK, conv, ["one", "two"])


def test_raw_text_is_encoded_without_the_template():
    conv = Conversation(turns=("Once upon a time",), chat=False, name="t/raw")
    assert TOK.decode(chat_prompts.render(TOK, conv, [])) == "Once upon a time"


def test_earlier_turns_are_answered_greedily(uncached_greedy):
    two = Conversation(turns=("copy abc", "again"), name="t/two")
    one = Conversation(turns=("just one",), name="t/one")
    prompts = chat_prompts.prompt_ids(MODEL, TOK, [two, one], max_new_tokens=6, batch_size=2)
    reply = TOK.decode(uncached_greedy(MODEL, chat_prompts.render(TOK, two, []), 6))
    assert prompts == [chat_prompts.render(TOK, two, [reply]), chat_prompts.render(TOK, one, [])]
