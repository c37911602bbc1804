"""The overlap scheduler (TensorRT-LLM's): reading a step's outputs makes the host wait for the
device, and planning the next step after that leaves the device idle (3.5 ms of device time per
SmolLM2 step on an H200 became 6.7 ms that way). So while the batch does not change and its drafts
come from the device (plain decoding; the automata at a fixed K; adaptive K's plain steps while
the planner would not verify what the automata find, or while every automaton rests), the host
dispatches the next step before it reads the one in flight, whose outputs give the next one its
last tokens and lengths on the device (`_chain`), and commits the one in flight while the device
runs the next: the host works one step behind. A request that a stop token ends has its row of
the next step discarded; its pages and automaton slot are reused only after that step was read (a
change of batch drains the step in flight first), and the device runs the steps in order anyway:
every call takes the state the one before returned.

`OverlapScheduler` is a part of `Executor` (a mixin): it works over the executor's step in
flight, scheduler, policy, planner, rests and compiled programs.
"""

import dataclasses
import time

import numpy as np

from jaxspec.host import plans
from jaxspec.host import requests as requests_lib
from jaxspec.host import rest as rest_lib
from jaxspec.host import widths as widths_lib


class OverlapScheduler:
    """Whether the next step is dispatched before the one in flight is read, and the chained
    iteration that does it (the module docstring)."""

    def _chains(self) -> bool:
        """Whether the next step can be dispatched before the one in flight is read: the same
        requests in the same rows, nothing else to schedule, drafts made on the device at an
        unchanged K, and no request the step in flight may end by its length. A stop token
        costs the next step's row of its request, discarded; the length limit is known ahead,
        and a next step past it could also write KV beyond the pages reserved for the request."""
        step = self._inflight
        if not (self.overlap and step is not None
                and (self._overlappable or self._adaptive_chains
                     and (step.plan.bare or step.plan.k == 0))):
            return False
        reqs, k, s = step.plan.requests, step.plan.k, self.scheduler
        if len(s.running) != len(reqs) or any(r.finished for r in reqs):
            return False            # a request left, or one is prefilling
        if s.waiting and len(s.running) < self.config.max_batch_size:
            return False            # one may join (a full batch keeps the queue waiting)
        if any(r.params.max_new_tokens - len(r.output) <= 1 + k for r in reqs):
            return False
        if self.policy.source == "none":
            return True
        if not self._overlappable:
            resting = all(map(self._resting, reqs))
            return (self._rests_hold if resting else self._plain_holds)(step.plan)
        # The automata chain at the K their batch last had, above 0: while no row drafts, a step
        # is planned from the last one's outputs, which say whether it found drafts. The drafts
        # of the step in flight stand in for those it is making (the device caps the lengths).
        n = len(reqs)
        placeholder = self._draft_len(n)
        cap = self._batch_gate(placeholder)
        return (k > 0 and any(r.next_draft_len for r in reqs)
                and n * (1 + min(placeholder, cap)) <= self.config.max_num_tokens
                and self._bucket_k(step.plan.rows, n, 0, cap) == k)

    def _plain_holds(self, plan: plans.Plan) -> bool:
        """Whether adaptive K may chain a plain step of awake automata with another: asked as
        for a new step (it may ask for compiles), the planner would not verify the drafts the
        last read step left; no request is in its start steps, resting or due to rest; and the
        plain step's program, which chained steps run too, is compiled (asked for in the
        background otherwise). A draft that pays
        found by the step in flight is verified one step later: the automaton keeps the match."""
        reqs = plan.requests
        rests = [self._rests.get(r.request_id) for r in reqs]
        if (any(r.steps < widths_lib.START_STEPS for r in reqs)
                or any(x is not None and (x.resting or x.due) for x in rests)):
            return False
        pad = [0] * (plan.rows - len(reqs))
        lens = np.asarray([r.next_draft_len for r in reqs] + pad, np.int32)
        allowed = self._allowed_k(plan)
        if allowed and lens.any():
            k, _ = self.planner.choose(
                lambda width, bucket: self._program(width, reqs, bucket), plan.rows, allowed,
                lens, np.asarray([r.next_match_len for r in reqs] + pad, np.int32),
                context=max(r.num_cached for r in reqs) + 1, starting=False,
                left=max(r.params.max_new_tokens - len(r.output) for r in reqs))
            if k:
                return False
        key, build = self._program(0, reqs, plan.rows)
        self.compiles.request(key, build)
        return self.compiles.ready(key)

    def _rests_hold(self, plan: plans.Plan) -> bool:
        """Whether adaptive K may chain a plain step of a batch whose every request rests: its
        plan needs nothing the step in flight returns while every rest lasts beyond the next
        step. The chain runs the bare program once that is compiled (`_chain`), the plain one
        till then: it does not wait for a compile."""
        return all(self._rests[r.request_id].left >= 2 for r in plan.requests)

    def _chain(self) -> list[requests_lib.TokenEvent]:
        """Dispatches the next step of the batch in flight, then reads and commits the step in
        flight while the device runs the next one."""
        start = time.perf_counter()
        step = self._inflight
        plan = step.plan
        if self._rests is not None:
            self._tick_rests(plan.requests)         # none ends (`_rests_hold`)
            if all(map(self._resting, plan.requests)):
                plan = dataclasses.replace(plan, bare=self._bare_ready(plan.requests, plan.rows))
            elif self._allowed_k(plan):
                for r in plan.requests:             # none starts a rest (`_plain_holds`)
                    self._rests.setdefault(r.request_id, rest_lib.Rest()).planned(drafted=False)
        for r in plan.requests:
            # Pages for what the step in flight and the next one may write.
            r.pages.ensure(r.num_cached + 2 * (1 + plan.k))
        lens = np.zeros_like(plan.draft_lens)
        lens[:len(plan.requests)] = plan.k          # capped on the device (automata: admitted)
        plan = dataclasses.replace(plan, draft_lens=lens, matches=np.zeros_like(plan.matches),
                                   start=start, draft_seconds=time.perf_counter() - start,
                                   decide_seconds=0.0)
        self._inflight = self._dispatch(plan, previous=step.out)
        events, arrived = self._read(step)
        # The device ran the step in flight until its outputs arrived: this one's time (stats)
        # counts from then.
        plan.start = arrived
        return events
