"""Speculation configs: which drafter, how far it drafts, when it stops.

Every config is a frozen, keyword-only, hashable dataclass validated at construction, so a config
can be a static jit argument and a bad value fails before anything is traced. Errors are
`ValueError`s naming the field and the value.

Fields shared by the drafter configs (TensorRT-LLM's ``DecodingBaseConfig``):

* ``max_draft_len``: the largest K, the number of draft tokens verified per step.
* ``draft_len_schedule``: K per batch size (see `jaxspec.schedule`), stored as a sorted tuple of
  ``(batch_size, draft_len)`` pairs. ``max_concurrency=C`` is stored as the schedule
  ``((C, max_draft_len),)``: speculate with full K up to C requests, not at all above.
* ``acceptance_rate_window_size`` / ``acceptance_rate_threshold``: the `SpeculationGate` turns
  speculation off once the mean batch acceptance rate over the last ``window`` iterations drops
  below ``threshold``. Either left unset (or a window of 0) means no gate.
* ``gate``: "permanent" (TensorRT-LLM's: off for good) or "reversible": after switching off, probe
  with a short draft every so many iterations and switch back on when the probes' rate recovers;
  each request also gets its own gate, so one request whose acceptance collapses stops drafting
  while the others go on (`jaxspec.host.gate.ReversibleGate`).

The n-gram and automaton configs also take ``adaptive``: each iteration, K is the compiled width
that maximises the expected committed tokens per second, from a measured step-cost model and an
acceptance prediction calibrated on this run (`jaxspec.host.adaptive`); the schedule and
``max_draft_len`` stay upper bounds. Off reproduces the fixed-K behaviour exactly.
"""

from collections.abc import Iterable
from collections.abc import Mapping
import dataclasses

from jaxspec._validate import check_bool
from jaxspec._validate import check_float
from jaxspec._validate import check_gate
from jaxspec._validate import check_gate_fields
from jaxspec._validate import check_int
from jaxspec._validate import gate_is_active
from jaxspec.schedule import normalize_schedule

ScheduleLike = Mapping[int, int] | Iterable[tuple[int, int]] | None
ADAPTIVE_MAX_DRAFT_LEN = 16  # the longest width AUTO may choose; matches of 20+ tokens are common


def _set(config, name: str, value):
    """Stores a normalised field value on a frozen dataclass, from `__post_init__` only."""
    object.__setattr__(config, name, value)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _DrafterFields:
    """The fields every drafter config has (module docstring), validated in `__post_init__`."""

    max_draft_len: int
    max_concurrency: int | None = None  # no limit
    draft_len_schedule: ScheduleLike = None  # always max_draft_len
    acceptance_rate_window_size: int | None = None  # no gate
    acceptance_rate_threshold: float | None = None  # no gate
    gate: str = "permanent"  # TensorRT-LLM's gate

    def __post_init__(self):
        _set(self, "max_draft_len", check_int("max_draft_len", self.max_draft_len, minimum=1))
        check_gate(self.gate)
        _set(self, "draft_len_schedule", normalize_schedule(
            self.draft_len_schedule, self.max_draft_len, self.max_concurrency))
        if self.max_concurrency is not None:
            _set(self, "max_concurrency",
                 check_int("max_concurrency", self.max_concurrency, minimum=1))
        window, threshold = check_gate_fields(self.acceptance_rate_window_size,
                                               self.acceptance_rate_threshold)
        _set(self, "acceptance_rate_window_size", window)
        _set(self, "acceptance_rate_threshold", threshold)

    @property
    def gate_enabled(self) -> bool:
        """Whether a `SpeculationGate` watches acceptance (a non-zero window and a threshold)."""
        return gate_is_active(self.acceptance_rate_window_size, self.acceptance_rate_threshold)


@dataclasses.dataclass(frozen=True, kw_only=True)
class NGramConfig(_DrafterFields):
    """The host n-gram pool drafter (TensorRT-LLM ``NGramDecodingConfig``).

    Attributes:
      max_matching_ngram_size: longest pattern N looked up; patterns of N..1 tokens are tried.
      is_keep_all: keep every continuation seen for a pattern, or only the longest one.
      is_use_oldest: draft the oldest stored continuation, or the newest.
      is_public_pool: one pool shared by all requests, or one private pool per request.
    """

    max_matching_ngram_size: int = 2  # TensorRT-LLM's default; 3 wins on code (see AUTO)
    is_keep_all: bool = True  # more candidates; the oldest is usually the best
    is_use_oldest: bool = True  # the newest is often a truncated match from the window's end
    is_public_pool: bool = True  # shares system prompts and few-shot text across requests
    adaptive: bool = False  # fixed K, as TensorRT-LLM

    def __post_init__(self):
        super().__post_init__()
        _set(self, "max_matching_ngram_size", check_int(
            "max_matching_ngram_size", self.max_matching_ngram_size, minimum=1))
        for name in ("is_keep_all", "is_use_oldest", "is_public_pool", "adaptive"):
            check_bool(name, getattr(self, name))


SELECTIONS = ("first", "frequent")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SAConfig(_DrafterFields):
    """The on-device suffix automaton drafter (TensorRT-LLM ``SADecodingConfig``).

    Attributes:
      max_matching_ngram_size: -1 drafts after the longest earlier-occurring suffix; M >= 1 tries
        suffixes of M..1 tokens.
      enable_global_pool: also search the automata of other (and recently finished) requests.
      global_pool_size: automaton slots, active plus retained; None sizes it from the batch.
      min_match_len: drafts behind a shorter match are not verified, and a step where no row
        has an admitted draft runs as plain decoding (1 reproduces TensorRT-LLM, which verifies
        every draft). Drafts after a 1-token match are rarely accepted (BENCHMARKS.md), so
        verifying them costs more than it returns; 2 is the default.
      selection: "first" drafts what followed the first occurrence of the longest match, on the
        device (TensorRT-LLM's semantics); "frequent" drafts, over every match length, the
        continuation most occurrences agree on (SuffixDecoding's scoring, on the host:
        `jaxspec.host.frequent`, where M >= 1 caps the match lengths scored).
      min_token_prob: "frequent" only: a draft stops before a token whose probability (the
        share of occurrences agreeing, multiplied along the draft) is under this.
      max_spec_factor: "frequent" only: a draft is at most this many times its match length
        (None: only K limits it).
      tree_budget: "frequent" only: 0 drafts one continuation; N >= max_draft_len drafts a
        token tree of up to N nodes, the most probable continuations of every match length
        best first, verified in one step of N draft slots (`jaxspec.device.tree`): N plays
        K's part for widths, the schedule and capacity, and `max_draft_len` caps the tree's
        depth, the tokens one step can accept.
    """

    max_matching_ngram_size: int = -1  # longest match: no length to tune
    enable_global_pool: bool = False  # cross-request search costs a pass over every slot
    global_pool_size: int | None = None  # derived from max_batch_size by the slot manager
    min_match_len: int = 2  # 1-token matches draft noise (see above)
    adaptive: bool = False  # fixed K, as TensorRT-LLM
    selection: str = "first"  # TensorRT-LLM's
    min_token_prob: float = 0.1  # SuffixDecoding's default
    max_spec_factor: float | None = None  # 4 and 2 drafted 5-13% less per step (frequent.py)
    tree_budget: int = 0  # one continuation, as TensorRT-LLM

    def __post_init__(self):
        super().__post_init__()
        check_bool("adaptive", self.adaptive)
        if self.selection not in SELECTIONS:
            raise ValueError(f"selection must be one of {SELECTIONS}, got {self.selection!r}")
        _set(self, "min_token_prob", check_float("min_token_prob", self.min_token_prob, 0.0, 1.0))
        budget = check_int("tree_budget", self.tree_budget, minimum=0)
        _set(self, "tree_budget", budget)
        if budget and self.selection != "frequent":
            raise ValueError(f"tree_budget={budget} drafts trees of frequent continuations: "
                             f"it needs selection='frequent', got {self.selection!r}")
        if budget and budget < self.max_draft_len:
            raise ValueError(f"tree_budget ({budget}) must be 0 or at least max_draft_len "
                             f"({self.max_draft_len}), the depth it caps")
        if self.max_spec_factor is not None:
            _set(self, "max_spec_factor", check_float("max_spec_factor", self.max_spec_factor,
                                                      0.0, open_minimum=True))
        ngram = check_int("max_matching_ngram_size", self.max_matching_ngram_size, minimum=-1)
        if ngram == 0:
            raise ValueError("max_matching_ngram_size must be -1 (longest match) or >= 1, got 0")
        _set(self, "max_matching_ngram_size", ngram)
        check_bool("enable_global_pool", self.enable_global_pool)
        _set(self, "min_match_len", check_int("min_match_len", self.min_match_len, minimum=1))
        if self.global_pool_size is not None:
            _set(self, "global_pool_size", check_int(
                "global_pool_size", self.global_pool_size, minimum=1))


@dataclasses.dataclass(frozen=True, kw_only=True)
class SAEnhancerConfig:
    """A suffix automaton overriding another drafter's drafts where it matched well.

    Attributes:
      threshold: a row's drafts are replaced by the automaton's when its match length is >= this.
      enable_global_pool: also search the automata of other requests.
    """

    threshold: int = 4  # TensorRT-LLM's default: shorter matches lose to a neural drafter
    enable_global_pool: bool = False  # cross-request search costs a pass over every slot

    def __post_init__(self):
        _set(self, "threshold", check_int("threshold", self.threshold, minimum=1))
        check_bool("enable_global_pool", self.enable_global_pool)


@dataclasses.dataclass(frozen=True, kw_only=True)
class AutoConfig:
    """Let jaxspec pick: `suggest_spec_config(max_batch_size)`'s automaton, made adaptive.

    Adaptive K decides from the automaton's match length, so AUTO looks up the longest match
    (not sizes M..1), admits every match (`min_match_len=1`: the predictor weighs 1-token matches
    instead of a fixed cut) and may draft up to `ADAPTIVE_MAX_DRAFT_LEN` tokens, the planner
    choosing how far per iteration; `suggest_spec_config`'s concurrency limit stays the bound.
    """

    def resolve(self, max_batch_size: int) -> SAConfig:
        """The config AUTO stands for at `max_batch_size`."""
        base = suggest_spec_config(max_batch_size)
        return dataclasses.replace(
            base, adaptive=True, max_matching_ngram_size=-1, min_match_len=1,
            max_draft_len=ADAPTIVE_MAX_DRAFT_LEN, draft_len_schedule=None)


def suggest_spec_config(max_batch_size: int) -> SAConfig:
    """AUTO's choice: the suffix automaton, drafting far at small batches and briefly at large ones.

    TensorRT-LLM's heuristic picks its n-gram pool with the same numbers; jaxspec's automaton drafts
    the same continuations on the device, with no host pass per step. Speculation stops above 32
    concurrent requests, where verifying extra positions is no longer free.

    Raises:
      ValueError: `max_batch_size` < 1.
    """
    max_batch_size = check_int("max_batch_size", max_batch_size, minimum=1)
    small = max_batch_size <= 4
    return SAConfig(
        max_draft_len=5 if small else 3,
        max_matching_ngram_size=3 if small else 5,
        max_concurrency=32,
        enable_global_pool=True,
    )

