"""Greedy decoding at batch 1: jaxspec without speculation vs HF transformers (issue 2's goal).

    python -m benchmarks.plain_vs_hf --max-new-tokens 128 --repeats 3 --write

One real code-editing prompt (the workload's first), the same token ids and the same GGUF model on
both sides, in one process: jaxspec plain greedy and HF transformers greedy on torch CPU, one
untimed pass each, then `--repeats` rounds alternating the two. Reported:

* tokens/s (median over rounds, prefill included) and the median per-round ratio jaxspec / HF;
* jaxspec's model load, cold and warm: a child process loads it with `JAXSPEC_CACHE` pointing at a
  new empty folder (the GGUF is converted and cached there), then a second child loads it again
  from that cache; HF's load, in this process;
* the first call: its wall time (jaxspec's includes the XLA compilations, counted and timed);
* memory each side adds: the peak RSS while it loads its model and makes its first call, minus
  the RSS just before it started loading (jaxspec goes first, then HF).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks import chat_prompts
from benchmarks import hf_baseline
from benchmarks import report
from benchmarks import rss as rss_lib
from benchmarks import runs
from benchmarks import workloads

SECTION = "plain_vs_hf"
_CHILD_LOAD = ("import json, time\nfrom jaxspec import models\nstart = time.perf_counter()\n"
               "models.load(None)\nprint(json.dumps(time.perf_counter() - start))\n")


def child_load_seconds(cache_dir: str) -> float:
    """Seconds `jaxspec.models.load(None)` takes in a new process caching into `cache_dir`."""
    env = dict(os.environ, JAXSPEC_CACHE=cache_dir)
    done = subprocess.run([sys.executable, "-c", _CHILD_LOAD], env=env, check=True,
                          capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(*, max_new_tokens: int = 128, repeats: int = 3, use_hf: bool = True,
            log=print) -> dict:
    """Everything the module doc lists, as a JSON-ready dict."""
    from jaxspec import models

    load_start = runs.load_average()
    with tempfile.TemporaryDirectory(prefix="jaxspec-cold-cache-") as cache:
        load_cold_s = child_load_seconds(cache)
        load_warm_s = child_load_seconds(cache)
    before = rss_lib.current_mib()
    with rss_lib.PeakRSS() as load_peak:
        start = time.perf_counter()
        model, tokenizer = models.load(None)
        load_here_s = time.perf_counter() - start
    (prompt,) = chat_prompts.prompt_ids(model, tokenizer, workloads.code_editing(1),
                                        max_new_tokens=max_new_tokens)
    scheduler = runs.scheduler_for([prompt], max_new_tokens, 1)
    stops = runs.stop_ids(tokenizer)

    def jaxspec_pass() -> runs.Run:
        return runs.run_jaxspec(model, tokenizer, [prompt], spec=None,
                                max_new_tokens=max_new_tokens, scheduler=scheduler)

    first = jaxspec_pass()
    jax_side = dict(load_cold_s=load_cold_s, load_warm_s=load_warm_s, load_in_process_s=load_here_s,
                    first_call_s=first.wall_s, compiles=first.compiles, compile_s=first.compile_s,
                    memory_mib=_added(before, load_peak.mib, first.peak_mib))
    hf, hf_side = None, None
    reason = hf_baseline.unavailable_reason() if use_hf else "HF baseline skipped: --no-hf"
    if reason:
        log(reason)
    else:
        before = rss_lib.current_mib()
        with rss_lib.PeakRSS() as hf_load_peak:
            start = time.perf_counter()
            hf = hf_baseline.HFModel.load()
            hf_load_s = time.perf_counter() - start

        def hf_pass(prefill_s=None) -> runs.Run:
            return runs.run_hf(hf, [prompt], max_new_tokens=max_new_tokens, stops=stops,
                               prefill_s=prefill_s)

        hf_first = hf_pass()
        hf_side = dict(load_s=hf_load_s, first_call_s=hf_first.wall_s, threads=hf.threads_note,
                       memory_mib=_added(before, hf_load_peak.mib, hf_first.peak_mib),
                       prefill_s=runs.hf_prefill_seconds(hf, [prompt], stops))
    rounds = []
    for _ in range(repeats):
        j = jaxspec_pass()
        h = hf_pass(hf_side["prefill_s"]) if hf is not None else None
        rounds.append((j, h))
    jax_side.update(_throughput([j for j, _ in rounds]))
    results = dict(prompt_tokens=len(prompt), max_new_tokens=max_new_tokens, repeats=repeats,
                   jaxspec=jax_side, hf=hf_side, skipped=reason,
                   load_average=[load_start, runs.load_average()],
                   same_tokens_as_warmup=all(j.outputs == first.outputs for j, _ in rounds))
    if hf is not None:
        hf_side.update(_throughput([h for _, h in rounds]))
        results["ratio"] = statistics.median(j.tokens_per_s / h.tokens_per_s for j, h in rounds)
        results["first_mismatch_vs_hf"] = runs.first_mismatch(first.outputs[0],
                                                              rounds[0][1].outputs[0])
    return results


def _added(before: float | None, *peaks: float | None) -> float | None:
    if before is None or None in peaks:
        return None
    return max(peaks) - before


def _throughput(passes: list[runs.Run]) -> dict:
    decode = [r.decode_tokens_per_s for r in passes if r.decode_tokens_per_s is not None]
    return dict(tokens_per_s=statistics.median(r.tokens_per_s for r in passes),
                tokens_per_s_runs=[round(r.tokens_per_s, 3) for r in passes],
                decode_tokens_per_s=statistics.median(decode) if decode else None,
                generated_tokens=passes[-1].generated)


def markdown(results: dict) -> str:
    j, h = results["jaxspec"], results["hf"]
    fmt = lambda x, spec=".2f": "–" if x is None else f"{x:{spec}}"  # noqa: E731
    lines = [
        "## Greedy decoding at batch 1: jaxspec vs HF transformers",
        "",
        f"One code-editing prompt ({results['prompt_tokens']} tokens), up to "
        f"{results['max_new_tokens']} new tokens, the same token ids and GGUF model on both "
        f"sides; medians of {results['repeats']} alternating rounds after one untimed pass each. "
        "Memory: peak RSS while loading and making the first call, minus RSS before loading. "
        + runs.load_note(*results.get("load_average", (None, None))),
        "",
        "| | jaxspec (XLA CPU) | HF transformers (torch CPU"
        + (f", {h['threads']})" if h else ")") + " |",
        "| --- | ---: | ---: |",
        f"| tokens/s (prefill included) | {fmt(j['tokens_per_s'])} "
        f"| {fmt(h and h['tokens_per_s'])} |",
        f"| decode tokens/s | {fmt(j['decode_tokens_per_s'])} "
        f"| {fmt(h and h['decode_tokens_per_s'])} |",
        f"| generated tokens | {j['generated_tokens']} | {h['generated_tokens'] if h else '–'} |",
        f"| model load | cold {j['load_cold_s']:.1f} s, warm {j['load_warm_s']:.1f} s "
        f"| {fmt(h and h['load_s'], '.1f')} s |",
        f"| first call | {j['first_call_s']:.1f} s ({j['compiles']} XLA compilations, "
        f"{j['compile_s']:.1f} s) | {fmt(h and h['first_call_s'], '.1f')} s |",
        f"| memory added | {fmt(j['memory_mib'], '.0f')} MiB "
        f"| {fmt(h and h['memory_mib'], '.0f')} MiB |",
        "",
    ]
    if h:
        verdict = "met" if results["ratio"] >= 1.0 else "not met"
        mismatch = results["first_mismatch_vs_hf"]
        lines += [f"jaxspec / HF tokens/s: **{results['ratio']:.3f}x** (goal >= 1.0: {verdict}). "
                  + ("Both generate the same tokens." if mismatch is None else
                     f"**MISMATCH**: the outputs differ from generated token {mismatch}.")]
    else:
        lines.append(f"{results['skipped']}.")
    if not results["same_tokens_as_warmup"]:
        lines.append("**MISMATCH**: jaxspec's output changed from one pass to the next.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m benchmarks.plain_vs_hf",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-hf", action="store_true")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--write", action="store_true", help="update BENCHMARKS.md")
    args = parser.parse_args(argv)
    if args.repeats < 3:
        parser.error(f"--repeats must be >= 3 for a median, got {args.repeats}")
    results = measure(max_new_tokens=args.max_new_tokens, repeats=args.repeats,
                      use_hf=not args.no_hf, log=lambda line: print(line, file=sys.stderr))
    text = markdown(results)
    print(text, file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(results))
    if args.write:
        report.write_section(SECTION, text,
                             command="python -m benchmarks.plain_vs_hf " + " ".join(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
