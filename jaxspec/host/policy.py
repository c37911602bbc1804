"""The speculation policy: where drafts come from, how far to draft at each batch size, and when
to stop.

Users name a method with a *spec* (`"sa"`, an `SAConfig`, an `NGramConfig`, `AutoConfig()`, their
own `Drafter`, optionally with an `SAEnhancerConfig`); the executor works from the one
`SpecPolicy` it resolves to, and from nothing else:

    source "none"   plain decoding.
    source "host"   a host `Drafter` (the n-gram pool, frequency-scored suffix drafts, a user
                    drafter) drafts before every step;
                    with `enhancer_threshold` set, a device automaton per request also runs and its
                    drafts replace the host drafts of rows whose match is that long.
    source "sa"     the device automata draft inside the step (`jaxspec.device.step`).
"""

import dataclasses

from jaxspec import config as config_lib
from jaxspec import schedule as schedule_lib
from jaxspec._validate import gate_is_active
from jaxspec.device.step import DraftSource
from jaxspec.host import drafter as drafter_lib
from jaxspec.host import gate as gate_lib

SpecLike = (config_lib.NGramConfig | config_lib.SAConfig | config_lib.AutoConfig
            | drafter_lib.Drafter | None)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SpecPolicy:
    """Everything the executor needs to know about speculation.

    Attributes:
      source: where drafts come from (module docstring).
      max_draft_len: the largest K; 0 without speculation.
      draft_len_schedule: K per batch size (`jaxspec.schedule`), or None for always max_draft_len.
      gate_window, gate_threshold: the acceptance gate's settings (unset: no gate).
      gate: "permanent" or "reversible" (`jaxspec.host.gate.ReversibleGate`, one for the batch
        and one per request).
      adaptive: K per iteration from the step-cost model and the acceptance predictor
        (`jaxspec.host.adaptive`), up to the schedule's K.
      start_draft_len: with `adaptive`, the width of a request's first steps
        (`jaxspec.host.widths`); None: the schedule's K.
      drafter: the host drafter ("host" only).
      uses_automaton: device automata are kept per request ("sa", or "host" with an enhancer).
      global_pool: the automata search every active slot, not only their own.
      global_pool_size: automaton slots, active plus retained (None: derived from the batch).
      max_ngram_size: automaton lookup mode (-1 longest match, M > 0 fixed sizes M..1).
      min_match_len: automaton drafts behind a shorter match are not verified ("sa").
      enhancer_threshold: host drafts are replaced by the automaton's where its match is at least
        this long ("host" with an `SAEnhancerConfig`), else None.
      tree: the host drafter drafts token trees (`SAConfig(tree_budget=N)`; its
        `prepare_trees`), verified by tree steps; K counts their nodes.
    """

    source: DraftSource = "none"
    max_draft_len: int = 0
    draft_len_schedule: schedule_lib.Schedule | None = None
    gate_window: int | None = None
    gate_threshold: float | None = None
    gate: str = "permanent"
    adaptive: bool = False
    start_draft_len: int | None = None
    drafter: drafter_lib.Drafter | None = None
    global_pool: bool = False
    global_pool_size: int | None = None
    max_ngram_size: int = -1
    min_match_len: int = 1
    enhancer_threshold: int | None = None
    tree: bool = False

    @property
    def uses_automaton(self) -> bool:
        return self.source == "sa" or self.enhancer_threshold is not None

    @property
    def drafting(self) -> tuple:
        """A hashable name of how drafts are made and of what their match lengths mean (the key
        of what a process learned of their acceptance, `acceptance.carried`)."""
        drafter = getattr(self.drafter, "config", self.drafter)
        return (self.source, drafter, self.max_ngram_size, self.min_match_len, self.global_pool,
                self.enhancer_threshold, self.tree)

    def draft_len_for_batch_size(self, batch_size: int) -> int:
        """K for a batch of `batch_size` requests (0 without speculation)."""
        if self.source == "none":
            return 0
        return schedule_lib.draft_len_for_batch_size(self.draft_len_schedule, batch_size,
                                                     self.max_draft_len)

    def should_use_spec_decode(self, num_requests: int, max_batch_size: int,
                               max_num_tokens: int, draft_len: int) -> bool:
        """The capacity gate (`jaxspec.schedule.should_use_spec_decode`)."""
        return schedule_lib.should_use_spec_decode(
            self.draft_len_schedule, self.max_draft_len, num_requests, max_batch_size,
            max_num_tokens, draft_len)

    def new_gate(self) -> gate_lib.SpeculationGate | None:
        """A fresh acceptance gate, or None when this policy has none."""
        if not gate_is_active(self.gate_window, self.gate_threshold):
            return None
        if self.gate == "reversible":
            return gate_lib.ReversibleGate(self.gate_window, self.gate_threshold)
        return gate_lib.SpeculationGate(self.gate_window, self.gate_threshold)


def _drafter_fields(source) -> dict:
    return dict(max_draft_len=source.max_draft_len, draft_len_schedule=source.draft_len_schedule,
                gate_window=source.acceptance_rate_window_size,
                gate_threshold=source.acceptance_rate_threshold, gate=source.gate)


def resolve(spec: SpecLike, *, max_batch_size: int,
            enhancer: config_lib.SAEnhancerConfig | None = None) -> SpecPolicy:
    """The policy a spec stands for.

    Args:
      spec: None, an `NGramConfig`, an `SAConfig`, an `AutoConfig` (resolved with
        `suggest_spec_config(max_batch_size)`), or a `Drafter` instance.
      max_batch_size: the engine's batch capacity (AUTO decides from it).
      enhancer: an `SAEnhancerConfig` to run device automata beside a host drafter.

    Raises:
      TypeError: an unknown spec, or an enhancer without a host drafter to enhance.
    """
    extra = {}
    if isinstance(spec, config_lib.AutoConfig):
        # A request's first steps draft as far as TensorRT-LLM's heuristic would for a lone
        # request (5): the engine's capacity says nothing of how many requests share a step.
        extra["start_draft_len"] = config_lib.suggest_spec_config(1).max_draft_len
        spec = spec.resolve(max_batch_size)
    if enhancer is not None and not isinstance(spec, (config_lib.NGramConfig,
                                                       drafter_lib.Drafter)):
        raise TypeError(f"an SAEnhancerConfig enhances a host drafter (an NGramConfig or a "
                        f"Drafter), got spec {type(spec).__name__}")
    if spec is None:
        return SpecPolicy()
    if isinstance(spec, config_lib.NGramConfig):
        from jaxspec.host import ngram

        extra["adaptive"] = spec.adaptive
        spec = ngram.NGramDrafter(spec)
    if isinstance(spec, config_lib.SAConfig) and spec.selection == "frequent":
        from jaxspec.host import frequent

        extra.update(adaptive=spec.adaptive, tree=spec.tree_budget > 0)
        spec = frequent.FrequentDrafter(spec)
    if isinstance(spec, drafter_lib.Drafter):
        if enhancer is not None:
            extra.update(enhancer_threshold=enhancer.threshold,
                         global_pool=enhancer.enable_global_pool)
        return SpecPolicy(source="host", drafter=spec, **_drafter_fields(spec), **extra)
    if isinstance(spec, config_lib.SAConfig):
        return SpecPolicy(source="sa", global_pool=spec.enable_global_pool,
                          global_pool_size=spec.global_pool_size,
                          max_ngram_size=spec.max_matching_ngram_size,
                          min_match_len=spec.min_match_len, adaptive=spec.adaptive,
                          **_drafter_fields(spec), **extra)
    raise TypeError(f"spec must be None, NGramConfig, SAConfig, AutoConfig or a Drafter, got "
                    f"{type(spec).__name__}")
