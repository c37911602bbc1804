"""The user-facing engine: text or token ids in, generated tokens (streamed or whole) out.

    import jaxspec as js
    engine = js.Engine.load()                                 # SmolLM2-135M-Instruct, AUTO spec
    out = engine.generate("Rewrite this function ...", max_new_tokens=128)
    print(out.text, out.stats["tokens_per_s"])
    for piece in engine.stream("Tell me a story", max_new_tokens=64):
        print(piece, end="", flush=True)

A string prompt is wrapped in the model's chat template (pass `chat=False` to feed it raw); a list
of ints is used as token ids as is. A list of prompts runs as one continuous batch.
"""

import dataclasses
from collections.abc import Iterator, Sequence

from jaxspec import config as config_lib
from jaxspec.host import drafter as drafter_lib
from jaxspec.host import executor as executor_lib
from jaxspec.host import requests as requests_lib
from jaxspec.host import scheduler as scheduler_lib

SPEC_NAMES = ("none", "sa", "ngram", "auto")
DEFAULT_DRAFT_LEN = 5


def spec_from_name(name: str, max_draft_len: int | None = None):
    """The spec config a CLI/API name stands for ("none", "sa", "ngram", "auto")."""
    k = DEFAULT_DRAFT_LEN if max_draft_len is None else max_draft_len
    if name == "none":
        return None
    if name == "sa":
        return config_lib.SAConfig(max_draft_len=k)
    if name == "ngram":
        return config_lib.NGramConfig(max_draft_len=k, max_matching_ngram_size=3)
    if name == "auto":
        if max_draft_len is not None:
            raise ValueError("spec 'auto' chooses its own max_draft_len; do not pass one")
        return config_lib.AutoConfig()
    raise ValueError(f"unknown spec {name!r}; expected one of {SPEC_NAMES}")


@dataclasses.dataclass(frozen=True)
class Generation:
    """One request's result.

    Attributes:
      token_ids: generated token ids (the stop token included when one ended generation).
      text: their decoded text (the stop token left out), or None without a tokenizer.
      finish_reason: "stop", "length" or "cancelled".
      stats: the request's speculation counters.
    """

    token_ids: list[int]
    text: str | None
    finish_reason: str
    stats: dict


@dataclasses.dataclass(frozen=True)
class BatchResult:
    """Results in prompt order, with the run's metrics (`jaxspec.host.stats`)."""

    generations: list[Generation]
    stats: dict


class Engine:
    """Continuous-batching generation with model-free speculation.

    Args:
      model: a `jaxspec.device.model.CausalLM` NNX module.
      tokenizer: a `jaxspec.models.tokenizer.Tokenizer`, or None to work on token ids only.
      spec: "none" | "sa" | "ngram" | "auto", a spec config (`NGramConfig`, `SAConfig`,
        `AutoConfig`), a `Drafter` instance, or None.
      scheduler: capacity; the defaults fit batch 8 of 2048-token sequences.
      sa_implementation: "pallas", "xla" or None (Pallas on GPU, XLA elsewhere).
    """

    def __init__(self, model, tokenizer=None, *, spec="auto",
                 scheduler: scheduler_lib.SchedulerConfig | None = None,
                 sa_implementation: str | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.scheduler_config = scheduler or scheduler_lib.SchedulerConfig()
        self.sa_implementation = sa_implementation
        self._spec = None
        self._executor = None
        self.set_spec(spec)

    @classmethod
    def load(cls, path: str | None = None, **kwargs) -> "Engine":
        """An engine over a GGUF file or HF-layout directory (None = the embedded SmolLM2)."""
        from jaxspec import models

        model, tokenizer = models.load(path)
        return cls(model, tokenizer, **kwargs)

    def set_spec(self, spec):
        """Switches the speculation method (a new executor: the KV cache is reallocated)."""
        if isinstance(spec, str):
            spec = spec_from_name(spec)
        if not (spec is None or isinstance(spec, (config_lib.NGramConfig, config_lib.SAConfig,
                                                  config_lib.AutoConfig, drafter_lib.Drafter))):
            raise TypeError(f"spec must be a name in {SPEC_NAMES}, a spec config, a Drafter or "
                            f"None; got {spec!r}")
        if self._executor is not None and spec == self._spec:
            return
        self._spec = spec
        self._executor = None              # free the old cache before allocating the new one
        self._executor = executor_lib.Executor(
            self.model, scheduler_config=self.scheduler_config, spec=spec,
            sa_implementation=self.sa_implementation)

    @property
    def executor(self) -> executor_lib.Executor:
        return self._executor

    # ------------------------------------------------------------------ prompts

    def encode_prompt(self, prompt, *, chat: bool = True) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("a text prompt needs a tokenizer; pass token ids instead")
            if not prompt:
                raise ValueError("prompt is empty")
            if chat and self.tokenizer.chat_template:
                prompt = self.tokenizer.apply_chat_template(
                    [{"role": "user", "content": prompt}], add_generation_prompt=True)
            return self.tokenizer.encode(prompt)
        if isinstance(prompt, Sequence) and all(isinstance(t, int) for t in prompt):
            if not prompt:
                raise ValueError("prompt is empty")
            return list(prompt)
        raise TypeError(f"a prompt is a string or a list of token ids, got {type(prompt).__name__}")

    def _params(self, params: requests_lib.SamplingParams | None, kwargs):
        if params is None:
            params = requests_lib.SamplingParams(**kwargs)
        elif kwargs:
            raise ValueError(f"pass either params or sampling keywords, not both: {sorted(kwargs)}")
        stops = params.stop_token_ids
        if stops is None:
            stops = self.tokenizer.eos_token_ids if self.tokenizer else ()
        return params, frozenset(stops)

    # ------------------------------------------------------------------ generation

    def _submit(self, prompts, params: requests_lib.SamplingParams, stops, chat: bool):
        ids = [self.encode_prompt(p, chat=chat) for p in prompts]
        # Validate every prompt before queuing any, so a bad one changes nothing.
        for tokens in ids:
            bad = [t for t in tokens if not 0 <= t < self.model.vocab_size]
            if bad:
                raise ValueError(f"token ids outside the vocabulary [0, {self.model.vocab_size})"
                                 f": {bad[:8]}")
            total = len(tokens) + params.max_new_tokens
            if total > self.scheduler_config.max_seq_len:
                raise ValueError(f"prompt of {len(tokens)} tokens + max_new_tokens "
                                 f"{params.max_new_tokens} = {total} exceeds max_seq_len="
                                 f"{self.scheduler_config.max_seq_len}")
        return [self._executor.add_request(t, params, stops) for t in ids]

    def _text(self, tokens: list[int], stops) -> str | None:
        if self.tokenizer is None:
            return None
        return self.tokenizer.decode([t for t in tokens if t not in stops])

    def generate_batch(self, prompts: Sequence, *, params=None, chat: bool = True,
                       spec=None, **sampling) -> BatchResult:
        """Runs all prompts as one continuous batch; results in prompt order."""
        if spec is not None:
            self.set_spec(spec)
        ex = self._executor
        ex.stats = ex.stats.__class__()
        params, stops = self._params(params, sampling)
        rids = self._submit(prompts, params, stops, chat)
        while ex.has_work():
            ex.step()
        gens = []
        for rid in rids:
            r = ex.requests.pop(rid)
            gens.append(Generation(
                token_ids=list(r.output), text=self._text(r.output, stops),
                finish_reason=r.finish_reason,
                stats={"prompt_tokens": len(r.prompt), "generated_tokens": len(r.output),
                       "verify_steps": r.steps, "drafted": r.drafted, "accepted": r.accepted}))
        return BatchResult(generations=gens, stats=ex.stats.summary())

    def generate(self, prompt, *, params=None, chat: bool = True, spec=None,
                 **sampling) -> Generation:
        """Generates for one prompt; `stats` holds the run's metrics."""
        result = self.generate_batch([prompt], params=params, chat=chat, spec=spec, **sampling)
        gen = result.generations[0]
        return dataclasses.replace(gen, stats={**result.stats, **gen.stats})

    def stream(self, prompt, *, params=None, chat: bool = True, spec=None,
               **sampling) -> Iterator[str]:
        """Yields text pieces as tokens are committed (token ids when there is no tokenizer).

        After the generator is exhausted, `engine.last_stats` holds the run's metrics.
        """
        if spec is not None:
            self.set_spec(spec)
        ex = self._executor
        ex.stats = ex.stats.__class__()
        params, stops = self._params(params, sampling)
        (rid,) = self._submit([prompt], params, stops, chat)
        decoder = self.tokenizer.stream_decoder() if self.tokenizer else None
        try:
            while ex.has_work():
                for event in ex.step():
                    if event.request_id != rid:
                        continue
                    for tok in event.tokens:
                        if decoder is None:
                            yield tok
                        elif tok not in stops:
                            piece = decoder.add(tok)
                            if piece:
                                yield piece
            if decoder is not None:
                tail = decoder.flush()
                if tail:
                    yield tail
        finally:
            if not ex.requests[rid].finished:
                ex.cancel(rid)
            ex.requests.pop(rid, None)
            self.last_stats = ex.stats.summary()
