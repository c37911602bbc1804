"""Text <-> token ids for a loaded model, on top of the Rust `tokenizers` library.

The loaders build the `tokenizers.Tokenizer` (from GGUF metadata or an HF `tokenizer.json`) and
hand it here together with what the model says about special tokens: which id is BOS, whether the
model wants it prepended, which ids end generation, and the Jinja chat template.

Streaming: a byte-level BPE token can end in the middle of a multi-byte UTF-8 character, so
decoding tokens one at a time would print replacement characters. `StreamDecoder` holds such
tokens back until the character is complete:

    text     "你好"  (SmolLM2: 4 tokens; the first and third each end inside a character)
    add(.)   ""   "你"   ""   "好"
"""

from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
import dataclasses
import functools
import json

import jinja2
import jinja2.ext
import jinja2.sandbox
import tokenizers

# What byte-level decoding yields for an incomplete UTF-8 sequence at the end of its input.
_REPLACEMENT = "\ufffd"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Tokenizer:
    """A model's tokenizer.

    Attributes:
      backend: the `tokenizers.Tokenizer` that does the work (special tokens registered as added
        tokens, so `<|im_start|>` in text encodes to its single id).
      bos_token_id: the beginning-of-sequence id, or None when the model has none.
      add_bos: whether `encode` prepends `bos_token_id`.
      eos_token_ids: ids that end generation, in the model's order of preference.
      chat_template: the model's Jinja chat template, or None.
    """

    backend: tokenizers.Tokenizer
    bos_token_id: int | None
    add_bos: bool
    eos_token_ids: tuple[int, ...]
    chat_template: str | None

    def __post_init__(self):
        if self.add_bos and self.bos_token_id is None:
            raise ValueError("add_bos=True needs a bos_token_id, got None")
        ids = (() if self.bos_token_id is None else (self.bos_token_id,)) + self.eos_token_ids
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"special token ids {bad} are outside the vocabulary of size "
                             f"{self.vocab_size}")
        if not self.eos_token_ids:
            raise ValueError("eos_token_ids must not be empty: generation needs a stop token")

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; special tokens written in the text map to their ids.

        BOS is prepended only when the model asks for it (`add_bos`) and the text does not already
        start with it (chat templates that write `{{ bos_token }}` themselves).
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        ids = self.backend.encode(text, add_special_tokens=False).ids
        if self.add_bos and ids[:1] != [self.bos_token_id]:
            ids.insert(0, self.bos_token_id)
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        """The text of `ids`, special tokens included (so `decode(encode(s)) == s`)."""
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"token ids {bad[:8]} are outside the vocabulary of size "
                             f"{self.vocab_size}")
        return self.backend.decode(ids, skip_special_tokens=False)

    def stream_decoder(self) -> "StreamDecoder":
        return StreamDecoder(self)

    def apply_chat_template(self, messages: Sequence[Mapping[str, str]], *,
                            add_generation_prompt: bool = True) -> str:
        """Renders a conversation with the model's chat template.

        Args:
          messages: dicts with "role" and "content", e.g.
            `[{"role": "user", "content": "Hi"}]`.
          add_generation_prompt: end with the header that opens the assistant's turn.

        Raises:
          ValueError: the model has no chat template, or a message lacks role/content.
        """
        if self.chat_template is None:
            raise ValueError("this model has no chat template; pass a plain prompt instead")
        if not messages:
            raise ValueError("messages must not be empty")
        for i, m in enumerate(messages):
            if not isinstance(m, Mapping) or not {"role", "content"} <= m.keys():
                raise ValueError(f"message {i} needs 'role' and 'content' keys, got {m!r}")
        special = lambda i: None if i is None else self.backend.id_to_token(i)  # noqa: E731
        return _compile_template(self.chat_template).render(
            messages=[dict(m) for m in messages], add_generation_prompt=add_generation_prompt,
            bos_token=special(self.bos_token_id) or "",
            eos_token=special(self.eos_token_ids[0]))


class StreamDecoder:
    """Incremental detokenization: the text each new token completes.

    Concatenating the strings returned by `add`, then `flush`, gives `decode(all ids)`. A chunk
    never ends inside a multi-byte character. Decoding restarts from the previous chunk's tokens
    (not from the new token alone) because some decoders depend on context, such as SentencePiece
    dropping the leading space of the first token.
    """

    def __init__(self, tokenizer: Tokenizer):
        self._tokenizer = tokenizer
        self._ids: list[int] = []
        self._prefix = 0      # first id of the window decoded for context
        self._read = 0        # ids before this are already emitted

    def add(self, token_id: int) -> str:
        """Feeds one token and returns the text it completes ("" while a character is partial)."""
        self._ids.append(int(token_id))
        prefix_text = self._tokenizer.decode(self._ids[self._prefix:self._read])
        text = self._tokenizer.decode(self._ids[self._prefix:])
        if len(text) <= len(prefix_text) or text.endswith(_REPLACEMENT):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return text[len(prefix_text):]

    def flush(self) -> str:
        """The text held back at the end of the stream (with replacement characters if the
        tokens really end in an invalid byte sequence)."""
        prefix_text = self._tokenizer.decode(self._ids[self._prefix:self._read])
        text = self._tokenizer.decode(self._ids[self._prefix:])
        self._prefix = self._read = len(self._ids)
        return text[len(prefix_text):]


@functools.lru_cache(maxsize=8)
def _compile_template(source: str) -> jinja2.Template:
    # Chat templates come from model files, so they are untrusted code: render them sandboxed, with
    # the environment options and helpers Hugging Face's templates are written against.
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(source)
