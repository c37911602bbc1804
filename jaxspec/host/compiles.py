"""What this process has compiled, and compiles that run beside decoding instead of inside it.

A step program (a width K at a rows bucket) not yet compiled costs a compilation first: 5-12 s
for SmolLM2 on a CPU, 20-150 steps. Inside a request that is a stall no user should wait
through, so the control plane never waits for a program it merely prefers: it asks for it
(`request`), a background thread compiles it ahead of time (`lower(...).compile()`), and the
iteration runs with a program that is ready; a later iteration finds the new one ready and
switches. Only a batch with no program ready at all compiles in the iteration (`get`): the first
step of a new process, unless `Engine(warmup=...)` compiled it first.

Under `eager()` every program asked for compiles at once, in the iteration: the old warm-up
protocol of the benchmarks (an untimed pass that compiles whatever it prefers), kept as an option
and reported as such. `wait()` blocks until the background compiles are done.

One ledger serves the whole process (`LEDGER`), as jit's caches do: an executor built after
another finds the programs its predecessor compiled. A key names the program and the shapes it
was compiled for (`programs.StepPrograms.program`). Call `forget_programs()` with
`jax.clear_caches()`.

On a CPU, XLA finishes a program's machine code on its first call (0.33 s for a SmolLM2 step
of 0.08 s, after 5.3 s of compiling), and a loop's body when the loop first runs: the executor
makes that first call in the background too, on a scratch state and rows that run every loop
(`programs.py`), where the state is small enough to copy.

A compile leaves its traced program in JAX's caches: ~300k Python objects (jaxpr equations,
variables, source info) that live as long as the process. Every full garbage collection walks
them all: 0.8 s with SmolLM2's widths compiled, a pause inside whichever step it falls in (a
gap of 23-40x the median step, measured as users run AUTO). `settle_heap()` after each compile
moves what exists into the collector's permanent generation (`gc.freeze`), which no collection
walks; a full collection then pauses at most 0.1 s. What it keeps from the collector is
cyclic garbage already made at that moment: 10 objects over eight requests, measured.

A background compile spends seconds in Python (tracing, lowering), holding the GIL the request's
thread needs at every dispatch and read: with the interpreter's default switch interval (5 ms)
a SmolLM2 plain step that takes 25 ms took 60-200 ms while a compile ran. The compile runs with
the interval at `SWITCH_INTERVAL_S`, so the request's thread gets the GIL back within 0.2 ms.

The worker compiles one program at a time, so a program the iteration must have is never left
queued behind the ones it merely prefers: `get` takes a compile that has not started into the
calling thread, and waits only for one under way.

The compile thread keeps the default scheduling policy. At the lowest one (`SCHED_IDLE`) a plain
SmolLM2 request decoding beside compiles of four SA widths on two cores kept 98% of its speed
alone (73-80% at the default policy), but the compiles took 545 s instead of 58-84: a busy
process would never get the widths it asked for. At nice 5 or 10 it kept 82-83%, and the
compiles took 111-114 s. Most of a compile's work runs on XLA's own threads anyway, which no
setting of this one reaches.
"""

import collections
from collections.abc import Callable
from collections.abc import Hashable
import concurrent.futures
import contextlib
import gc
import os
import pathlib
import statistics
import sys
import threading
import time
import weakref

WINDOW = 16          # compile times kept; their median is reported as the price of one

Program = Callable   # a compiled program: called with the jitted function's dynamic arguments


SWITCH_INTERVAL_S = 2e-4     # while a compile traces in the background (module docstring)


@contextlib.contextmanager
def _switching_often():
    """The interpreter's thread switch interval at `SWITCH_INTERVAL_S`, then as it was."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(min(before, SWITCH_INTERVAL_S))
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def settle_heap() -> None:
    """Out of the garbage collector's walks: every object that exists now (module docstring)."""
    gc.freeze()


class CompileLedger:
    """Compiled programs by key, compiled in the background or at once.

    Args:
      delay: seconds every compile is made to take at least (tests: a slow compile).
    """

    def __init__(self, *, delay: float = 0.0):
        self.delay = delay
        self._programs: dict[Hashable, Program] = {}
        self._pending: dict[Hashable, concurrent.futures.Future] = {}
        self._seconds: collections.deque = collections.deque(maxlen=WINDOW)
        self._lock = threading.Lock()
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="jaxspec-compile")
        # At exit, compiles nobody waits for are dropped (the one under way finishes): the
        # hooks run in reverse order, before the pool's own joins its thread.
        method = weakref.WeakMethod(self._drop_queued)
        threading._register_atexit(lambda: method() and method()())
        self._called: set[Hashable] = set()
        self._eager = False
        self.compiled_in_background = 0

    def _compile(self, build: Callable[[], Program]) -> Program:
        start = time.perf_counter()
        background = threading.current_thread() is not threading.main_thread()
        with _switching_often() if background else contextlib.nullcontext():
            program = build()
        seconds = time.perf_counter() - start
        settle_heap()
        if seconds < self.delay:
            time.sleep(self.delay - seconds)
        with self._lock:
            self._seconds.append(max(seconds, self.delay))
        return program

    def _collect(self, key: Hashable) -> Program | None:
        """The program of `key` if it is ready, moving a finished background compile in."""
        with self._lock:
            program = self._programs.get(key)
            future = self._pending.get(key)
            if program is not None or future is None or not future.done():
                return program
            del self._pending[key]
        program = future.result()        # a failed compile raises here, in the iteration
        with self._lock:
            self._programs[key] = program
            self.compiled_in_background += 1
        return program

    def ready(self, key: Hashable) -> bool:
        return self._collect(key) is not None

    def pending(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._pending and key not in self._programs

    def request(self, key: Hashable, build: Callable[[], Program]) -> None:
        """Asks for `key`'s program: compiled in the background unless ready or under way (at
        once under `eager()`)."""
        if self._eager:
            self.get(key, build)
            return
        if self.ready(key):
            return
        with self._lock:
            if key not in self._pending:
                self._pending[key] = self._pool.submit(self._compile, build)

    def get(self, key: Hashable, build: Callable[[], Program]) -> Program:
        """`key`'s program, compiled now if it is not ready or only queued (waited for if under
        way)."""
        program = self._collect(key)
        if program is not None:
            return program
        with self._lock:
            future = self._pending.pop(key, None)
        if future is not None and not future.cancel():
            program = future.result()
        else:
            program = self._compile(build)
        with self._lock:
            self._programs[key] = program
        return program

    def first_call(self, key: Hashable) -> bool:
        """Whether this is the first call of `key`'s program (it finishes its code on a CPU)."""
        if key in self._called:
            return False
        self._called.add(key)
        return True

    def wait(self) -> None:
        """Blocks until every background compile asked for so far has finished."""
        with self._lock:
            futures = list(self._pending.values())
        concurrent.futures.wait(futures)

    def _drop_queued(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def forget_programs(self) -> None:
        """Nothing is compiled any more (after `jax.clear_caches()`); the price stays. Queued
        background compiles are dropped, not run: their programs would be forgotten too."""
        with self._lock:
            running = [f for f in self._pending.values() if not f.cancel()]
        concurrent.futures.wait(running)
        with self._lock:
            self._programs.clear()
            self._pending.clear()
            self._called.clear()

    @property
    def is_eager(self) -> bool:
        return self._eager

    def compile_seconds(self) -> float:
        """The median measured compile (0 before any was measured)."""
        with self._lock:
            return statistics.median(self._seconds) if self._seconds else 0.0

    @contextlib.contextmanager
    def eager(self):
        """Within it, every program asked for compiles at once, in the iteration."""
        self._eager, before = True, self._eager
        try:
            yield self
        finally:
            self._eager = before


LEDGER = CompileLedger()

MIN_CACHED_COMPILE_SECONDS = 0.5     # quicker compiles are not worth a file


def default_cache_dir() -> pathlib.Path:
    """Where compiled programs persist between processes: `$JAXSPEC_CACHE/xla`, else
    ~/.cache/jaxspec/xla."""
    root = os.environ.get("JAXSPEC_CACHE") or pathlib.Path.home() / ".cache" / "jaxspec"
    return pathlib.Path(root) / "xla"


def enable_persistent_cache(path) -> str | None:
    """Turns on JAX's persistent compilation cache at `path` (a second process loads what the
    first compiled: SmolLM2's prefill and steps, ~11 s of compiles on a CPU), unless `path` is
    empty or None, or this process already set a cache directory (the user's own wins).
    Returns the directory in use, or None."""
    import jax

    current = jax.config.jax_compilation_cache_dir
    if current or not path:
        return current or None
    os.makedirs(path, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_CACHED_COMPILE_SECONDS)
    return str(path)
