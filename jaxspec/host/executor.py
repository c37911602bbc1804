"""The iteration loop. Every call to `Executor.step` runs DESIGN §2's numbered steps:

  1. Draft length K from the schedule: first from the number of active requests (to size the
     placeholders), then corrected from the scheduled batch size (its compile bucket decides).
  2. Batch gate, first match wins: schedule gives 0 -> off; acceptance gate disabled -> off;
     `should_use_spec_decode` (capacity) -> off.
  3. Placeholder drafts: every decoding request reserves 1 + K tokens and KV slots.
  4. Schedule: chunked prefill and decoding share `max_num_tokens`; KV pages are allocated.
  5. Drafts: host drafters (NGram, user drafters) draft now, padded to the bucket's K with the
     real lengths kept apart. The suffix automaton drafted inside the previous step, on the device.
  6. Forward + verify in one jitted call per bucket; KV rollback is a length reset.
  7. Commit accepted tokens + the bonus token; the automata were extended with exactly those
     tokens inside the step, which also produced the next drafts.
  8. Feed the acceptance gate with the batch's pooled rate (accepted / really drafted).

K = 0 is plain decoding through the same machinery. The host is the source of truth for sequence
lengths and page tables; the device holds the KV pages, the automata and the next drafts.
Per-step inputs are built as numpy arrays and handed to the jitted calls as they are: jit moves
them to the device in one go, cheaper than a device array per field.
"""

import dataclasses
import itertools
import time
from collections.abc import Sequence

import jax
import numpy as np
from flax import nnx

from jaxspec import config as config_lib
from jaxspec import schedule as schedule_lib
from jaxspec.device import kv_cache
from jaxspec.device import sampling
from jaxspec.device import step as step_lib
from jaxspec.host import drafter as drafter_lib
from jaxspec.host import gate as gate_lib
from jaxspec.host import requests as requests_lib
from jaxspec.host import scheduler as scheduler_lib
from jaxspec.host import stats as stats_lib

SpecLike = (config_lib.NGramConfig | config_lib.SAConfig | config_lib.AutoConfig
            | drafter_lib.Drafter | None)


@dataclasses.dataclass(frozen=True)
class TokenEvent:
    """Tokens a request committed in one iteration (possibly none, when it just finished)."""

    request_id: int
    tokens: tuple[int, ...]
    finished: bool
    finish_reason: str | None


class _DeviceDrafterPolicy(drafter_lib.Drafter):
    """The schedule and batch gate of the suffix automaton, whose drafts are made on the device."""

    def prepare_draft_tokens(self, requests):
        raise TypeError("the suffix automaton drafts on the device inside the step; "
                        "there are no host drafts to prepare")


class Executor:
    """Continuous batching with optional speculation over one model.

    Args:
      model: an NNX module implementing `jaxspec.device.model.CausalLM`.
      scheduler_config: capacity (batch size, token budget, sequence length, KV pages).
      spec: None (plain decoding), an `NGramConfig`, an `SAConfig`, an `AutoConfig` (resolved with
        `suggest_spec_config(max_batch_size)`), or any `Drafter` instance (drafts on the host).
      sa_implementation: automaton kernels: "pallas", "xla" or None (Pallas on GPU).
    """

    def __init__(self, model, *, scheduler_config: scheduler_lib.SchedulerConfig,
                 spec: SpecLike = None, sa_implementation: str | None = None):
        self.config = scheduler_config
        self.graphdef, self.params = nnx.split(model)
        self._configs: dict[tuple[int, bool], step_lib.StepConfig] = {}
        self.vocab_size = model.vocab_size
        if isinstance(spec, config_lib.AutoConfig):
            spec = spec.resolve(scheduler_config.max_batch_size)
        self.spec = spec
        self.drafting, self.policy, self.drafter = self._make_drafter(spec)
        max_k = self.policy.max_draft_len if self.policy else 0
        self.scheduler = scheduler_lib.Scheduler(scheduler_config, max_draft_len=max_k)
        # Every page table is as wide as the longest sequence allowed: one width per compiled
        # bucket. Attention reads only up to each row's length, whatever the width.
        self.table_cols = scheduler_config.pages_per_seq(max_k)
        schedule = self.policy.draft_len_schedule if self.policy else None
        self.batch_buckets = schedule_lib.batch_buckets(
            scheduler_config.max_batch_size, schedule, scheduler_config.batch_buckets)
        self.gate = (gate_lib.SpeculationGate(self.policy.acceptance_rate_window_size,
                                              self.policy.acceptance_rate_threshold)
                     if self.policy is not None and self.policy.gate_enabled else None)
        cs = model.cache_spec
        self.kv = kv_cache.init_pages(
            num_layers=cs.num_layers, num_pages=self.scheduler.allocator.num_pages,
            page_size=scheduler_config.page_size, num_kv_heads=cs.num_kv_heads,
            head_dim=cs.head_dim)
        self.sa = None
        self.draft_buffer = None
        self.sa_implementation = sa_implementation
        if self.drafting in ("sa", "sa_global"):
            self._init_automaton(spec, max_k)
        self.requests: dict[int, requests_lib.Request] = {}
        self._ids = itertools.count()
        self._unprimed: list[requests_lib.Request] = []
        self.stats = stats_lib.RunStats()

    # ------------------------------------------------------------------ set-up

    def _make_drafter(self, spec):
        if spec is None:
            return "none", None, None
        if isinstance(spec, drafter_lib.Drafter):
            return "host", spec, spec
        if isinstance(spec, config_lib.NGramConfig):
            from jaxspec.host import ngram
            drafter = ngram.NGramDrafter(spec)
            return "host", drafter, drafter
        if isinstance(spec, config_lib.SAConfig):
            policy = _DeviceDrafterPolicy(
                spec.max_draft_len, draft_len_schedule=spec.draft_len_schedule,
                acceptance_rate_window_size=spec.acceptance_rate_window_size,
                acceptance_rate_threshold=spec.acceptance_rate_threshold)
            return ("sa_global" if spec.enable_global_pool else "sa"), policy, None
        raise TypeError(f"spec must be None, NGramConfig, SAConfig, AutoConfig or a Drafter, "
                        f"got {type(spec).__name__}")

    def _init_automaton(self, spec: config_lib.SAConfig, max_k: int):
        from jaxspec.host import sa_manager
        cfg = self.config
        self.sa = sa_manager.SAManager(
            max_slots=cfg.max_batch_size, max_seq_len=cfg.max_seq_len + 1 + max_k,
            max_num_requests=cfg.max_batch_size, enable_global_pool=spec.enable_global_pool,
            global_pool_size=spec.global_pool_size)
        self.draft_buffer = step_lib.init_draft_buffer(self.sa.num_slots + 1, max_k)

    def _step_config(self, k: int, greedy_only: bool) -> step_lib.StepConfig:
        """One config object per (K, greedy), reused: jit finds its compiled step by identity."""
        key = (k, greedy_only)
        if key not in self._configs:
            sa = self.drafting in ("sa", "sa_global")
            self._configs[key] = step_lib.StepConfig(
                graphdef=self.graphdef, k=k, greedy_only=greedy_only, drafting=self.drafting,
                sa_draft_len=self.policy.max_draft_len if sa else 0,
                max_ngram_size=self.spec.max_matching_ngram_size if sa else -1,
                min_match_len=self.spec.min_match_len if sa else 1,
                sa_implementation=self.sa_implementation)
        return self._configs[key]

    # ------------------------------------------------------------------ requests

    def add_request(self, prompt: Sequence[int], params: requests_lib.SamplingParams,
                    stop_ids: frozenset[int]) -> int:
        """Queues a request; returns its id. Raises ValueError for an unusable prompt."""
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise ValueError("prompt is empty")
        bad = [t for t in prompt if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"token ids outside the vocabulary [0, {self.vocab_size}): {bad[:8]}")
        rid = next(self._ids)
        request = requests_lib.Request(request_id=rid, prompt=prompt, params=params,
                                       stop_ids=stop_ids)
        self.scheduler.add(request)
        self.requests[rid] = request
        self.stats.prompt_tokens += len(prompt)
        return rid

    def cancel(self, request_id: int):
        request = self.requests.get(request_id)
        if request is None:
            raise ValueError(f"unknown request id {request_id}")
        if not request.finished:
            self._finish(request, "cancelled")

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def _finish(self, request: requests_lib.Request, reason: str):
        self.scheduler.finish(request, reason)
        if self.drafter is not None:
            self.drafter.release(request.request_id)
        if self.sa is not None:
            self.sa.remove_request(request.request_id)
        if request in self._unprimed:
            self._unprimed.remove(request)

    # ------------------------------------------------------------------ the iteration

    def _draft_len(self, batch_size: int) -> int:
        return self.policy.draft_len_for_batch_size(batch_size) if self.policy else 0

    def step(self) -> list[TokenEvent]:
        """One iteration. Returns the tokens every request committed in it."""
        start = time.perf_counter()
        cfg = self.config
        # 1. Draft length from the active requests: sizes the placeholders.
        n_active = max(self.scheduler.num_active, 1)
        k = self._draft_len(n_active)
        # 2. Batch gate: schedule -> permanent acceptance gate -> capacity.
        use_spec = (k > 0 and not (self.gate is not None and self.gate.disabled)
                    and self.policy.should_use_spec_decode(n_active, cfg.max_batch_size,
                                                           cfg.max_num_tokens, k))
        k = k if use_spec else 0
        # 3-4. Placeholders of 1 + K per decoding request, then chunked prefill; pages allocated.
        batch = self.scheduler.schedule(tokens_per_decode=1 + k)
        events = []
        if batch.prefill:
            events += self._prefill(batch.prefill)
        if batch.decode:
            # 1'. The scheduled batch's bucket decides K (one K per compiled bucket), within the
            # token budget left after prefill.
            bucket = schedule_lib.bucket_for(len(batch.decode), self.batch_buckets)
            if use_spec:
                fits = (cfg.max_num_tokens - batch.num_tokens) // len(batch.decode) - 1
                k = max(0, min(self._draft_len(bucket), fits))
            for r in batch.decode:
                r.pages.ensure(r.num_cached + 1 + k)
            events += self._decode(batch.decode, bucket, k)
        self.stats.wall_time += time.perf_counter() - start
        return events

    def _sampling_arrays(self, reqs, rows: int) -> sampling.SamplingArrays:
        pad = rows - len(reqs)
        p = [r.params for r in reqs]
        return sampling.SamplingArrays(
            temperature=np.asarray([x.temperature for x in p] + [0.0] * pad, np.float32),
            top_k=np.asarray([x.top_k for x in p] + [0] * pad, np.int32),
            top_p=np.asarray([x.top_p for x in p] + [1.0] * pad, np.float32),
            seed=np.asarray([x.seed for x in p] + [0] * pad, np.int32))

    def _view(self, reqs, rows: int, lengths, num_new) -> kv_cache.CacheView:
        """Rows' page tables (`table_cols` wide), lengths and valid new tokens; padding rows
        after the requests."""
        table = np.zeros((rows, self.table_cols), np.int32)
        for i, r in enumerate(reqs):
            table[i] = r.pages.table_row(self.table_cols)
        pad = rows - len(reqs)
        return kv_cache.CacheView(page_table=table,
                                  lengths=np.asarray(list(lengths) + [0] * pad, np.int32),
                                  num_new=np.asarray(list(num_new) + [0] * pad, np.int32))

    def _prefill(self, chunks: list[scheduler_lib.Chunk]) -> list[TokenEvent]:
        start = time.perf_counter()
        rows = schedule_lib.bucket_for(len(chunks), self.batch_buckets)
        width = schedule_lib.bucket_for(max(c.length for c in chunks), self.config.chunk_buckets)
        tokens = np.zeros((rows, width), np.int32)
        for i, c in enumerate(chunks):
            tokens[i, :c.length] = c.request.prompt[c.start:c.start + c.length]
        reqs = [c.request for c in chunks]
        view = self._view(reqs, rows, [c.start for c in chunks], [c.length for c in chunks])
        self.kv, first = step_lib.prefill(
            self.params, self.kv, np.asarray(tokens), view, self._sampling_arrays(reqs, rows),
            cfg=self._step_config(0, all(r.params.greedy for r in reqs)))
        first = np.asarray(first)
        events = []
        for i, c in enumerate(chunks):
            r = c.request
            r.num_cached += c.length
            if not c.completes_prompt:
                continue
            r.state = requests_lib.State.DECODE
            taken = r.append([first[i]])
            self.stats.generated_tokens += len(taken)
            if r.finish_reason:
                self._finish(r, r.finish_reason)
            elif self.sa is not None:
                self.sa.add_request(r.request_id, r.tokens)
                self._unprimed.append(r)
            events.append(TokenEvent(r.request_id, tuple(taken), r.finished, r.finish_reason))
        self.stats.prefill_time += time.perf_counter() - start
        return events

    def _prime_new_automata(self):
        """First drafts of requests whose automaton was built from their prompt since last step."""
        reqs, self._unprimed = self._unprimed, []
        rows = schedule_lib.bucket_for(len(reqs), self.batch_buckets)
        slots = self.sa.prepare([r.request_id for r in reqs] + [None] * (rows - len(reqs)))
        self.sa.state, self.draft_buffer = step_lib.prime_drafts(
            self.sa.state, self.draft_buffer, self.sa.active_mask, np.asarray(slots),
            cfg=self._step_config(0, True))

    def _decode(self, reqs: list[requests_lib.Request], rows: int, k: int) -> list[TokenEvent]:
        start = time.perf_counter()
        pad = rows - len(reqs)
        # 5. Host drafts now; automaton drafts are already waiting on the device. A step where
        # no row has a draft runs as plain decoding (K = 0): verifying only padding costs a
        # wider forward for nothing.
        draft_start = time.perf_counter()
        drafts, draft_lens = np.zeros((rows, k), np.int32), np.zeros((rows,), np.int32)
        any_draft = True
        if self.drafting == "host" and k > 0:
            self.drafter.update_draft_len(k)
            tokens, lens = drafter_lib.pad_drafts(self.drafter.prepare_draft_tokens(reqs), k)
            drafts[:len(reqs)], draft_lens[:len(reqs)] = tokens, lens
            any_draft = lens.any()
        slots = np.zeros((rows,), np.int32)
        if self.sa is not None:
            if self._unprimed:
                self._prime_new_automata()
            slots = self.sa.prepare([r.request_id for r in reqs] + [None] * pad)
            any_draft = any(r.next_draft_len != 0 for r in reqs)  # None: not known yet
        if not any_draft:
            k, drafts = 0, drafts[:, :0]
        draft_seconds = time.perf_counter() - draft_start
        # 6. Forward + verify (+ automaton extend and next drafts) in one jitted call.
        view = self._view(reqs, rows, [r.num_cached for r in reqs], [1 + k] * len(reqs))
        inputs = step_lib.StepInputs(
            last_tokens=np.asarray([r.output[-1] for r in reqs] + [0] * pad, np.int32),
            drafts=np.asarray(drafts), draft_lens=np.asarray(draft_lens), view=view,
            sampling=self._sampling_arrays(reqs, rows), slots=np.asarray(slots, np.int32))
        self.kv, sa_state, self.draft_buffer, out = step_lib.step(
            self.params, self.kv, self.sa.state if self.sa else None, self.draft_buffer,
            self.sa.active_mask if self.sa else None, inputs,
            cfg=self._step_config(k, all(r.params.greedy for r in reqs)))
        out = jax.device_get(out)
        if self.sa is not None:
            self.sa.state = sa_state
            self.sa.advance([r.request_id for r in reqs], out.num_new_tokens[:len(reqs)])
        # 7. Commit: the cache now holds the input token and the accepted drafts. Metrics count
        # the tokens kept: a stop token or the length limit can cut a verify window short.
        events, pairs, kept = [], [], []
        for i, r in enumerate(reqs):
            n = int(out.num_new_tokens[i])
            r.num_cached += n
            taken = r.append(out.new_tokens[i, :n])
            accepted = min(len(taken), n - 1)
            r.steps += 1
            r.drafted += int(out.draft_lens[i])
            r.accepted += accepted
            r.acceptance_lengths.append(len(taken))
            r.next_draft_len = int(out.next_draft_lens[i])
            pairs.append((accepted, int(out.draft_lens[i])))
            kept.append(len(taken))
            self.stats.generated_tokens += len(taken)
            if r.finish_reason:
                self._finish(r, r.finish_reason)
            events.append(TokenEvent(r.request_id, tuple(taken), r.finished, r.finish_reason))
        self.stats.record_step(k, out.draft_lens[:len(reqs)], kept,
                               time.perf_counter() - start, draft_seconds)
        # 8. The gate sees the pooled acceptance of the rows that really drafted.
        rate = gate_lib.pooled_acceptance_rate(pairs)
        if self.gate is not None and rate is not None:
            self.gate.record_acceptance_rate(rate)
        return events
