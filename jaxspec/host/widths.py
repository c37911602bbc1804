"""Adaptive K's decisions over compiled programs: which width and rows bucket an iteration runs.

`adaptive.choose` ranks widths by expected tokens per second; this module turns the ranking into
a program that is ready, and decides what to compile next (compiles.py: in the background). The
rules, each for a failure seen when AUTO ran as users run it (a fresh engine per request):

- Start: a request's first `START_STEPS` verify steps run the policy's start width (AUTO: the K
  `suggest_spec_config` gives, 5 at small batches), not whatever the priors favour, unless growth
  asks for more. With priors alone the first widths were the shortest, and a width never
  verified is never learned.
- Grow: when the drafts of the last width were (nearly) all accepted, the next step runs at least
  twice that width (geometric growth while acceptance holds, as a TensorRT-LLM user would raise a
  fixed K), from the first step on; while no width at the floor is compiled, the widest ready
  one. The floor drops as soon as a full-width draft is cut short. Without it, AUTO verified 1-2
  tokens a step where 98% of them were accepted; without it in the start steps, a reply copied
  12 tokens a step at 5 for its first two; without the widest ready width, a process's first
  request verified fewer drafts than SA at K=5 while its wider widths compiled.
- Ready: a width (or rows bucket) that is not compiled is asked for and compiled in the
  background; until then the best ready one runs. Only an iteration with nothing ready at all
  compiles in place. A width is asked for only when it is expected to beat the best ready one
  by `COMPILE_GAIN`: on a CPU a compile shares the cores with the steps, and one behind a gain
  of a few percent (K=1 over plain where drafts are rarely right) cost AUTO more than it won,
  2.5-5 s of steps at half speed.
- Plain: the plain step is timed (`MIN_SAMPLES` steps) where its estimate could change the
  decision: the chosen width's expected advantage over it is under `PLAIN_MARGIN`. Timing it
  first, always, ran 60 plain steps of a request whose drafts were accepted 8 at a time (the
  plain step is timed again at every new context bucket).
"""

from collections.abc import Callable
from collections.abc import Hashable

import numpy as np

from jaxspec.host import acceptance
from jaxspec.host import adaptive
from jaxspec.host import compiles as compiles_lib
from jaxspec.host import cost_model as cost_model_lib

START_STEPS = 2           # a request's verify steps at the start width
GROWTH = 2                # the floor after a step whose full-width drafts were accepted
NEARLY_ALL = 0.9          # accepted / drafted, over full-width rows, that counts as accepted
COMPILE_GAIN = 0.1        # a width is compiled when it beats the best ready one by this
                          # much, expected tokens per second: a compile takes seconds of the
                          # cores the steps run on
PLAIN_MARGIN = 2.0        # a width's expected advantage over the plain step's estimate that
                          # makes timing the plain step pointless


class WidthPlanner:
    """The width decisions of one executor.

    Args:
      max_draft_len: the largest width.
      start_draft_len: the width of a request's first steps.
      costs: the step-cost model.
      compiles: the process's compiled programs.
      predictor: the acceptance predictor (default: a new one, priors only).

    Each decision takes `program`, `(k, rows) -> (key, build)`: the ledger's key of the step at
    width `k` on `rows` rows for the batch being planned, and a function compiling it.
    """

    def __init__(self, *, max_draft_len: int, start_draft_len: int,
                 costs: cost_model_lib.StepCostModel, compiles: compiles_lib.CompileLedger,
                 predictor: acceptance.AcceptancePredictor | None = None):
        self.start = min(start_draft_len, max_draft_len)
        self.widths = tuple(sorted(set(adaptive.widths_up_to(max_draft_len)) | {self.start}))
        self.predictor = predictor or acceptance.AcceptancePredictor(max_positions=max_draft_len)
        self.costs = costs
        self.compiles = compiles
        self.floor = 0

    def _ready(self, program, k: int, rows: int) -> bool:
        return self.compiles.ready(program(k, rows)[0])

    def _ask(self, program, k: int, rows: int) -> None:
        self.compiles.request(*program(k, rows))

    def rows(self, program: Callable[[int, int], tuple[Hashable, Callable]], rows: int,
             buckets) -> int:
        """The rows bucket to run in: `rows`, or while nothing is compiled there, the smallest
        larger bucket with a program (padding rows) while `rows`' start width compiles."""
        if self.compiles.is_eager or any(self._ready(program, w, rows) for w in self.widths):
            return rows
        larger = next((b for b in buckets if b > rows
                       and any(self._ready(program, w, b) for w in self.widths)), None)
        if larger is None:
            return rows
        self._ask(program, self.start, rows)
        return larger

    def plain_width(self, program, rows: int) -> int:
        """The width of an iteration with nothing to verify: 0, or while the plain step is not
        compiled, the narrowest compiled width (no drafts: it commits what the plain step does)
        while the plain step compiles."""
        if self._ready(program, 0, rows):
            return 0
        self._ask(program, 0, rows)
        return next((w for w in self.widths if w and self._ready(program, w, rows)), 0)

    def choose(self, program, rows: int, k: int, lens, matches, *, context: int,
               starting: bool, left: int):
        """(width, i32[rows] draft lengths) for a batch with drafts waiting, up to `k`.

        Args:
          program: as in the class.
          rows: the rows bucket.
          k: the largest width allowed (schedule, budget and gates).
          lens: i32[rows] real draft lengths; matches: i32[rows] their match lengths.
          context: the batch's longest live context.
          starting: a request of the batch is within its start steps.
          left: the most tokens a request of the batch has left.
        """
        widths = [w for w in self.widths if w <= k]
        ready = [w for w in widths if self._ready(program, w, rows)]
        drafted = list(zip(matches, lens, strict=True))
        # Growth: every row verified at the best width at the floor or above, whatever the
        # estimates say (the last step said more than they do), the start steps included.
        floor = min(self.floor, max(w for w in widths if w <= max(int(lens.max()), 1)))
        if floor and left > 1 + floor and not (starting and floor <= self.start):
            grown = self._grown(program, rows, widths, ready, floor, context, drafted, lens)
            if grown > (self.start if starting else 0):
                return grown, np.minimum(lens, grown).astype(np.int32)
        if starting:
            return self._run(program, rows, max(w for w in widths if w <= self.start), ready,
                             lens)
        seconds = self.costs.costs(rows, context, widths)
        curves = [self.predictor.expected_accepted(int(m), int(d)) for m, d in drafted]
        choice = adaptive.choose(widths, seconds, curves, lens)
        runnable = [i for i, w in enumerate(widths) if w == 0 or w in ready]
        if choice.k and choice.k not in ready:
            if not ready:
                self._ask(program, 0, rows)       # the choice compiles now, the plain step beside
                return choice.k, choice.lens
            best = adaptive.choose([widths[i] for i in runnable], seconds[runnable], curves, lens)
            if (choice.expected_tokens / choice.seconds
                    >= (1 + COMPILE_GAIN) * best.expected_tokens / best.seconds):
                self._ask(program, choice.k, rows)
        # The step runs the best ready width (plain decoding, 0, is always one: `plain_width`
        # runs it) on an optimistic acceptance estimate: a width that is never verified is
        # never learned.
        curves = [self.predictor.expected_accepted(int(m), int(d), explore=True)
                  for m, d in drafted]
        held = adaptive.choose([widths[i] for i in runnable], seconds[runnable], curves, lens)
        if held.k and self.costs.plain_unsettled(rows, context):
            # Every width is weighed against the plain step, which is estimated until timed
            # (at batch 32 the prior put it at 1.6x its cost, so AUTO never ran it): it is timed
            # where its estimate could change the decision, i.e. where the width's expected
            # advantage is under `PLAIN_MARGIN`.
            advantage = held.expected_tokens / held.seconds * seconds[0] / len(lens)
            if advantage < PLAIN_MARGIN:
                if self._ready(program, 0, rows):
                    return 0, np.zeros_like(lens)
                self._ask(program, 0, rows)
        return held.k, held.lens

    def _grown(self, program, rows: int, widths, ready, floor: int, context: int, drafted,
               lens) -> int:
        """The best width at `floor` or above by the estimates; while it is not compiled, it is
        asked for and the widest ready width runs (the estimates would verify less)."""
        up = [w for w in widths if w >= floor]
        seconds = self.costs.costs(rows, context, up)
        curves = [self.predictor.expected_accepted(int(m), int(d)) for m, d in drafted]
        grown = adaptive.choose(up, seconds, curves, lens).k
        if grown not in ready and ready:
            self._ask(program, grown, rows)
            grown = max(ready)
        return grown

    def _run(self, program, rows: int, want: int, ready, lens):
        """`want` if it is ready (or nothing is); else it is asked for and the widest ready width
        below it runs (the narrowest above if none is below)."""
        if not ready:
            self._ask(program, 0, rows)           # `want` compiles now, the plain step beside
        elif want not in ready:
            self._ask(program, want, rows)
            below = [w for w in ready if w <= want]
            want = max(below) if below else min(ready)
        return want, np.minimum(lens, want).astype(np.int32)

    def learned(self, k: int, rows: list[tuple[int, int, int]]) -> None:
        """One verify step at width `k`: per row (match length, drafted, accepted) teaches the
        predictor; rows drafted to the full width set the growth floor."""
        for match, drafted, accepted in rows:
            if drafted:
                self.predictor.observe(match, drafted, accepted)
        full = [(d, a) for _, d, a in rows if d and d == k]
        if not full:
            return
        drafted = sum(d for d, _ in full)
        accepted = sum(min(a, d) for d, a in full)
        self.floor = GROWTH * k if accepted >= NEARLY_ALL * drafted else 0
