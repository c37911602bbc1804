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
     With adaptive K, a request whose drafts stopped paying rests its automaton (rest.py).
  6. `_dispatch`: forward + verify in one jitted call (`_prefill` does the forward of prompt
     chunks); KV rollback is a length reset.
  7. `_read` + `_commit`: the step's outputs in one transfer; accepted tokens + the bonus token
     go to the requests; the automata were extended with exactly those tokens inside the step,
     which also produced the next drafts.
  8. `_feed_gate`: the acceptance gate sees the batch's pooled rate (accepted / really drafted).

K = 0 is plain decoding through the same machinery. The host is the source of truth for sequence
lengths and page tables; the device state (KV pages, automata, next drafts, the global pool's
mask) is one pytree, `Executor.state`, owned here and passed through every jitted call. Per-step
inputs are numpy arrays handed to the jitted calls as they are: jit moves them to the device in
one go, cheaper than a device array per field.

A finished request leaves the executor at once: its last `TokenEvent` (requests.py) carries it
(`result`), so nothing piles up however the executor is driven.

The overlap scheduler (`overlap.py`) lets the host work one step behind the device while the
batch does not change; everything else runs synchronously, each step read in the iteration that
dispatched it. Steps 1, 2 and 5 live in `planning.py`, the overlap's decisions in `overlap.py`:
both are parts of `Executor` (mixins), over its attributes.
"""

from collections.abc import Sequence
import functools
import itertools
import time

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from jaxspec import config as config_lib
from jaxspec import schedule as schedule_lib
from jaxspec.device import kv_cache
from jaxspec.device import sharding
from jaxspec.device import step as step_lib
from jaxspec.host import acceptance
from jaxspec.host import capacity
from jaxspec.host import compiles as compiles_lib
from jaxspec.host import cost_model as cost_model_lib
from jaxspec.host import gate as gate_lib
from jaxspec.host import overlap
from jaxspec.host import planning
from jaxspec.host import plans
from jaxspec.host import policy as policy_lib
from jaxspec.host import programs as programs_lib
from jaxspec.host import requests as requests_lib
from jaxspec.host import rest as rest_lib
from jaxspec.host import sa_slots
from jaxspec.host import scheduler as scheduler_lib
from jaxspec.host import stats as stats_lib
from jaxspec.host import widths as widths_lib

ENTRY_POINTS = ("prefill", "prime_drafts")     # jitted in the iteration; steps: programs.py


class Executor(planning.StepPlanning, overlap.OverlapScheduler):
    """Continuous batching with optional speculation over one model.

    Args:
      model: an NNX module implementing `jaxspec.device.model.CausalLM`.
      scheduler_config: capacity (batch size, token budget, sequence length, KV pages).
      spec: None (plain decoding), an `NGramConfig`, an `SAConfig`, an `AutoConfig` (resolved with
        `suggest_spec_config(max_batch_size)`), or any `Drafter` instance (drafts on the host).
      enhancer: an `SAEnhancerConfig`: device automata whose drafts replace the host drafter's
        where their match is long enough (needs a host drafter as `spec`).
      implementation: kernels (automaton, paged attention): "pallas", "xla" or None (Pallas on
        GPU).
      cost_model: the step-cost model adaptive K decides with (default: this model's, kept under
        the cache directory, `jaxspec.host.cost_model.default_path`).
      kv_dtype: the KV cache's dtype (None: the model's, `cache_spec.dtype`).
      mesh: a `jax.sharding.Mesh` with axes `data` and `model` to run over
        (`jaxspec.device.sharding`), or None for the default device. The model must already
        have as many KV heads as the mesh needs (`Engine` repeats them).
      record_top2: keep, per output token, the target's two best logits and the verify window
        it came from (`Request.top2`, `Request.windows`), for the greedy-equivalence report.
      overlap: dispatch a step before reading the one in flight when the batch does not change
        and its drafts come from the device (`overlap.py`); False: every step is read in
        the iteration that dispatched it. Outputs are the same either way.
      numerics: "fast" or "exact": how every forward computes its rows
        (`jaxspec.device.kv_cache.CacheView.numerics`; `Engine` resolves the default).

    Raises:
      ValueError: a capacity the model or the device cannot hold (`jaxspec.host.capacity`).
      TypeError: an unknown spec.
    """

    def __init__(self, model, *, scheduler_config: scheduler_lib.SchedulerConfig,
                 spec: policy_lib.SpecLike = None,
                 enhancer: config_lib.SAEnhancerConfig | None = None,
                 implementation: str | None = None,
                 cost_model: cost_model_lib.StepCostModel | None = None,
                 kv_dtype=None, record_top2: bool = False, mesh=None, overlap: bool = True,
                 numerics: str = "fast"):
        self.config = scheduler_config
        self.record_top2 = record_top2
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
        self.kv_dtype = jnp.dtype(cs.dtype if kv_dtype is None else kv_dtype)
        capacity.check(cs, scheduler_config, max_draft_len=max_k, automata=self.slots,
                       kv_dtype=self.kv_dtype)
        self.mesh = None if mesh is None else sharding.auto_mesh(mesh)
        data = 1
        if self.mesh is not None:
            sharding.check(self.mesh, num_heads=cs.num_heads, num_kv_heads=cs.num_kv_heads,
                           max_batch_size=scheduler_config.max_batch_size)
            data, model_size = sharding.sizes(self.mesh)
            if cs.num_kv_heads % model_size:
                raise ValueError(f"the model has {cs.num_kv_heads} KV heads for model="
                                 f"{model_size}: repeat them first (`with_kv_heads`)")
        graphdef, self.params = nnx.split(model)
        self.graphdef = step_lib.canonical_graphdef(graphdef)
        if self.mesh is not None:
            specs = model.param_specs(sharding.MODEL, sharding.sizes(self.mesh)[1])
            self.params = sharding.place_params(self.mesh, self.params, specs)
        self.params = step_lib.weights(self.params)
        self.vocab_size = model.vocab_size
        self.scheduler = scheduler_lib.Scheduler(scheduler_config, max_draft_len=max_k)
        # Every page table is as wide as the longest sequence allowed: one width per compiled
        # bucket. Attention reads only up to each row's length, whatever the width.
        table_cols = scheduler_config.pages_per_seq(max_k)
        # With a mesh, every bucket splits evenly over the data shards.
        self.batch_buckets = tuple(sorted({-(-b // data) * data for b in schedule_lib.batch_buckets(
            scheduler_config.max_batch_size, self.policy.draft_len_schedule,
            scheduler_config.batch_buckets)}))
        self.gate = self.policy.new_gate()
        # Reversible gating also gates each request on its own acceptance.
        self._request_gates = ({} if self.gate is not None and self.policy.gate == "reversible"
                               else None)
        self.planner = None
        self._compiles = compiles_lib.LEDGER
        if self.policy.adaptive:
            self.planner = widths_lib.WidthPlanner(
                max_draft_len=max_k, start_draft_len=self.policy.start_draft_len or max_k,
                costs=cost_model or cost_model_lib.StepCostModel(
                    cost_model_lib.default_path(cost_model_lib.model_key(model, self.kv_dtype))),
                compiles=self._compiles,
                predictor=acceptance.carried(model, self.policy.drafting, max_k))
        # Adaptive K rests the automata of requests whose drafts do not pay (rest.py).
        self._rests: dict[int, rest_lib.Rest] | None = (
            {} if self.policy.adaptive and self.slots is not None else None)
        init_kv = functools.partial(
            kv_cache.init_pages, num_layers=cs.num_layers,
            num_pages=self.scheduler.allocator.num_pages, page_size=scheduler_config.page_size,
            num_kv_heads=cs.num_kv_heads, head_dim=cs.head_dim, dtype=self.kv_dtype)
        if self.mesh is None:
            kv = init_kv()
        else:       # zeros made in place: the whole cache never sits on one device
            kv = jax.jit(init_kv, out_shardings=sharding.NamedSharding(
                self.mesh, sharding.KV_SPEC))()
        automata = self.slots.new_state() if self.slots else None
        self.state = self._placed(step_lib.init_state(kv, automata, draft_len=max_k))
        self.layout = plans.Layout(table_cols=table_cols, implementation=implementation,
                                   mesh=self.mesh, numerics=numerics)
        self.programs = programs_lib.StepPrograms(
            graphdef=self.graphdef, policy=self.policy, params=self.params, state=self.state,
            layout=self.layout, record_top2=record_top2,
            dummy_slot=None if self.slots is None else self.slots.dummy_slot)
        self._step_compiled = False
        self._live: dict[int, requests_lib.Request] = {}
        self._unprimed: list[requests_lib.Request] = []
        self.overlap = overlap
        # Host drafters, adaptive K and the gates decide each step from the last one's outputs.
        p = self.policy
        self._overlappable = p.source in ("none", "sa") and not p.adaptive and self.gate is None
        # ...except adaptive K's plain steps, while they stay plain: every automaton rests
        # (`_rests_hold`), or the drafts they find would not be verified (`_plain_holds`).
        self._adaptive_chains = self._rests is not None and self.gate is None
        self._inflight: plans.InFlight | None = None
        self._ids = itertools.count()
        self.stats = stats_lib.RunStats()

    @property
    def compiles(self) -> compiles_lib.CompileLedger:
        """The compiled programs this executor runs and asks for (default: the process's)."""
        return self._compiles

    @compiles.setter
    def compiles(self, ledger: compiles_lib.CompileLedger):
        self._compiles = ledger
        if self.planner is not None:
            self.planner.compiles = ledger

    @property
    def predictor(self):
        return None if self.planner is None else self.planner.predictor

    @property
    def costs(self):
        return None if self.planner is None else self.planner.costs

    @property
    def widths(self) -> tuple[int, ...]:
        return self.planner.widths

    def warmup(self) -> None:
        """Asks for every step program the schedule runs, compiled in the background: per rows
        bucket the plain step, the schedule's K and, with adaptive K, the start width."""
        for rows in self.batch_buckets:
            widths = {0, self.policy.draft_len_for_batch_size(rows)}
            if self.planner is not None:
                widths.add(min(self.planner.start, max(widths)))
            for k in sorted(widths):
                self.compiles.request(*self._program(k, (), rows))

    def _placed(self, state: step_lib.DeviceState) -> step_lib.DeviceState:
        """The device state on its mesh shardings, or committed to its device without a mesh:
        kept the same from call to call, so no input layout ever compiles a program twice. (A
        new engine's zeros are uncommitted and a step's outputs committed: jit compiled
        `write_slot` and `prime_drafts` again, 1.5 s inside a CPU iteration, where a process's
        first rest ended.)"""
        if self.mesh is None:
            return jax.tree.map(lambda a: jax.device_put(a, a.sharding), state)
        return sharding.place(state, sharding.state_shardings(self.mesh, state))

    def _rows(self, tree):
        """Per-row step inputs, split over the mesh's data shards (as they are without one)."""
        return tree if self.mesh is None else sharding.place_rows(self.mesh, tree)

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
        if self.record_top2:
            request.top2, request.windows = [], []
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
        if self._request_gates is not None:
            self._request_gates.pop(request.request_id, None)
        if self._rests is not None:
            self._rests.pop(request.request_id, None)
        return self._live.pop(request.request_id)

    # ------------------------------------------------------------------ the iteration

    def step(self) -> list[requests_lib.TokenEvent]:
        """One iteration. Returns the tokens every request committed in it: with the overlap
        scheduler, those of the step dispatched one iteration before."""
        start = time.perf_counter()
        traces = sum(step_lib.trace_count(name) for name in ENTRY_POINTS)
        self._step_compiled = False
        generated = self.stats.generated_tokens
        decode_k = None
        if self._chains():
            # 5-8, the host one step behind: the next step is dispatched, then the one in
            # flight is read and committed.
            events = self._chain()
            decode_k = self._inflight.plan.k
        else:
            if self._inflight is not None:
                # A chain ends: the step in flight is read first, its own iteration in the
                # stats (the device ran it while the host waited here).
                k_read = self._inflight.plan.k
                events = self._drain()
                now = time.perf_counter()
                self.stats.record_iteration(now - start, self.stats.generated_tokens - generated,
                                            False, k_read)
                start, generated = now, self.stats.generated_tokens
            else:
                events = []
            # 1. Draft length for the placeholders, from the active requests.
            k = self._draft_len(self.scheduler.num_active)
            # 2. Batch gate: schedule -> acceptance gate -> capacity.
            cap = self._batch_gate(k)
            # 3-4. Placeholders of 1 + K tokens per decoding request, then prompt chunks.
            batch = self.scheduler.schedule(tokens_per_decode=1 + min(k, cap))
            # 5. The decode batch's rows and K, its drafts and its KV pages.
            plan = self._plan(batch, cap) if batch.decode else None
            # 6. Forward: prompt chunks (their first tokens committed at once), then the decode
            # batch.
            events += self._prefill(batch.prefill) if batch.prefill else []
            if plan is not None and not batch.prefill:
                decode_k = plan.k
            if plan is not None:
                self._inflight = self._dispatch(plan)
                # 7-8. Commit and feed the acceptance gate, unless the next iteration can
                # dispatch the next step first.
                if not self._chains():
                    events += self._drain()
        traced = sum(step_lib.trace_count(name) for name in ENTRY_POINTS) > traces
        if traced:
            compiles_lib.settle_heap()      # what jit kept of the trace (compiles.py)
        compiled = self._step_compiled or traced
        self.stats.record_iteration(time.perf_counter() - start,
                                    self.stats.generated_tokens - generated, compiled,
                                    decode_k)
        if self.costs is not None and not self.has_work():
            # Idle: the next engine on this machine starts from every step timed so far.
            self.costs.save()
        return events

    def _program(self, k: int, reqs, rows: int, bare: bool = False):
        """(the compile ledger's key, a function compiling it) of the step that runs `reqs` at
        width `k` on `rows` rows."""
        return self.programs.program(k, all(r.params.greedy for r in reqs), rows, bare)

    def _flush_automata(self):
        """Copies automata built since the last step to the device, and drafts for the new ones."""
        if self.slots.has_pending:
            sa, mask = self.slots.flush(self.state.sa, self.state.active_mask)
            self.state = self._placed(self.state.replace(sa=sa, active_mask=mask))
        if self._unprimed:
            reqs, self._unprimed = self._unprimed, []
            rows = schedule_lib.bucket_for(len(reqs), self.batch_buckets)
            slots = self.slots.slots([r.request_id for r in reqs] + [None] * (rows - len(reqs)))
            self.state, lens, matches = step_lib.prime_drafts(self.state, self._rows(slots),
                                                              cfg=self.programs.config(0, True))
            lens, matches = sharding.to_host((lens, matches))
            for r, n, m in zip(reqs, lens, matches, strict=False):
                r.next_draft_len, r.next_match_len = int(n), int(m)

    def _prefill(self, chunks: list[scheduler_lib.Chunk]) -> list[requests_lib.TokenEvent]:
        """Forward of the prompt chunks; a chunk that completes its prompt commits the first
        generated token and hands the prompt to the automata."""
        start = time.perf_counter()
        rows = schedule_lib.bucket_for(len(chunks), self.batch_buckets)
        width = schedule_lib.bucket_for(max(c.length for c in chunks), self.config.chunk_buckets)
        tokens = np.zeros((rows, width), np.int32)
        for i, c in enumerate(chunks):
            tokens[i, :c.length] = c.request.prompt[c.start:c.start + c.length]
        reqs = [c.request for c in chunks]
        view = plans.view(self.layout, reqs, rows, [c.start for c in chunks],
                          [c.length for c in chunks])
        self.state, first, top2 = step_lib.prefill(
            self.params, self.state,
            *self._rows((tokens, view, plans.sampling_arrays(reqs, rows))),
            cfg=self.programs.config(0, all(r.params.greedy for r in reqs)))
        first, top2 = sharding.to_host((first, top2))
        events = []
        for i, c in enumerate(chunks):
            r = c.request
            r.num_cached += c.length
            if not c.completes_prompt:
                continue
            r.state = requests_lib.State.DECODE
            taken = r.append([first[i]])
            if self.record_top2:
                r.top2.append(tuple(float(x) for x in top2[i]))
                r.windows.append((0, 0, 0))
            self.stats.generated_tokens += len(taken)
            result = None
            if r.finish_reason:
                result = self._finish(r, r.finish_reason)
            elif self.slots is not None:
                self.slots.add_request(r.request_id, r.tokens)
                self._unprimed.append(r)
            events.append(requests_lib.TokenEvent(r.request_id, tuple(taken), result))
        self.stats.prefill_time += time.perf_counter() - start
        return events

    def _dispatch(self, plan: plans.Plan,
                  previous: step_lib.StepOutputs | None = None) -> plans.InFlight:
        """Starts the plan's step on the device; `previous`: the unread outputs of the step
        before it (same rows), which give it its last tokens and lengths (a chained step)."""
        inputs = plans.step_inputs(self.layout, plan, None if previous is None else (
            previous.new_tokens, previous.num_new_tokens))
        key, build = self._program(plan.k, plan.requests, plan.rows, bare=plan.bare)
        start = time.perf_counter()
        compiled = not self.compiles.ready(key)
        program = self.compiles.get(key, build)
        # On a CPU a program's first call finishes its machine code (compiles.py): not a step's
        # time either.
        compiled |= self.compiles.first_call(key)
        self._step_compiled |= compiled
        self.state, out = program(self.params, self.state, self._rows(inputs))
        return plans.InFlight(plan=plan, out=out, key=key, dispatched=start, compiled=compiled,
                              chained=previous is not None)

    def _read(self, step: plans.InFlight) -> tuple[list[requests_lib.TokenEvent], float]:
        """Steps 7-8 of a dispatched step: reads its outputs (one transfer), commits them and
        feeds the gate. Returns the events and when the outputs arrived."""
        out = sharding.to_host(step.out)
        arrived = time.perf_counter()
        # A step read right after its dispatch took the time since; a chained one, the time
        # since the step before it arrived (`_chain`): what it adds to a run of steps.
        seconds = arrived - (step.plan.start if step.chained else step.dispatched)
        if self.costs is not None and not step.compiled:
            reqs = step.plan.requests
            self.costs.observe(step.plan.rows, step.plan.k,
                               max(r.num_cached for r in reqs) + 1, seconds)
        events, pairs = self._commit(step.plan, out)
        self._feed_gate(pairs)
        return events, arrived

    def _drain(self) -> list[requests_lib.TokenEvent]:
        """Reads and commits the step in flight, if there is one."""
        if self._inflight is None:
            return []
        step, self._inflight = self._inflight, None
        return self._read(step)[0]

    def _commit(self, plan: plans.Plan, out: step_lib.StepOutputs):
        """Appends each row's committed tokens; returns (events, (accepted, drafted) per row)."""
        reqs = plan.requests
        if self.slots is not None:
            # Rows on the dummy slot (padding, resting requests) extended nothing.
            dummy = self.slots.dummy_slot
            self.slots.advance([r.request_id if s != dummy else None
                                for r, s in zip(reqs, plan.slots, strict=False)],
                               out.num_new_tokens[:len(reqs)])
        events, pairs, kept, learned, verified = [], [], [], [], {}
        context = max(r.num_cached for r in reqs) + 1
        for i, r in enumerate(reqs):
            if r.finished:
                # It ended after this step was dispatched (at the step before, or cancelled):
                # nothing of this step is its.
                continue
            n = int(out.num_new_tokens[i])
            drafted = int(out.draft_lens[i])
            # A stop token does not cut what the target accepted.
            learned.append((int(plan.matches[i]), drafted, n - 1))
            if drafted and self._request_gates is not None:
                self._request_gate(r).record_acceptance_rate(min(n - 1, drafted) / drafted)
            r.num_cached += n
            taken = r.append(out.new_tokens[i, :n])
            accepted = stats_lib.accepted_drafts(len(taken), n)
            r.steps += 1
            if self.record_top2:
                r.top2.extend(tuple(float(x) for x in t) for t in out.top2[i, :len(taken)])
                r.windows.extend((r.steps, j, plan.k) for j in range(len(taken)))
            r.drafted += drafted
            r.accepted += accepted
            if drafted:
                verified[r.request_id] = min(n - 1, drafted)
            r.acceptance_lengths.append(len(taken))
            r.next_draft_len = int(out.next_draft_lens[i])
            r.next_match_len = int(out.next_match_len[i])
            pairs.append((accepted, drafted))
            kept.append(len(taken))
            self.stats.generated_tokens += len(taken)
            result = self._finish(r, r.finish_reason) if r.finish_reason else None
            events.append(requests_lib.TokenEvent(r.request_id, tuple(taken), result))
        if self.planner is not None:
            self.planner.learned(plan.k, learned)
        if self._rests is not None and verified:
            self._judge_drafts(plan, context, verified)
        if kept:
            self.stats.record_step(plan.k, [d for _, d in pairs], [a for a, _ in pairs], kept,
                                   time.perf_counter() - plan.start, plan.draft_seconds,
                                   plan.decide_seconds)
        return events, pairs

    def _feed_gate(self, pairs: list[tuple[int, int]]):
        rate = gate_lib.pooled_acceptance_rate(pairs)
        if self.gate is not None and rate is not None:
            self.gate.record_acceptance_rate(rate)
