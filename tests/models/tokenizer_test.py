"""The SmolLM2 tokenizer built from GGUF metadata: round trips, the digit split, chat template,
streaming detokenization and argument checks."""

import dataclasses
import inspect
import json

import hypothesis
import hypothesis.strategies as st
import pytest
import tokenizers

SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


@pytest.fixture(scope="module")
def tok(smollm2):
    return smollm2[1]


def test_round_trip_on_code_with_digits_and_special_tokens(tok):
    source = inspect.getsource(json.JSONEncoder.iterencode)
    text = f"<|im_start|>user\nFix this (version 3.12, line 1024):\n{source}<|im_end|>\n"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert ids[0] == tok.token_to_id("<|im_start|>") == 1
    assert ids.count(tok.token_to_id("<|im_end|>")) == 1


def test_special_tokens_encode_whole_and_no_bos_is_added(tok):
    assert tok.encode("<|im_start|><|im_end|><|endoftext|>") == [1, 2, 0]
    assert tok.encode("hello")[0] != tok.bos_token_id
    assert (tok.bos_token_id, tok.add_bos, tok.vocab_size) == (1, False, 49152)
    assert tok.eos_token_ids == (2, 0)


def test_digits_are_split_one_by_one_after_byte_level(tok):
    assert tok.backend.encode("x = 12345  1").tokens == [
        "x", "Ġ=", "Ġ", "1", "2", "3", "4", "5", "ĠĠ", "1"]
    assert tok.backend.pre_tokenizer.pre_tokenize_str("in 2024") == [
        ("in", (0, 2)), ("Ġ", (2, 3)), ("2", (3, 4)), ("0", (4, 5)), ("2", (5, 6)), ("4", (6, 7))]


def test_chat_template_renders_chatml(tok):
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "What is 2+2?"}]
    assert tok.apply_chat_template(messages) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n")


def test_chat_template_adds_default_system_prompt(tok):
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]
    assert tok.apply_chat_template(messages, add_generation_prompt=False) == (
        f"<|im_start|>system\n{SMOLLM2_SYSTEM}<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n")


def test_chat_template_helpers_and_errors(tok):
    templated = dataclasses.replace(tok, chat_template=(
        "{% if messages|length > 1 %}{{ raise_exception('one message only') }}{% endif %}"
        "{{ messages[0] | tojson }}"))
    assert templated.apply_chat_template([{"role": "user", "content": "é"}]) == (
        '{"role": "user", "content": "é"}')
    with pytest.raises(Exception, match="one message only"):
        templated.apply_chat_template([{"role": "user", "content": "a"}] * 2)
    with pytest.raises(ValueError, match="no chat template"):
        dataclasses.replace(tok, chat_template=None).apply_chat_template(
            [{"role": "user", "content": "a"}])
    with pytest.raises(ValueError, match="'role' and 'content'"):
        tok.apply_chat_template([{"role": "user"}])
    with pytest.raises(ValueError, match="must not be empty"):
        tok.apply_chat_template([])


def test_add_bos_prepends_once(tok):
    with_bos = dataclasses.replace(tok, add_bos=True)
    assert with_bos.encode("hi") == [1] + tok.encode("hi")
    assert with_bos.encode("<|im_start|>hi") == tok.encode("<|im_start|>hi")


@pytest.mark.parametrize("kwargs, message", [
    (dict(add_bos=True, bos_token_id=None), "needs a bos_token_id"),
    (dict(eos_token_ids=(49152,)), r"\[49152\] are outside the vocabulary of size 49152"),
    (dict(eos_token_ids=()), "eos_token_ids must not be empty"),
])
def test_invalid_special_tokens_are_rejected(tok, kwargs, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(tok, **kwargs)


def test_decode_rejects_ids_outside_the_vocabulary(tok):
    with pytest.raises(ValueError, match=r"\[-1, 49152\]"):
        tok.decode([5, -1, 49152])
    with pytest.raises(TypeError, match="must be a str"):
        tok.encode(b"bytes")


def test_stream_holds_back_partial_characters(tok):
    ids = tok.encode("你好")
    decoder = tok.stream_decoder()
    assert [decoder.add(i) for i in ids] == ["", "你", "", "好"]
    assert decoder.flush() == ""


@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(text=st.lists(st.sampled_from(
    list("ab 1\n\t") + ["é", "你", "好", "🙂", "∑", "<|im_end|>"]), max_size=30).map("".join))
def test_stream_chunks_are_whole_characters_that_join_to_the_text(tok, text):
    decoder = tok.stream_decoder()
    chunks = [decoder.add(i) for i in tok.encode(text)] + [decoder.flush()]
    assert "".join(chunks) == text
    assert not any("\ufffd" in c for c in chunks)


# Single-byte tokens of the byte-level alphabet, most of them UTF-8 lead or continuation bytes, so
# random sequences are full of incomplete and invalid characters.
_BYTE_SYMBOLS = [c for c in tokenizers.pre_tokenizers.ByteLevel.alphabet() if ord(c) > 0x7F]


@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(ids=st.lists(st.one_of(st.integers(0, 49151), st.sampled_from(_BYTE_SYMBOLS)),
                               max_size=25))
def test_stream_of_any_ids_joins_to_decode(tok, ids):
    ids = [i if isinstance(i, int) else tok.token_to_id(i) for i in ids]
    ids = [i for i in ids if i is not None]       # a few byte symbols are not in SmolLM2's vocab
    decoder = tok.stream_decoder()
    chunks = [decoder.add(i) for i in ids] + [decoder.flush()]
    assert "".join(chunks) == tok.decode(ids)
