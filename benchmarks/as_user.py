"""Methods timed the way users run them: a fresh engine per request in one warm process.

    python -m benchmarks.as_user --workloads code_editing,translation --n 4
    python -m benchmarks.as_user --workloads code_editing --n 2 --repeats 1 --json
    python -m benchmarks.as_user --eager        # the old protocol: every width compiled first

Procedure: the step-cost cache and the persistent compilation cache start empty (new folders
unless `--cost-cache` and `--compile-cache` name others), as in the first process after an
install: every program the control plane asks for is compiled, none loaded. Each method serves
one request untimed (the first prompt of the first workload: a process's first request, which
compiles its programs); then, per prompt and round, every method in turn serves the prompt
through a new `Engine` with its defaults (scheduler, persistent compile cache) at batch 1, as a
script calling `Engine(...).generate` would.
Nothing is compiled ahead: what the control plane asks for compiles in the background while
requests run (`jaxspec.host.compiles`); `--eager` compiles every program asked for at once inside
the untimed request instead (the harness's old warm-up), and is reported as such.

Per prompt, medians over rounds of tokens/s (generated tokens / wall seconds of `generate`,
prefill included) and AUTO's ratio to the best of the other methods and to plain; per request the
stall ratio, the longest gap between two decode steps over the median one of the same width
(`RunStats.stall_ratio`: a step that waited for a compile shows there; widths are compared with
themselves because a CPU's 16-draft verify step costs 4x a plain one). Every output is compared
with plain's token by token.
"""

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time

from benchmarks import chat_prompts
from benchmarks import report
from benchmarks import workloads
from jaxspec import config as config_lib
from jaxspec import engine as engine_lib
from jaxspec.host import compiles

METHODS = {"plain": lambda: None, "sa5": lambda: config_lib.SAConfig(max_draft_len=5),
           "sa16": lambda: config_lib.SAConfig(max_draft_len=16),
           "auto": config_lib.AutoConfig}
GOAL_BEST, GOAL_PLAIN, GOAL_GAP = 0.95, 0.98, 3.0


def serve(model, tokenizer, method: str, prompt: list[int], max_new_tokens: int) -> dict:
    """One request through a new engine: its output, tokens/s and step gaps."""
    engine = engine_lib.Engine(model, tokenizer, spec=METHODS[method]())
    start = time.perf_counter()
    out = engine.generate(prompt, max_new_tokens=max_new_tokens)
    wall = time.perf_counter() - start
    s = out.stats
    return dict(tokens=out.token_ids, tokens_per_s=len(out.token_ids) / wall,
                acceptance_length=s["mean_acceptance_length"], k_mean=s["k_mean"],
                gap_ratio=s["stall_ratio"], max_gap_ms=s["max_step_gap_ms"],
                first_call_s=s["first_call_time_s"])


def measure(model, tokenizer, prompts: dict[str, list[list[int]]], *, methods, repeats: int,
            max_new_tokens: int, eager: bool = False, log=print) -> dict:
    """Runs the procedure (module docstring) over `prompts` (workload -> prompt ids)."""
    import tqdm

    first = next(iter(prompts.values()))[0]
    for method in methods:
        with compiles.LEDGER.eager() if eager else contextlib.nullcontext():
            serve(model, tokenizer, method, first, max_new_tokens)
    total = sum(map(len, prompts.values())) * repeats * len(methods)
    bar = tqdm.tqdm(total=total, unit="request", file=sys.stderr)
    results = {}
    for workload, batch in prompts.items():
        rows = []
        for i, prompt in enumerate(batch):
            runs = {m: [] for m in methods}
            for _ in range(repeats):
                for method in methods:
                    bar.set_description(f"{workload} {i} {method}")
                    runs[method].append(serve(model, tokenizer, method, prompt, max_new_tokens))
                    bar.update()
            reference = runs["plain"][0]["tokens"]
            row = {"prompt": i, "prompt_tokens": len(prompt), "mismatches": [
                m for m, rs in runs.items() if any(r["tokens"] != reference for r in rs)]}
            for method, rs in runs.items():
                row[method] = {key: statistics.median(r[key] for r in rs if r[key] is not None)
                               if any(r[key] is not None for r in rs) else None
                               for key in ("tokens_per_s", "acceptance_length", "k_mean",
                                           "gap_ratio", "max_gap_ms", "first_call_s")}
            if "auto" in runs:
                auto = row["auto"]["tokens_per_s"]
                others = [row[m]["tokens_per_s"] for m in methods if m != "auto"]
                row["auto_vs_best"] = auto / max(others)
                row["auto_vs_plain"] = auto / row["plain"]["tokens_per_s"]
                row["auto_worst_gap"] = max(r["gap_ratio"] or 0.0 for r in runs["auto"])
            for m in row["mismatches"]:
                log(f"MISMATCH: {m} differs from plain on {workload} prompt {i}")
            rows.append(row)
        results[workload] = rows
    bar.close()
    return results


def goals(results: dict) -> list[str]:
    """The issue's goals over every prompt, met or not, with the figures."""
    rows = [r for rs in results.values() for r in rs if "auto_vs_best" in r]
    if not rows:
        return []
    best = min(r["auto_vs_best"] for r in rows)
    plain = min(r["auto_vs_plain"] for r in rows)
    gap = max(r["auto_worst_gap"] for r in rows)
    mark = lambda ok: "met" if ok else "NOT met"  # noqa: E731
    return [f"- AUTO >= {GOAL_BEST}x the best other method on every prompt: worst "
            f"{best:.2f}x ({mark(best >= GOAL_BEST)})",
            f"- AUTO >= {GOAL_PLAIN}x plain on every prompt: worst {plain:.2f}x "
            f"({mark(plain >= GOAL_PLAIN)})",
            f"- AUTO's longest step gap <= {GOAL_GAP:g}x its median step (same width) in every "
            f"request: "
            f"worst {gap:.1f}x ({mark(gap <= GOAL_GAP)})"]


def markdown(results: dict, *, methods, repeats: int, max_new_tokens: int, eager: bool) -> str:
    protocol = ("the old protocol: every program compiled at once inside the untimed request "
                "(`--eager`)" if eager else "as users run it: nothing compiled ahead")
    lines = [f"Batch 1, {max_new_tokens} new tokens, a fresh engine per request, medians of "
             f"{repeats} rounds; {protocol}. Tokens/s include prefill; in brackets the mean "
             f"acceptance length.", ""]
    head = " | ".join(methods)
    lines += [f"| workload | prompt | {head} | AUTO / best | AUTO / plain | AUTO gap |",
              "| --- | ---: |" + " ---: |" * (len(methods) + 3)]
    for workload, rows in results.items():
        for r in rows:
            cells = []
            for m in methods:
                x = r[m]
                acc = "" if m == "plain" or x["acceptance_length"] is None else (
                    f" ({x['acceptance_length']:.2f})")
                cells.append(f"{x['tokens_per_s']:.1f}{acc}")
            flag = " MISMATCH" if r["mismatches"] else ""
            lines.append(f"| {workload} | {r['prompt']}{flag} | " + " | ".join(cells)
                         + f" | {r.get('auto_vs_best', 0):.2f} | {r.get('auto_vs_plain', 0):.2f}"
                         f" | {r.get('auto_worst_gap', 0):.1f}x |")
    return "\n".join(lines + [""] + goals(results)) + "\n"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.as_user",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", default="code_editing,translation,humaneval,mtbench")
    parser.add_argument("--n", type=int, default=4, help="prompts per workload")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=192)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--eager", action="store_true",
                        help="compile every program asked for at once in the untimed request")
    parser.add_argument("--cost-cache", default=None,
                        help="the step-cost cache folder (default: a new, empty one)")
    parser.add_argument("--compile-cache", default=None,
                        help="the persistent compilation cache folder (default: a new, empty "
                             "one)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--write", action="store_true",
                        help="update the as_user section of BENCHMARKS.md")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    methods = ["plain", *[m for m in args.methods.split(",") if m != "plain"]]
    unknown = [m for m in methods if m not in METHODS]
    if unknown or args.n < 1 or args.repeats < 1 or args.max_new_tokens < 1:
        print(f"bad arguments: unknown methods {unknown} or a count below 1", file=sys.stderr)
        return 2
    os.environ["JAXSPEC_COST_CACHE"] = args.cost_cache or tempfile.mkdtemp(prefix="jaxspec-cost-")
    compiles.enable_persistent_cache(args.compile_cache
                                     or tempfile.mkdtemp(prefix="jaxspec-xla-"))
    from jaxspec import models

    model, tokenizer = models.load(None)
    prompts = {}
    for name in args.workloads.split(","):
        conversations = workloads.load(name, args.n)
        prompts[name] = chat_prompts.prompt_ids(model, tokenizer, conversations,
                                                max_new_tokens=args.max_new_tokens,
                                                batch_size=4)
    results = measure(model, tokenizer, prompts, methods=methods, repeats=args.repeats,
                      max_new_tokens=args.max_new_tokens, eager=args.eager)
    text = markdown(results, methods=methods, repeats=args.repeats,
                    max_new_tokens=args.max_new_tokens, eager=args.eager)
    if args.json:
        print(json.dumps(results))
    print(text, file=sys.stderr if args.json else sys.stdout)
    if args.write:
        command = " ".join(["python -m benchmarks.as_user",
                            *map(report.checkout_relative, argv)])
        report.write_section("as_user" + ("_eager" if args.eager else ""), text,
                             command=command)
    return 0


if __name__ == "__main__":
    sys.exit(main())

