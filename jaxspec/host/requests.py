"""Requests as the host sees them: sampling parameters, lifecycle state, produced tokens, and
the events that report them (`TokenEvent`)."""

import dataclasses
import enum

from jaxspec.host import kv_pages


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """How one request decodes.

    Attributes:
      max_new_tokens: tokens to generate at most (>= 1).
      temperature: 0 = greedy argmax; > 0 samples.
      top_k: keep the k most likely tokens (0 = off).
      top_p: keep the smallest set of most likely tokens with mass >= top_p (1 = off).
      seed: the request's PRNG seed; a token at position p is sampled with fold_in(seed, p), so
        outputs do not depend on batching or speculation.
      stop_token_ids: generation ends after any of these (None = the tokenizer's end tokens).
    """

    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    stop_token_ids: tuple[int, ...] | None = None

    def __post_init__(self):
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an int >= 1, got {self.max_new_tokens!r}")
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not 0 <= self.seed < 2**31:
            raise ValueError(f"seed must be in [0, 2**31), got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def check_prompt(prompt, *, vocab_size: int, max_new_tokens: int, max_seq_len: int) -> list[int]:
    """The prompt as a list of ints, or ValueError naming what makes it unusable.

    Raises:
      ValueError: an empty prompt, ids outside `[0, vocab_size)`, or prompt + max_new_tokens
        beyond max_seq_len.
    """
    prompt = [int(t) for t in prompt]
    if not prompt:
        raise ValueError("prompt is empty")
    bad = [t for t in prompt if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"token ids outside the vocabulary [0, {vocab_size}): {bad[:8]}")
    total = len(prompt) + max_new_tokens
    if total > max_seq_len:
        raise ValueError(f"prompt of {len(prompt)} tokens + max_new_tokens {max_new_tokens} = "
                         f"{total} exceeds max_seq_len={max_seq_len}")
    return prompt


class State(enum.Enum):
    WAITING = "waiting"        # not admitted: no KV pages yet
    PREFILL = "prefill"        # admitted, prompt partly cached
    DECODE = "decode"          # generating
    FINISHED = "finished"


@dataclasses.dataclass(eq=False, kw_only=True)
class Request:
    """A request in flight. Satisfies `jaxspec.host.drafter.DraftRequest`.

    Invariant while decoding: the KV cache holds every token but the last (`num_cached ==
    len(tokens) - 1`); the last token is the next step's input.
    """

    request_id: int
    prompt: list[int]
    params: SamplingParams
    stop_ids: frozenset[int]
    output: list[int] = dataclasses.field(default_factory=list)
    state: State = State.WAITING
    num_cached: int = 0
    pages: kv_pages.SequencePages | None = None
    finish_reason: str | None = None            # "stop", "length" or "cancelled"
    # Speculation statistics, per verify step of this request.
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    acceptance_lengths: list[int] = dataclasses.field(default_factory=list)
    # The automaton's next drafts, reported by the last step or the priming: admitted length and
    # the match length behind them.
    next_draft_len: int = 0
    next_match_len: int = 0
    # With `Executor(record_top2=True)`, per output token: the target's two best logits behind
    # it, and (verify step, index in the step's window, K) — step 0 is the prefill.
    top2: list[tuple[float, float]] | None = None
    windows: list[tuple[int, int, int]] | None = None

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    @property
    def max_sequence_length(self) -> int:
        return len(self.prompt) + self.params.max_new_tokens

    @property
    def finished(self) -> bool:
        return self.state is State.FINISHED

    def append(self, new_tokens) -> list[int]:
        """Appends committed tokens, stopping at a stop token or the length limit.

        Returns the tokens really appended (the stop token included).
        """
        taken = []
        for tok in new_tokens:
            taken.append(int(tok))
            if tok in self.stop_ids:
                self.finish_reason = "stop"
                break
            if len(self.output) + len(taken) >= self.params.max_new_tokens:
                self.finish_reason = "length"
                break
        self.output.extend(taken)
        return taken


@dataclasses.dataclass(frozen=True)
class TokenEvent:
    """Tokens a request committed in one iteration (possibly none, when it was cut short).

    Attributes:
      request_id: the request.
      tokens: the tokens committed this iteration.
      result: on the request's last event, the finished request (output, finish reason,
        counters); None before.
    """

    request_id: int
    tokens: tuple[int, ...]
    result: Request | None = None

    @property
    def finished(self) -> bool:
        return self.result is not None

    @property
    def finish_reason(self) -> str | None:
        return self.result.finish_reason if self.result is not None else None
