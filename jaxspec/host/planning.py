"""How the executor plans a decode step: steps 1, 2 and 5 of `Executor.step` (executor.py).

The draft length for the placeholders (`_draft_len`), the batch gate (`_batch_gate`), and the plan
of the scheduled decode batch (`_plan`, a `plans.Plan`): its rows bucket and K, its drafts (host
drafters draft now; the automata drafted inside the previous step, on the device), adaptive K's
width (`widths.WidthPlanner`), the gates, and the rests of automata whose drafts do not pay
(rest.py).

`StepPlanning` is a part of `Executor` (a mixin): it works over the executor's policy, config,
scheduler, gates, width planner, rests, automaton slots and programs.
"""

import time

import numpy as np

from jaxspec import schedule as schedule_lib
from jaxspec.host import drafter as drafter_lib
from jaxspec.host import gate as gate_lib
from jaxspec.host import plans
from jaxspec.host import requests as requests_lib
from jaxspec.host import rest as rest_lib
from jaxspec.host import scheduler as scheduler_lib
from jaxspec.host import widths as widths_lib


class StepPlanning:
    """Steps 1, 2 and 5 of `Executor.step` (the module docstring)."""

    def _draft_len(self, num_requests: int) -> int:
        return self.policy.draft_len_for_batch_size(max(num_requests, 1))

    def _batch_gate(self, k: int) -> int:
        """The largest K this iteration may use: 0 with speculation off (schedule, acceptance
        gate, capacity), a probe's length while a reversible gate probes, else max_draft_len."""
        cap = self.policy.max_draft_len
        if self.gate is not None:
            cap = self.gate.allowed(cap)
        if k == 0 or cap == 0:
            return 0
        cfg = self.config
        allowed = self.policy.should_use_spec_decode(
            max(self.scheduler.num_active, 1), cfg.max_batch_size, cfg.max_num_tokens, k)
        return cap if allowed else 0

    def _bucket_k(self, rows: int, num_requests: int, prefill_tokens: int, cap: int) -> int:
        """One K per compiled bucket, within the budget the prompt chunks left and the gate's
        cap."""
        fits = (self.config.max_num_tokens - prefill_tokens) // num_requests - 1
        return max(0, min(self.policy.draft_len_for_batch_size(rows), fits, cap))

    def _plan(self, batch: scheduler_lib.ScheduledBatch, cap: int) -> plans.Plan:
        start = time.perf_counter()
        reqs = batch.decode
        rows = schedule_lib.bucket_for(len(reqs), self.batch_buckets)
        k = self._bucket_k(rows, len(reqs), batch.num_tokens, cap)
        allowed = k

        def program(width, bucket):
            return self._program(width, reqs, bucket)

        if self.planner is not None:
            rows = self.planner.rows(program, rows, self.batch_buckets)
        if self._rests is not None:
            self._tick_rests(reqs)
        drafts, lens, matches, slots, parents = self._drafts(reqs, rows, k)
        decide_start = time.perf_counter()
        if self.planner is not None and k and lens.any():
            k, lens = self.planner.choose(
                program, rows, k, lens, matches, context=max(r.num_cached for r in reqs) + 1,
                starting=any(r.steps < widths_lib.START_STEPS for r in reqs),
                left=max(r.params.max_new_tokens - len(r.output) for r in reqs))
        if self._request_gates is not None:
            for i, r in enumerate(reqs):
                lens[i] = self._request_gate(r).allowed(lens[i])
        lens = np.minimum(lens, k)
        if self._rests is not None and allowed:
            for r, n in zip(reqs, lens, strict=False):
                rest = self._rests.setdefault(r.request_id, rest_lib.Rest())
                if not rest.resting and not n:
                    rest.planned(drafted=False)     # a verified row is judged once read
        # Verifying only padding costs a wider forward for nothing.
        bare = False
        if not lens.any():
            k = self.planner.plain_width(program, rows) if self.planner is not None else 0
            drafts = parents = np.zeros((rows, k), np.int32)
            if k == 0 and self._rests is not None and all(map(self._resting, reqs)):
                bare = self._bare_ready(reqs, rows)
        decide_seconds = time.perf_counter() - decide_start
        for r in reqs:
            r.pages.ensure(r.num_cached + 1 + k)
        return plans.Plan(requests=reqs, rows=rows, k=k, drafts=drafts[:, :k], draft_lens=lens,
                     matches=matches, slots=slots, start=start,
                     draft_seconds=time.perf_counter() - start, decide_seconds=decide_seconds,
                     bare=bare, parents=parents[:, :k] if self.programs.tree(k, bare) else None)

    def _drafts(self, reqs, rows: int, k: int):
        """Every row's drafts: (host tokens i32[rows, k], real lengths i32[rows], match lengths
        i32[rows], automaton slots i32[rows], token trees' parents i32[rows, k]). Host drafters
        draft now; the automata drafted inside the previous step (or the priming), whose
        outputs gave their lengths. A tree's nodes come parents first, so the first n of them
        (a width cut to n) are a tree too."""
        drafts = np.zeros((rows, k), np.int32)
        lens = np.zeros((rows,), np.int32)
        matches = np.zeros((rows,), np.int32)
        parents = np.zeros((rows, k), np.int32)
        n = len(reqs)
        if k and self.policy.drafter is not None:
            self.policy.drafter.update_draft_len(k)
            if self.policy.tree:
                tokens, up, found = self.policy.drafter.prepare_trees(reqs)
                parents[:n] = drafter_lib.pad_drafts(up, k)[0]
            else:
                tokens, found = self.policy.drafter.prepare_drafts(reqs)
            drafts[:n], lens[:n] = drafter_lib.pad_drafts(tokens, k)
            if found is not None:
                matches[:n] = found
        slots = np.zeros((rows,), np.int32)
        if self.slots is not None:
            self._flush_automata()
            # A resting request's row points at the dummy slot: nothing extended or searched.
            ids = [None if self._resting(r) else r.request_id for r in reqs]
            slots = self.slots.slots(ids + [None] * (rows - n))
            automaton = np.asarray([0 if i is None else r.next_draft_len
                                    for r, i in zip(reqs, ids, strict=True)], np.int32)
            # The automaton's draft where it has one: all of them ("sa"), or the rows whose
            # match reaches the enhancer's threshold (their admitted length is non-zero).
            lens[:n] = np.where(automaton > 0, automaton, lens[:n])
            matches[:n] = np.where(automaton > 0, [r.next_match_len for r in reqs], matches[:n])
        return drafts, lens, matches, slots, parents

    def _resting(self, request: requests_lib.Request) -> bool:
        rest = None if self._rests is None else self._rests.get(request.request_id)
        return rest is not None and rest.resting

    def _tick_rests(self, reqs):
        """A step of each resting request's rest; one whose rest ends gets its automaton rebuilt
        from all of its tokens, copied and primed by the next flush."""
        for r in reqs:
            rest = self._rests.get(r.request_id)
            if rest is not None and rest.resting and rest.tick():
                self.slots.add_request(r.request_id, r.tokens)
                self._unprimed.append(r)

    def _request_gate(self, request: requests_lib.Request) -> gate_lib.ReversibleGate:
        gate = self._request_gates.get(request.request_id)
        if gate is None:
            gate = self._request_gates[request.request_id] = self.policy.new_gate()
        return gate

    def _bare_ready(self, reqs, rows: int) -> bool:
        """Whether the plain step that leaves the automata alone is compiled for the batch,
        asked for in the background otherwise. Resting automata are not extended: nor need the
        step touch them (5% of a SmolLM2 plain step on a CPU)."""
        key, build = self._program(0, reqs, rows, bare=True)
        self.compiles.request(key, build)
        return self.compiles.ready(key)

    def _judge_drafts(self, plan: plans.Plan, context: int, accepted: dict[int, int]) -> None:
        """Each verified row's planned step for its rest, once the target verified it
        (`accepted`: request id -> drafts the target accepted; `context`: the batch's longest
        live context when planned): its draft paid when the target accepted as many tokens as
        the verify step costs beyond a plain one, in plain steps (the cost model); one that
        did not pay is an idle step (rest.py)."""
        plain, verify = self.costs.costs(plan.rows, context, [0, plan.k])
        price = verify / plain - 1
        for rid, n in accepted.items():
            rest = self._rests.get(rid)
            if rest is not None and not rest.resting:
                rest.planned(drafted=n >= price)

    def _allowed_k(self, plan: plans.Plan) -> int:
        """The widest step the plan's batch may run now, with no prompt chunk beside it."""
        n = len(plan.requests)
        return self._bucket_k(plan.rows, n, 0, self._batch_gate(self._draft_len(n)))
