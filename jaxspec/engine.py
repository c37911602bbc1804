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

from collections.abc import Iterator
from collections.abc import Sequence
import dataclasses
import os

import jax

from jaxspec import config as config_lib
from jaxspec.device import sharding
from jaxspec.host import compiles as compiles_lib
from jaxspec.host import cost_model as cost_model_lib
from jaxspec.host import drafter as drafter_lib
from jaxspec.host import executor as executor_lib
from jaxspec.host import requests as requests_lib
from jaxspec.host import scheduler as scheduler_lib
from jaxspec.models import precision

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
      top2: with `Engine(record_top2=True)`, per token the target's two best logits behind it
        (their difference: how near greedy decoding came to choosing otherwise); else None.
      windows: likewise, per token (verify step, index in the step's window, K); step 0 is
        the prefill.
    """

    token_ids: list[int]
    text: str | None
    finish_reason: str
    stats: dict
    top2: list[tuple[float, float]] | None = None
    windows: list[tuple[int, int, int]] | None = None


@dataclasses.dataclass(frozen=True)
class BatchResult:
    """Results in prompt order, with the run's metrics (`jaxspec.host.stats`)."""

    generations: list[Generation]
    stats: dict


NUMERICS = ("exact", "fast")


def resolve_numerics(numerics: str | None, mesh=None) -> str:
    """The numerics an engine runs with (`Engine`'s argument of that name).

    Raises:
      ValueError: an unknown name, or "exact" with a mesh.
    """
    if numerics is not None and numerics not in NUMERICS:
        raise ValueError(f"numerics must be one of {NUMERICS} or None, got {numerics!r}")
    if numerics is None:
        return "exact" if jax.default_backend() == "gpu" and mesh is None else "fast"
    if numerics == "exact" and mesh is not None:
        raise ValueError("numerics='exact' runs on one device: drop the mesh or use 'fast'")
    return numerics


def _compile_cache(setting) -> str | None:
    """Turns the persistent compilation cache on as `Engine(compile_cache=...)` says; returns
    the directory in use (None: off).

    Raises:
      TypeError: a setting that is not a bool, a path or None.
    """
    if setting is True:
        setting = compiles_lib.default_cache_dir()
    elif setting is False or setting is None:
        setting = None
    elif not isinstance(setting, (str, os.PathLike)):
        raise TypeError(f"compile_cache must be a bool, a path or None, got {setting!r}")
    return compiles_lib.enable_persistent_cache(setting)


class Engine:
    """Continuous-batching generation with model-free speculation.

    Args:
      model: a `jaxspec.device.model.CausalLM` NNX module.
      tokenizer: a `jaxspec.models.tokenizer.Tokenizer`, or None to work on token ids only.
      spec: "none" | "sa" | "ngram" | "auto", a spec config (`NGramConfig`, `SAConfig`,
        `AutoConfig`), a `Drafter` instance, or None.
      enhancer: an `SAEnhancerConfig`: device suffix automata whose drafts replace the spec's
        host drafts (an n-gram pool or your `Drafter`, e.g. a neural draft source) on the rows
        where the automaton's match is at least `threshold` tokens long.
      scheduler: capacity; the defaults fit batch 8 of 2048-token sequences.
      implementation: kernels (automaton, paged attention): "pallas", "xla" or None (Pallas on
        GPU, XLA elsewhere).
      cost_model: the step-cost model adaptive K decides with (`jaxspec.host.cost_model`);
        default: the one kept for this model and machine under the cache directory.
      dtype: cast the model's weights and activations to "float32" or "bfloat16" (a copy; None
        keeps the model as it is). `Engine.load` defaults to float32 on CPU, bfloat16 on an
        accelerator. Logits, sampling and verification stay float32.
      kv_dtype: the KV cache's dtype (None: the model's).
      record_top2: keep each output token's two best logits and verify window
        (`Generation.top2` / `.windows`; `benchmarks.equivalence` reads them).
      mesh: a `jax.sharding.Mesh` with axes `data` and `model` (`jax.make_mesh((D, M), ("data",
        "model"))`): weights and KV heads split over `model`, batch rows over `data`
        (`jaxspec.device.sharding`); the model's KV heads are repeated first when `model`
        exceeds them. None: the default device.
      numerics: "exact": every row is computed the same way whatever the rows beside it
        (row-invariant linear layers and attention: `jaxspec.device.linear`,
        `jaxspec.device.causal_attention`), so greedy output with speculation is bit for bit
        plain greedy output, and a request's output does not depend on its batch-mates; "fast":
        XLA's own choices, which can flip a near-tie between a plain and a verify step. None:
        "exact" on a GPU, "fast" elsewhere and on a mesh (exact mode runs on one device).
      warmup: compile, in the background, the step programs the schedule runs (per batch
        bucket: the plain step, the schedule's K and adaptive K's start width) while this
        engine serves; a request meanwhile runs with the programs that are ready
        (`jaxspec.host.compiles`). Prompt programs compile at their first use.
      compile_cache: JAX's persistent compilation cache, so that a new process loads what an
        earlier one compiled: True (the default) keeps it in `$JAXSPEC_CACHE/xla` or
        ~/.cache/jaxspec/xla, a path keeps it there, False turns it off. A cache directory
        this process already set (`jax_compilation_cache_dir`, `JAX_COMPILATION_CACHE_DIR`)
        wins.

    Raises:
      ValueError: a capacity the model or the device cannot hold.
      TypeError: an unknown spec, an enhancer without a host drafter, or a compile_cache
        that is not a bool, a path or None.
      ValueError: an unknown numerics, or "exact" on a mesh.
    """

    def __init__(self, model, tokenizer=None, *, spec="auto",
                 enhancer: config_lib.SAEnhancerConfig | None = None,
                 scheduler: scheduler_lib.SchedulerConfig | None = None,
                 implementation: str | None = None,
                 cost_model: cost_model_lib.StepCostModel | None = None,
                 dtype=None, kv_dtype=None, record_top2: bool = False, mesh=None,
                 numerics: str | None = None, warmup: bool = False, compile_cache=True):
        self.numerics = resolve_numerics(numerics, mesh)
        self.compile_cache = _compile_cache(compile_cache)
        model = model if dtype is None else precision.cast(model, dtype)
        scheduler = scheduler or scheduler_lib.SchedulerConfig()
        if mesh is not None:
            # Checked before KV heads are repeated, so a bad mesh names the model's numbers.
            cs, mesh = model.cache_spec, sharding.auto_mesh(mesh)
            sharding.check(mesh, num_heads=cs.num_heads, num_kv_heads=cs.num_kv_heads,
                           max_batch_size=scheduler.max_batch_size)
            if sharding.sizes(mesh)[1] > cs.num_kv_heads:
                model = model.with_kv_heads(sharding.sizes(mesh)[1])
        self.model = model
        self.mesh = mesh
        self.kv_dtype = None if kv_dtype is None else precision.resolve(kv_dtype)
        self.tokenizer = tokenizer
        self.scheduler_config = scheduler
        self.implementation = implementation
        self.cost_model = cost_model
        self.record_top2 = record_top2
        self.warmup = bool(warmup)
        self.last_stats: dict | None = None
        self._spec = None
        self._enhancer = None
        self._executor = None
        self.set_spec(spec, enhancer=enhancer)

    @classmethod
    def load(cls, path: str | None = None, *, dtype=None, **kwargs) -> "Engine":
        """An engine over a GGUF file or HF-layout directory (None = the embedded SmolLM2), its
        weights in `dtype` (None: float32 on CPU, bfloat16 on an accelerator)."""
        from jaxspec import models

        # Before the weights load: their conversion compiles too.
        _compile_cache(kwargs.get("compile_cache", True))
        model, tokenizer = models.load(path, dtype=dtype)
        return cls(model, tokenizer, **kwargs)

    def set_spec(self, spec, *, enhancer: config_lib.SAEnhancerConfig | None = None):
        """Switches the speculation method (a new executor: the KV cache is reallocated)."""
        if isinstance(spec, str):
            spec = spec_from_name(spec)
        if not (spec is None or isinstance(spec, (config_lib.NGramConfig, config_lib.SAConfig,
                                                  config_lib.AutoConfig, drafter_lib.Drafter))):
            raise TypeError(f"spec must be a name in {SPEC_NAMES}, a spec config, a Drafter or "
                            f"None; got {spec!r}")
        if not (enhancer is None or isinstance(enhancer, config_lib.SAEnhancerConfig)):
            raise TypeError(f"enhancer must be an SAEnhancerConfig or None; got {enhancer!r}")
        if self._executor is not None and (spec, enhancer) == (self._spec, self._enhancer):
            return
        self._spec, self._enhancer = spec, enhancer
        self._executor = None              # free the old cache before allocating the new one
        self._executor = executor_lib.Executor(
            self.model, scheduler_config=self.scheduler_config, spec=spec, enhancer=enhancer,
            implementation=self.implementation, cost_model=self.cost_model,
            kv_dtype=self.kv_dtype, record_top2=self.record_top2, mesh=self.mesh,
            numerics=self.numerics)
        if self.warmup:
            self._executor.warmup()

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

    def _start(self, prompts, spec, params, sampling, chat: bool):
        """Switches spec if given, starts a new run's metrics and queues every prompt (all
        checked first, so a bad one queues nothing); returns (request ids, stop ids)."""
        if spec is not None:
            self.set_spec(spec)
        params, stops = self._params(params, sampling)
        ids = [self.encode_prompt(p, chat=chat) for p in prompts]
        for tokens in ids:
            requests_lib.check_prompt(tokens, vocab_size=self.model.vocab_size,
                                      max_new_tokens=params.max_new_tokens,
                                      max_seq_len=self.scheduler_config.max_seq_len)
        self._executor.reset_stats()
        return [self._executor.add_request(t, params, stops) for t in ids], stops

    def _text(self, tokens: list[int], stops) -> str | None:
        if self.tokenizer is None:
            return None
        return self.tokenizer.decode([t for t in tokens if t not in stops])

    def generate_batch(self, prompts: Sequence, *, params=None, chat: bool = True,
                       spec=None, **sampling) -> BatchResult:
        """Runs all prompts as one continuous batch; results in prompt order.

        `spec=None` keeps the engine's current spec (pass "none" for plain decoding); any other
        value switches to it for this and later calls, as `set_spec` does.
        """
        rids, stops = self._start(prompts, spec, params, sampling, chat)
        done = self._executor.run()
        gens = []
        for rid in rids:
            r = done[rid]
            gens.append(Generation(
                token_ids=list(r.output), text=self._text(r.output, stops),
                finish_reason=r.finish_reason,
                stats={"prompt_tokens": len(r.prompt), "generated_tokens": len(r.output),
                       "verify_steps": r.steps, "drafted": r.drafted, "accepted": r.accepted},
                top2=r.top2, windows=r.windows))
        self.last_stats = self._executor.stats.summary()
        return BatchResult(generations=gens, stats=self.last_stats)

    def generate(self, prompt, *, params=None, chat: bool = True, spec=None,
                 **sampling) -> Generation:
        """Generates for one prompt; `stats` holds the run's metrics. `spec` as in
        `generate_batch`."""
        result = self.generate_batch([prompt], params=params, chat=chat, spec=spec, **sampling)
        gen = result.generations[0]
        return dataclasses.replace(gen, stats={**result.stats, **gen.stats})

    def stream(self, prompt, *, params=None, chat: bool = True, spec=None,
               **sampling) -> Iterator[str]:
        """Yields text pieces as tokens are committed (token ids when there is no tokenizer).

        `spec` as in `generate_batch`. After the generator is exhausted (or closed),
        `engine.last_stats` holds the run's metrics.
        """
        (rid,), stops = self._start([prompt], spec, params, sampling, chat)
        ex = self._executor
        decoder = self.tokenizer.stream_decoder() if self.tokenizer else None
        finished = False
        try:
            while not finished:
                for event in ex.step():
                    if event.request_id != rid:
                        continue
                    finished = event.finished
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
            if not finished:
                ex.cancel(rid)
            self.last_stats = ex.stats.summary()
