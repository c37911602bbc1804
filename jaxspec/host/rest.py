"""Resting automata: adaptive K stops a request's device automaton while its drafts do not pay.

Every step extends each row's automaton with the committed tokens and searches it for the next
draft (with the global pool, every active slot): 0.5-0.7 ms of a 33 ms SmolLM2 step at batch 1 on
2 CPU cores, plus the K decision on the host. Where little repeats (sampled raw text) adaptive K
decides K = 0 step after step, and that work buys nothing: AUTO ran at 0.97x plain there.

So a request whose drafts went `REST_AFTER` planned steps without paying rests: its row points
at the dummy slot (no extension, no search, no draft) for `wait` steps. Then its automaton is
rebuilt on the host from all of its tokens (`sa_build`, 8 M tokens/s, and the same automaton as
one extended token by token) and primed, and the request is judged again, sooner: `RECHECK_AFTER`
planned steps. A rest that follows a rest doubles `wait` (up to `MAX_WAIT`); a draft that paid
resets it. Only steps that allowed drafting count: a batch held at K = 0 by the schedule, a gate
or the capacity check says nothing about a request's drafts.

A draft pays when the target accepts as many of its tokens as its verify step costs beyond a
plain step, in plain steps (`Executor._judge_drafts`, from the cost model: on 2 CPU cores 1.9 at
K = 5, 2.5 at K = 12; on a GPU, where a verify step costs about a plain one, a token). Counting
every verified draft instead kept an MT-bench reply (as_user, prompt 3) awake for its first 85
steps, a draft verified every 13-15 of them, most at K = 12 with 0-2 tokens accepted: AUTO ran
at 0.70x plain there. Judged by what they paid, it rests after 18 steps: 0.88x plain in
as_user's medians, 0.97-1.05x in another run of 3 requests (plain's speed varies as much).

While every request of a batch rests, and will beyond the next step, its steps are plain ones
and chain as plain decoding does (`Executor._rests_hold`): the host dispatches the next step
before it reads the last, on the plain program while the one without the automata compiles.
"""

REST_AFTER = 16          # planned steps without a draft that paid before the first rest
RECHECK_AFTER = 4        # after a rest: the steps to show a draft that pays
FIRST_WAIT = 16          # steps of the first rest
MAX_WAIT = 256


class Rest:
    """One request's rests, counted in its planned steps.

    Example::

        rest = Rest()
        for _ in range(REST_AFTER - 1):
            rest.planned(drafted=False)     # False: still working
        rest.planned(drafted=False)         # True: rest now, for FIRST_WAIT steps
        rest.resting                        # True
        for _ in range(FIRST_WAIT - 1):
            rest.tick()                     # False
        rest.tick()                         # True: rebuild the automaton, then plan again
    """

    def __init__(self):
        self._idle = 0
        self._limit = REST_AFTER
        self._wait = FIRST_WAIT
        self._left = 0

    @property
    def resting(self) -> bool:
        return self._left > 0

    @property
    def due(self) -> bool:
        """Whether one more planned step without a draft starts a rest."""
        return not self.resting and self._idle + 1 >= self._limit

    @property
    def left(self) -> int:
        """Steps of the rest still to come (0: awake)."""
        return self._left

    def planned(self, *, drafted: bool) -> bool:
        """One step planned while the request was awake and drafting was allowed, with a draft
        that paid (`drafted`) or without one. True when it rests from now on."""
        if drafted:
            self._idle, self._limit, self._wait = 0, REST_AFTER, FIRST_WAIT
            return False
        self._idle += 1
        if self._idle < self._limit:
            return False
        self._idle, self._limit, self._left = 0, RECHECK_AFTER, self._wait
        self._wait = min(2 * self._wait, MAX_WAIT)
        return True

    def tick(self) -> bool:
        """One step of the request's rest. True when the rest ends: its automaton must be
        rebuilt before the next draft."""
        self._left -= 1
        return self._left == 0
