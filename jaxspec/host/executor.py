"""The iteration loop. `Executor.step` runs DESIGN §2's numbered steps, in order, one small method
each:

  1. `_draft_len`: K for the placeholders, from the number of active requests and the schedule.
  2. `_batch_gate`, first match wins: schedule gives 0 -> off; acceptance gate disabled -> off;
     `should_use_spec_decode` (capacity) -> off.
  3-4. `Scheduler.schedule`: every decoding request reserves 1 + K tokens of the budget (its
     placeholder drafts), then prompt chunks share the rest (chunked prefill).
  5. `_plan`: rows and K, decided once for the scheduled batch: its compile bucket gives K, within
     the token budget left after the prompt chunks; host drafters (NGram, user drafters) draft
     now, padded to K with the real lengths kept apart (the automata drafted inside the previous
     step, on the device); a batch with no draft runs with K = 0; KV pages for 1 + K per row.
  6. `_run`: forward + verify in one jitted call (`_prefill` does the forward of prompt chunks);
     KV rollback is a length reset.
  7. `_commit`: accepted tokens + the bonus token go to the requests; the automata were extended
     with exactly those tokens inside the step, which also produced the next drafts.
  8. `_feed_gate`: the acceptance gate sees the batch's pooled rate (accepted / really drafted).

K = 0 is plain decoding through the same machinery. The host is the source of truth for sequence
lengths and page tables; the device state (KV pages, automata, next drafts, the global pool's
mask) is one pytree, `Executor.state`, owned here and passed through every jitted call. Per-step
inputs are numpy arrays handed to the jitted calls as they are: jit moves them to the device in
one go, cheaper than a device array per field.

A finished request leaves the executor at once: its last `TokenEvent` carries it (`result`), so
nothing piles up however the executor is driven.
"""

from collections.abc import Sequence
import dataclasses
import itertools
import time

from flax import nnx
import jax
import numpy as np

from jaxspec import config as config_lib
from jaxspec import schedule as schedule_lib
from jaxspec.device import kv_cache
from jaxspec.device import sampling
from jaxspec.device import step as step_lib
from jaxspec.host import capacity
from jaxspec.host import drafter as drafter_lib
from jaxspec.host import gate as gate_lib
from jaxspec.host import policy as policy_lib
from jaxspec.host import requests as requests_lib
from jaxspec.host import sa_slots
from jaxspec.host import scheduler as scheduler_lib
from jaxspec.host import stats as stats_lib

ENTRY_POINTS = ("prefill", "step", "prime_drafts")


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
    result: requests_lib.Request | None = None

    @property
    def finished(self) -> bool:
        return self.result is not None

    @property
    def finish_reason(self) -> str | None:
        return self.result.finish_reason if self.result is not None else None


@dataclasses.dataclass
class _Plan:
    """One decode batch, as decided in step 5."""

    requests: list[requests_lib.Request]
    rows: int                  # the compile bucket: rows past len(requests) are padding
    k: int
    drafts: np.ndarray         # i32[rows, k] host drafts (zeros for automaton drafts)
    draft_lens: np.ndarray     # i32[rows] real host draft lengths
    slots: np.ndarray          # i32[rows] automaton slots (dummy slot for padding)
    start: float               # when planning began (step time counts from here)
    draft_seconds: float       # host drafting time


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


class Executor:
    """Continuous batching with optional speculation over one model.

    Args:
      model: an NNX module implementing `jaxspec.device.model.CausalLM`.
      scheduler_config: capacity (batch size, token budget, sequence length, KV pages).
      spec: None (plain decoding), an `NGramConfig`, an `SAConfig`, an `AutoConfig` (resolved with
        `suggest_spec_config(max_batch_size)`), or any `Drafter` instance (drafts on the host).
      enhancer: an `SAEnhancerConfig`: device automata whose drafts replace the host drafter's
        where their match is long enough (needs a host drafter as `spec`).
      sa_implementation: automaton kernels: "pallas", "xla" or None (Pallas on GPU).

    Raises:
      ValueError: a capacity the model or the device cannot hold (`jaxspec.host.capacity`).
      TypeError: an unknown spec.
    """

    def __init__(self, model, *, scheduler_config: scheduler_lib.SchedulerConfig,
                 spec: policy_lib.SpecLike = None,
                 enhancer: config_lib.SAEnhancerConfig | None = None,
                 sa_implementation: str | None = None):
        self.config = scheduler_config
        self.policy = policy_lib.resolve(spec, max_batch_size=scheduler_config.max_batch_size,
                                         enhancer=enhancer)
        max_k = self.policy.max_draft_len
        cs = model.cache_spec
        self.slots = None
        if self.policy.uses_automaton:
            self.slots = sa_slots.SASlots(
                max_slots=scheduler_config.max_batch_size,
                max_seq_len=scheduler_config.max_seq_len + 1 + max_k,
                max_num_requests=scheduler_config.max_batch_size,
                enable_global_pool=self.policy.global_pool,
                global_pool_size=self.policy.global_pool_size)
        capacity.check(cs, scheduler_config, max_draft_len=max_k, automata=self.slots)
        self.graphdef, self.params = nnx.split(model)
        self.vocab_size = model.vocab_size
        self.scheduler = scheduler_lib.Scheduler(scheduler_config, max_draft_len=max_k)
        self.batch_buckets = schedule_lib.batch_buckets(
            scheduler_config.max_batch_size, self.policy.draft_len_schedule,
            scheduler_config.batch_buckets)
        self.gate = self.policy.new_gate()
        kv = kv_cache.init_pages(
            num_layers=cs.num_layers, num_pages=self.scheduler.allocator.num_pages,
            page_size=scheduler_config.page_size, num_kv_heads=cs.num_kv_heads,
            head_dim=cs.head_dim)
        automata = self.slots.new_state() if self.slots else None
        self.state = step_lib.init_state(kv, automata, draft_len=max_k)
        self.sa_implementation = sa_implementation
        self._configs: dict[tuple[int, bool], step_lib.StepConfig] = {}
        self._live: dict[int, requests_lib.Request] = {}
        self._unprimed: list[requests_lib.Request] = []
        self._ids = itertools.count()
        self.stats = stats_lib.RunStats()

    def _step_config(self, k: int, greedy_only: bool) -> step_lib.StepConfig:
        """One config object per (K, greedy), reused: jit finds its compiled step by identity."""
        key = (k, greedy_only)
        if key not in self._configs:
            p = self.policy
            self._configs[key] = step_lib.StepConfig(
                graphdef=self.graphdef, k=k, greedy_only=greedy_only, draft_source=p.source,
                automaton=p.uses_automaton, global_pool=p.global_pool,
                sa_draft_len=p.max_draft_len if p.uses_automaton else 0,
                max_ngram_size=p.max_ngram_size, min_match_len=p.min_match_len,
                enhancer_threshold=p.enhancer_threshold, sa_implementation=self.sa_implementation)
        return self._configs[key]

    # ------------------------------------------------------------------ requests

    def add_request(self, prompt: Sequence[int], params: requests_lib.SamplingParams,
                    stop_ids: frozenset[int]) -> int:
        """Queues a request; returns its id.

        Raises:
          ValueError: an unusable prompt (`requests.check_prompt`), or one whose KV pages
            exceed the whole cache.
        """
        prompt = requests_lib.check_prompt(prompt, vocab_size=self.vocab_size,
                                           max_new_tokens=params.max_new_tokens,
                                           max_seq_len=self.config.max_seq_len)
        rid = next(self._ids)
        request = requests_lib.Request(request_id=rid, prompt=prompt, params=params,
                                       stop_ids=stop_ids)
        self.scheduler.add(request)
        self._live[rid] = request
        self.stats.prompt_tokens += len(prompt)
        return rid

    def cancel(self, request_id: int) -> requests_lib.Request:
        """Finishes a queued or running request now; returns it.

        Raises:
          ValueError: an id that is unknown or already finished.
        """
        request = self._live.get(request_id)
        if request is None:
            raise ValueError(f"no live request with id {request_id}")
        return self._finish(request, "cancelled")

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def reset_stats(self) -> None:
        """Starts a new run's metrics."""
        self.stats = stats_lib.RunStats()

    def run(self) -> dict[int, requests_lib.Request]:
        """Steps until every queued request finished; returns them by id."""
        done = {}
        while self.has_work():
            for event in self.step():
                if event.finished:
                    done[event.request_id] = event.result
        return done

    def _finish(self, request: requests_lib.Request, reason: str) -> requests_lib.Request:
        self.scheduler.finish(request, reason)
        if self.policy.drafter is not None:
            self.policy.drafter.release(request.request_id)
        if self.slots is not None:
            self.slots.remove_request(request.request_id)
        if request in self._unprimed:
            self._unprimed.remove(request)
        return self._live.pop(request.request_id)

    # ------------------------------------------------------------------ the iteration

    def step(self) -> list[TokenEvent]:
        """One iteration. Returns the tokens every request committed in it."""
        start = time.perf_counter()
        traces = sum(step_lib.trace_count(name) for name in ENTRY_POINTS)
        generated = self.stats.generated_tokens
        # 1. Draft length for the placeholders, from the active requests.
        k = self._draft_len(self.scheduler.num_active)
        # 2. Batch gate: schedule -> acceptance gate -> capacity.
        k = self._batch_gate(k)
        # 3-4. Placeholders of 1 + K tokens per decoding request, then prompt chunks.
        batch = self.scheduler.schedule(tokens_per_decode=1 + k)
        # 5. The decode batch's rows and K, its drafts and its KV pages.
        plan = self._plan(batch, speculate=k > 0) if batch.decode else None
        # 6. Forward: prompt chunks (their first tokens committed at once), then the decode batch.
        events = self._prefill(batch.prefill) if batch.prefill else []
        if plan is not None:
            out = self._run(plan)
            # 7. Commit.
            decoded, pairs = self._commit(plan, out)
            events += decoded
            # 8. The acceptance gate.
            self._feed_gate(pairs)
        compiled = sum(step_lib.trace_count(name) for name in ENTRY_POINTS) > traces
        self.stats.record_iteration(time.perf_counter() - start,
                                    self.stats.generated_tokens - generated, compiled)
        return events

    def _draft_len(self, num_requests: int) -> int:
        return self.policy.draft_len_for_batch_size(max(num_requests, 1))

    def _batch_gate(self, k: int) -> int:
        if k == 0 or (self.gate is not None and self.gate.disabled):
            return 0
        cfg = self.config
        allowed = self.policy.should_use_spec_decode(
            max(self.scheduler.num_active, 1), cfg.max_batch_size, cfg.max_num_tokens, k)
        return k if allowed else 0

    def _plan(self, batch: scheduler_lib.ScheduledBatch, speculate: bool) -> _Plan:
        start = time.perf_counter()
        reqs = batch.decode
        rows = schedule_lib.bucket_for(len(reqs), self.batch_buckets)
        k = 0
        if speculate:
            # One K per compiled bucket, within the budget the prompt chunks left.
            fits = (self.config.max_num_tokens - batch.num_tokens) // len(reqs) - 1
            k = max(0, min(self.policy.draft_len_for_batch_size(rows), fits))
        drafts = np.zeros((rows, k), np.int32)
        draft_lens = np.zeros((rows,), np.int32)
        if k and self.policy.drafter is not None:
            self.policy.drafter.update_draft_len(k)
            tokens, lens = drafter_lib.pad_drafts(
                self.policy.drafter.prepare_draft_tokens(reqs), k)
            drafts[:len(reqs)], draft_lens[:len(reqs)] = tokens, lens
        slots = np.full((rows,), 0, np.int32)
        if self.slots is not None:
            self._flush_automata()
            slots = self.slots.slots([r.request_id for r in reqs] + [None] * (rows - len(reqs)))
        draft_seconds = time.perf_counter() - start
        # Verifying only padding costs a wider forward for nothing. An automaton's next draft is
        # known from the last step's (or the priming's) outputs.
        automaton_draft = self.slots is not None and any(r.next_draft_len for r in reqs)
        if not (draft_lens.any() or automaton_draft):
            k, drafts = 0, drafts[:, :0]
        for r in reqs:
            r.pages.ensure(r.num_cached + 1 + k)
        return _Plan(requests=reqs, rows=rows, k=k, drafts=drafts, draft_lens=draft_lens,
                     slots=slots, start=start, draft_seconds=draft_seconds)

    def _flush_automata(self):
        """Copies automata built since the last step to the device, and drafts for the new ones."""
        if self.slots.has_pending:
            sa, mask = self.slots.flush(self.state.sa, self.state.active_mask)
            self.state = self.state.replace(sa=sa, active_mask=mask)
        if self._unprimed:
            reqs, self._unprimed = self._unprimed, []
            rows = schedule_lib.bucket_for(len(reqs), self.batch_buckets)
            slots = self.slots.slots([r.request_id for r in reqs] + [None] * (rows - len(reqs)))
            self.state, lens = step_lib.prime_drafts(self.state, slots,
                                                     cfg=self._step_config(0, True))
            for r, n in zip(reqs, np.asarray(lens), strict=False):
                r.next_draft_len = int(n)

    def _sampling_arrays(self, reqs, rows: int) -> sampling.SamplingArrays:
        pad = rows - len(reqs)
        p = [r.params for r in reqs]
        return sampling.SamplingArrays(
            temperature=np.asarray([x.temperature for x in p] + [0.0] * pad, np.float32),
            top_k=np.asarray([x.top_k for x in p] + [0] * pad, np.int32),
            top_p=np.asarray([x.top_p for x in p] + [1.0] * pad, np.float32),
            seed=np.asarray([x.seed for x in p] + [0] * pad, np.int32))

    def _cols(self, num_tokens: int) -> int:
        """Page-table width bucket covering `num_tokens` slots: a power of two, capped."""
        if num_tokens <= 0:
            return 0
        max_cols = self.config.pages_per_seq(self.policy.max_draft_len)
        return min(_pow2_at_least(self.scheduler.allocator.pages_for(num_tokens)), max_cols)

    def _view(self, reqs, rows: int, lengths, num_new, span: int) -> kv_cache.CacheView:
        """Rows' page tables, `span` slots wide (rounded up to a bucket). Attention reads all of
        it, unless nothing is cached yet (first prompt chunks): then it reads nothing. One read
        width per table width keeps the compile count at one per bucket."""
        cols = self._cols(span)
        table = np.zeros((rows, cols), np.int32)
        for i, r in enumerate(reqs):
            table[i] = r.pages.table_row(cols)
        pad = rows - len(reqs)
        return kv_cache.CacheView(page_table=np.asarray(table),
                                  lengths=np.asarray(list(lengths) + [0] * pad, np.int32),
                                  num_new=np.asarray(list(num_new) + [0] * pad, np.int32),
                                  read_cols=cols if max(lengths) else 0)

    def _prefill(self, chunks: list[scheduler_lib.Chunk]) -> list[TokenEvent]:
        """Forward of the prompt chunks; a chunk that completes its prompt commits the first
        generated token and hands the prompt to the automata."""
        start = time.perf_counter()
        rows = schedule_lib.bucket_for(len(chunks), self.batch_buckets)
        width = schedule_lib.bucket_for(max(c.length for c in chunks), self.config.chunk_buckets)
        tokens = np.zeros((rows, width), np.int32)
        for i, c in enumerate(chunks):
            tokens[i, :c.length] = c.request.prompt[c.start:c.start + c.length]
        reqs = [c.request for c in chunks]
        view = self._view(reqs, rows, [c.start for c in chunks], [c.length for c in chunks],
                          span=max(c.start + c.length for c in chunks))
        self.state, first = step_lib.prefill(
            self.params, self.state, tokens, view, self._sampling_arrays(reqs, rows),
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
            result = None
            if r.finish_reason:
                result = self._finish(r, r.finish_reason)
            elif self.slots is not None:
                self.slots.add_request(r.request_id, r.tokens)
                self._unprimed.append(r)
            events.append(TokenEvent(r.request_id, tuple(taken), result))
        self.stats.prefill_time += time.perf_counter() - start
        return events

    def _run(self, plan: _Plan) -> step_lib.StepOutputs:
        # The table spans each row's whole lifetime, so a decoding batch never crosses into a
        # new (uncompiled) width: no compilation in steady-state decoding.
        reqs, pad = plan.requests, plan.rows - len(plan.requests)
        view = self._view(reqs, plan.rows, [r.num_cached for r in reqs], [1 + plan.k] * len(reqs),
                          span=max(r.max_sequence_length for r in reqs)
                          + 1 + self.policy.max_draft_len)
        inputs = step_lib.StepInputs(
            last_tokens=np.asarray([r.output[-1] for r in reqs] + [0] * pad, np.int32),
            drafts=plan.drafts, draft_lens=plan.draft_lens, view=view,
            sampling=self._sampling_arrays(reqs, plan.rows), slots=plan.slots)
        self.state, out = step_lib.step(
            self.params, self.state, inputs,
            cfg=self._step_config(plan.k, all(r.params.greedy for r in reqs)))
        return jax.device_get(out)

    def _commit(self, plan: _Plan, out: step_lib.StepOutputs):
        """Appends each row's committed tokens; returns (events, (accepted, drafted) per row)."""
        reqs = plan.requests
        if self.slots is not None:
            self.slots.advance([r.request_id for r in reqs], out.num_new_tokens[:len(reqs)])
        events, pairs, kept = [], [], []
        for i, r in enumerate(reqs):
            n = int(out.num_new_tokens[i])
            drafted = int(out.draft_lens[i])
            r.num_cached += n
            taken = r.append(out.new_tokens[i, :n])
            accepted = stats_lib.accepted_drafts(len(taken), n)
            r.steps += 1
            r.drafted += drafted
            r.accepted += accepted
            r.acceptance_lengths.append(len(taken))
            r.next_draft_len = int(out.next_draft_lens[i])
            pairs.append((accepted, drafted))
            kept.append(len(taken))
            self.stats.generated_tokens += len(taken)
            result = self._finish(r, r.finish_reason) if r.finish_reason else None
            events.append(TokenEvent(r.request_id, tuple(taken), result))
        self.stats.record_step(plan.k, [d for _, d in pairs], [a for a, _ in pairs], kept,
                               time.perf_counter() - plan.start, plan.draft_seconds)
        return events, pairs

    def _feed_gate(self, pairs: list[tuple[int, int]]):
        rate = gate_lib.pooled_acceptance_rate(pairs)
        if self.gate is not None and rate is not None:
            self.gate.record_acceptance_rate(rate)
