"""Host drafting overhead: what `NGramPool.get_draft_tokens` costs per decoding step.

This is the baseline the device suffix automaton must beat: the n-gram pool runs in Python on the
host every iteration, between two device steps.

Text: the bytes of the running interpreter's stdlib ``*.py`` files (top level, sorted by name,
concatenated), one token per byte (a 256-symbol vocabulary). Request i of a batch owns the slice
starting at ``i * history`` of that stream, so requests hold different real code.

For each history length and batch size, on a fresh pool (AUTO's small-batch numbers: K=5, N=3,
public pool, default bound):

* first scan: each request's first call scans its whole history (the lazy first scan);
* steady state: then every step appends the next real token to each request and calls the pool
  once per request, as the executor does; a step's time is the whole batch's.

Reported numbers are medians: of the first scans over requests and repeats, of the step times over
steps and repeats.
"""

import argparse
import pathlib
import statistics
import sys
import sysconfig
import time

from benchmarks import report
from jaxspec.host.ngram import DEFAULT_MAX_POOL_ENTRIES
from jaxspec.host.ngram import NGramPool

SECTION = "host_overhead"
HISTORIES = (1024, 8192, 32768)
BATCH_SIZES = (1, 8, 32)
MAX_DRAFT_LEN = 5  # AUTO at max_batch_size <= 4
MAX_MATCHING_NGRAM_SIZE = 3  # AUTO at max_batch_size <= 4


def stdlib_byte_tokens(count: int, *, recursive: bool = False) -> list[int]:
    """The first `count` bytes of the concatenated stdlib sources, as ints in [0, 256).

    Top-level modules only (about 4.6 MB), or with `recursive` every package's too (12 MB or
    more; installed packages left out).

    Raises:
      ValueError: the stdlib sources are shorter than `count` bytes.
    """
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    paths = (sorted(p for p in stdlib.rglob("*.py")
                    if not {"site-packages", "dist-packages"} & set(p.relative_to(stdlib).parts))
             if recursive else sorted(stdlib.glob("*.py")))
    tokens = bytearray()
    for path in paths:
        tokens += path.read_bytes()
        if len(tokens) >= count:
            return list(tokens[:count])
    raise ValueError(f"the stdlib at {stdlib} holds {len(tokens)} bytes of *.py, need {count}")


def measure_one(stream: list[int], history: int, batch_size: int, steps: int) -> dict:
    """One run on a fresh pool: first-scan seconds per request, step seconds, mean draft length."""
    pool = NGramPool(MAX_DRAFT_LEN, MAX_MATCHING_NGRAM_SIZE)
    texts = [stream[i * history:(i + 1) * history] for i in range(batch_size)]
    upcoming = [stream[(i + 1) * history:(i + 1) * history + steps] for i in range(batch_size)]
    max_len = history + steps + MAX_DRAFT_LEN + 1  # room never caps a draft here
    first_scans = []
    for request, text in enumerate(texts):
        start = time.perf_counter()
        pool.get_draft_tokens(text, request, max_len)
        first_scans.append(time.perf_counter() - start)
    step_times, drafted = [], 0
    for step in range(steps):
        for text, tokens in zip(texts, upcoming, strict=True):
            text.append(tokens[step])
        start = time.perf_counter()
        drafts = [pool.get_draft_tokens(text, request, max_len)
                  for request, text in enumerate(texts)]
        step_times.append(time.perf_counter() - start)
        drafted += sum(map(len, drafts))
    return dict(first_scans=first_scans, step_times=step_times,
                mean_draft_len=drafted / (steps * batch_size), pool_entries=pool.num_entries)


def measure(
    histories: tuple[int, ...] = HISTORIES,
    batch_sizes: tuple[int, ...] = BATCH_SIZES,
    *,
    steps: int = 64,
    repeats: int = 3,
) -> list[dict]:
    """Host overhead of the n-gram pool per history length and batch size.

    Returns:
      One dict per (history, batch_size) with: `first_scan_ms` (median per request), `step_us`
      (median per step, whole batch), `step_us_per_request`, `mean_draft_len` (tokens drafted per
      request and step) and `pool_entries` (continuations held at the end).
    """
    stream = stdlib_byte_tokens(max(batch_sizes) * max(histories) + steps)
    measure_one(stream, min(histories), 1, steps)  # warm-up: the first run pays allocator growth
    rows = []
    for history in histories:
        for batch_size in batch_sizes:
            runs = [measure_one(stream, history, batch_size, steps) for _ in range(repeats)]
            step_s = statistics.median(t for run in runs for t in run["step_times"])
            rows.append(dict(
                history=history,
                batch_size=batch_size,
                first_scan_ms=1e3 * statistics.median(t for run in runs
                                                      for t in run["first_scans"]),
                step_us=1e6 * step_s,
                step_us_per_request=1e6 * step_s / batch_size,
                mean_draft_len=runs[-1]["mean_draft_len"],
                pool_entries=runs[-1]["pool_entries"],
            ))
    return rows


def markdown(rows: list[dict], steps: int, repeats: int) -> str:
    lines = [
        "## Host overhead: `NGramPool.get_draft_tokens`",
        "",
        f"n-gram pool with K={MAX_DRAFT_LEN}, N={MAX_MATCHING_NGRAM_SIZE}, public, bounded at "
        f"{DEFAULT_MAX_POOL_ENTRIES:,} continuations (LRU). Tokens are the bytes of this "
        "Python's stdlib `*.py` sources (one token per byte, 256 symbols); each request holds "
        "different code. *First scan*: the request's first call, scanning its whole history "
        "(median per request). *Step*: one token appended to every request, then one call per "
        f"request (median over {steps} steps x {repeats} runs). This is the per-iteration host "
        "cost the device suffix automaton replaces.",
        "",
        "| history (tokens) | batch | first scan (ms / request) | step (us, whole batch) "
        "| step (us / request) | mean draft len | pool entries |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        lines.append(
            f"| {row['history']:,} | {row['batch_size']} | {row['first_scan_ms']:.2f} "
            f"| {row['step_us']:.1f} | {row['step_us_per_request']:.1f} "
            f"| {row['mean_draft_len']:.2f} | {row['pool_entries']:,} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-write", action="store_true", help="print only, leave BENCHMARKS.md")
    args = parser.parse_args(argv)
    rows = measure(steps=args.steps, repeats=args.repeats)
    text = markdown(rows, args.steps, args.repeats)
    report.publish(SECTION, text, module="benchmarks.host_overhead",
                   argv=sys.argv[1:] if argv is None else argv, write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
