"""Greedy equivalence: speculative vs plain greedy decoding, token for token, every divergence
explained.

    python -m benchmarks.equivalence --workload code_editing --n 4 --methods sa --dtypes bfloat16
    python -m benchmarks.equivalence --workload mtbench --methods sa,ngram,auto \\
        --dtypes float32,bfloat16 --json

Verifying `1 + K` positions in one forward is not bit-identical to decoding them one at a time
(other matmul shapes, other accumulation orders), so where the target's two best tokens are nearly
tied, rounding can pick either: greedy speculation drifts from plain greedy. For every request the
report gives whether the two outputs are token-identical and, where they are not, the first
differing position p with

* both runs' two best logits at p (their difference, the margin: how near greedy was to choosing
  otherwise);
* the verify window of the speculative run that produced p: its step, the index of p inside the
  window (0 = the token after the step's input, j >= 1 = after draft j), the step's K, and whether
  p's token was an accepted draft or the bonus token;
* a verdict: a *numerics tie* when the larger of the two margins is within the rounding error
  the dtype allows at that logit scale, `TIE_ULPS * eps(dtype) * max(1, |top-1 logit|)`, and a
  *bug* otherwise (two confident but different choices from the same prefix: something other
  than rounding differs).

The report also gives the rounding noise actually observed: the largest difference between the two
runs' top-1 logits at positions before the divergence, where both decoded the same prefix.

Then the teacher-forced comparison (`benchmarks.teacher_forced`), on the tiny model and on the
benchmark's model in each dtype: every generated position computed by a plain step and by a
verify step over plain's own tokens, so the inputs never part. It counts the positions whose
logits are not bitwise equal, the largest |difference| (per row of the verify window too), and
the argmax flips, each judged like a divergence (its plain margin against the tolerance).
"""

import argparse
import dataclasses
import json
import statistics
import sys

import jax.numpy as jnp

from benchmarks import chat_prompts
from benchmarks import report
from benchmarks import runs
from benchmarks import teacher_forced
from benchmarks import workloads
from jaxspec import engine as engine_lib

METHODS = ("sa", "ngram", "auto")
DTYPES = ("float32", "bfloat16")
# Rounding can move each logit by a few units in the last place of the compute dtype, times the
# depth of the network: 16 ulps of the top logit's magnitude separates rounding from real changes.
TIE_ULPS = 16


def tolerance(dtype: str, top_logit: float) -> float:
    """The largest margin a rounding difference can flip, at this dtype and logit scale."""
    return TIE_ULPS * float(jnp.finfo(jnp.dtype(dtype)).eps) * max(1.0, abs(top_logit))


@dataclasses.dataclass(frozen=True)
class Divergence:
    """Where one request's speculative output first differs from its plain output."""

    position: int                      # index into the generated tokens
    plain_token: int
    spec_token: int
    plain_top2: tuple[float, float]
    spec_top2: tuple[float, float]
    window: tuple[int, int, int]       # (verify step, index in window, K) of the spec token
    tolerance: float
    noise: float                       # max |top-1 logit| difference before the divergence

    @property
    def margins(self) -> tuple[float, float]:
        return (self.plain_top2[0] - self.plain_top2[1], self.spec_top2[0] - self.spec_top2[1])

    @property
    def verdict(self) -> str:
        return "numerics tie" if max(self.margins) <= self.tolerance else "bug"

    @property
    def source(self) -> str:
        """What produced the spec token: the prefill, a plain step, an accepted draft, the bonus."""
        step, index, k = self.window
        if step == 0:
            return "prefill"
        return "plain step" if k == 0 else f"verify K={k}, position {index}"


def first_divergence(plain: engine_lib.Generation, spec: engine_lib.Generation,
                     dtype: str) -> Divergence | None:
    """The first position where the two outputs differ (a length difference from a stop token
    counts at the shorter end), or None when they are identical."""
    pairs = zip(plain.token_ids, spec.token_ids, strict=False)
    p = next((i for i, (a, b) in enumerate(pairs) if a != b), None)
    if p is None:
        if len(plain.token_ids) == len(spec.token_ids):
            return None
        p = min(len(plain.token_ids), len(spec.token_ids)) - 1
    noise = max((abs(x[0] - y[0]) for x, y in zip(plain.top2[:p], spec.top2[:p], strict=True)),
                default=0.0)
    scale = max(abs(plain.top2[p][0]), abs(spec.top2[p][0]))
    return Divergence(position=p, plain_token=plain.token_ids[p], spec_token=spec.token_ids[p],
                      plain_top2=plain.top2[p], spec_top2=spec.top2[p], window=spec.windows[p],
                      tolerance=tolerance(dtype, scale), noise=noise)


def compare(model, tokenizer, prompts, *, methods, dtype: str, max_new_tokens: int,
            batch_size: int = 1) -> list[dict]:
    """Plain greedy once, then each of `methods`, on every prompt in `dtype`: one report per
    method (per request: identical or the first divergence explained; the steady tokens/s of
    plain and of the method, compilation left out)."""
    scheduler = runs.scheduler_for(prompts, max_new_tokens, batch_size)
    engine = engine_lib.Engine(model, tokenizer, spec="none", scheduler=scheduler, dtype=dtype,
                               record_top2=True)
    results = {}
    for name in ("plain", *methods):
        spec = "none" if name == "plain" else engine_lib.spec_from_name(
            name, None if name == "auto" else engine_lib.DEFAULT_DRAFT_LEN)
        results[name] = engine.generate_batch([list(p) for p in prompts],
                                              max_new_tokens=max_new_tokens, spec=spec)
    return [_report(results["plain"], results[m], method=m, dtype=dtype) for m in methods]


def _report(plain_result, spec_result, *, method: str, dtype: str) -> dict:
    rows = []
    pairs = zip(plain_result.generations, spec_result.generations, strict=True)
    for i, (plain, spec) in enumerate(pairs):
        d = first_divergence(plain, spec, dtype)
        rows.append({"request": i, "identical": d is None, "tokens": len(plain.token_ids),
                     "divergence": None if d is None else {
                         "position": d.position, "plain_token": d.plain_token,
                         "spec_token": d.spec_token, "plain_top2": list(d.plain_top2),
                         "spec_top2": list(d.spec_top2), "margins": list(d.margins),
                         "window": list(d.window), "source": d.source,
                         "tolerance": d.tolerance, "noise": d.noise, "verdict": d.verdict}})
    diverged = [r["divergence"] for r in rows if r["divergence"]]
    return {"method": method, "dtype": dtype, "requests": len(rows),
            "plain_tokens_per_s": plain_result.stats["steady_tokens_per_s"],
            "tokens_per_s": spec_result.stats["steady_tokens_per_s"],
            "identical": sum(r["identical"] for r in rows),
            "median_first_divergence": (statistics.median(d["position"] for d in diverged)
                                        if diverged else None),
            "ties": sum(d["verdict"] == "numerics tie" for d in diverged),
            "bugs": sum(d["verdict"] == "bug" for d in diverged), "rows": rows}


def teacher_forced_reports(model, prompts, *, dtypes, k: int, max_new_tokens: int,
                           model_name: str = "SmolLM2-135M", tiny_prompts: int = 4
                           ) -> list[dict]:
    """`teacher_forced.teacher_forced` in each dtype on the tiny model over `tiny_prompts` random
    prompts, then on `model` over `prompts`: [{model, ...report}], each flip judged like a
    divergence (verdict and tolerance), each report's totals with its bugs."""
    from jaxspec.models import precision
    from jaxspec.models import tiny

    small = tiny.tiny_model(seed=0)
    runs_ = [("tiny", small, teacher_forced.random_prompts(small.vocab_size,
                                                           [9, 13, 7, 11][:tiny_prompts])),
             (model_name, model, prompts)]
    out = []
    for name, m, ps in runs_:
        for dtype in dtypes:
            report = teacher_forced.teacher_forced(precision.cast(m, dtype), ps, k=k,
                                                   max_new_tokens=max_new_tokens)
            for row in report["prompts"]:
                for flip in row["flips"]:
                    flip["tolerance"] = tolerance(dtype, flip["plain_top"])
                    flip["verdict"] = ("numerics tie" if flip["plain_margin"] <= flip["tolerance"]
                                       else "bug")
            report["totals"]["bugs"] = sum(f["verdict"] == "bug" for r in report["prompts"]
                                           for f in r["flips"])
            out.append(dict(model=name, **report))
    return out


def teacher_forced_markdown(reports: list[dict]) -> list[str]:
    """The teacher-forced table, then one line per argmax flip."""
    lines = ["", "Teacher-forced: each generated position computed by a plain step (K=0) and by a "
             "verify step over plain's own tokens (identical inputs), float32 logits compared.", "",
             *teacher_forced.MARKDOWN_HEADER]
    for r in reports:
        lines += teacher_forced.markdown_rows(r["model"], [r])
    flips = [(r, i, f) for r in reports for i, row in enumerate(r["prompts"])
             for f in row["flips"]]
    if flips:
        lines += ["", "| model | dtype | prompt | position | verify step, row | plain margin "
                  "| tolerance | verdict |",
                  "| --- | --- | ---: | ---: | --- | ---: | ---: | --- |"]
        for r, i, f in flips:
            lines.append(f"| {r['model']} | {r['dtype']} | {i} | {f['position']} | "
                         f"{f['window'][0]}, {f['window'][1]} | {f['plain_margin']:.4g} | "
                         f"{f['tolerance']:.3g} | {f['verdict']} |")
    return lines


def markdown(workload: str, reports: list[dict], teacher: list[dict] = ()) -> str:
    """The summary table, then one line per divergence, then the teacher-forced comparison."""
    lines = [f"## Greedy equivalence: `{workload}`", "",
             "| method | dtype | token-identical | median first divergence | numerics ties "
             "| bugs | plain tok/s | method tok/s |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in reports:
        median = "–" if r["median_first_divergence"] is None else r["median_first_divergence"]
        lines.append(f"| {r['method']} | {r['dtype']} | {r['identical']}/{r['requests']} "
                     f"({100 * r['identical'] / r['requests']:.0f}%) | {median} | {r['ties']} | "
                     f"{r['bugs']} | {_rate(r['plain_tokens_per_s'])} | "
                     f"{_rate(r['tokens_per_s'])} |")
    details = [(r, row["request"], row["divergence"]) for r in reports for row in r["rows"]
               if row["divergence"]]
    if details:
        lines += ["", "| method | dtype | request | position | margins plain / spec | tolerance | "
                  "noise before | produced by | verdict |",
                  "| --- | --- | ---: | ---: | --- | ---: | ---: | --- | --- |"]
        for r, request, d in details:
            lines.append(f"| {r['method']} | {r['dtype']} | {request} | {d['position']} | "
                         f"{d['margins'][0]:.4g} / {d['margins'][1]:.4g} | "
                         f"{d['tolerance']:.3g} | {d['noise']:.3g} | {d['source']} | "
                         f"{d['verdict']} |")
    speeds = _dtype_speeds(reports)
    if speeds:
        lines += ["", speeds]
    lines += ["", f"A divergence is a numerics tie when both margins (top-1 minus top-2 logit) "
                  f"are within {TIE_ULPS} ulps of the dtype at the top logit's magnitude; "
                  f"'noise before' is the largest top-1 logit difference between the runs before "
                  f"the divergence."]
    if teacher:
        lines += teacher_forced_markdown(teacher)
    return "\n".join(lines)


def _rate(value) -> str:
    return "–" if value is None else f"{value:.2f}"


def _dtype_speeds(reports: list[dict]) -> str:
    """bfloat16 against float32 on this machine: plain and each method's steady tokens/s."""
    by = {(r["method"], r["dtype"]): r for r in reports}
    parts = []
    for method in dict.fromkeys(r["method"] for r in reports):
        full, half = by.get((method, "float32")), by.get((method, "bfloat16"))
        if full and half and full["tokens_per_s"] and half["tokens_per_s"]:
            parts.append(f"{method} {half['tokens_per_s'] / full['tokens_per_s']:.2f}x")
    plain = {r["dtype"]: r["plain_tokens_per_s"] for r in reports if r["plain_tokens_per_s"]}
    if "float32" not in plain or "bfloat16" not in plain or not parts:
        return ""
    return (f"bfloat16 / float32 steady tokens/s (one pass each, compilation left out): plain "
            f"{plain['bfloat16'] / plain['float32']:.2f}x, " + ", ".join(parts) + ".")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.equivalence",
                                description=__doc__.split("\n")[0])
    p.add_argument("--workload", default="code_editing", choices=workloads.WORKLOADS)
    p.add_argument("--n", type=int, default=4, help="conversations from the workload")
    p.add_argument("--methods", default="sa,ngram,auto")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--teacher-forced-k", type=int, default=engine_lib.DEFAULT_DRAFT_LEN,
                   help="drafts per verify step of the teacher-forced comparison (0: skip it)")
    p.add_argument("--json", action="store_true", help="print the whole report as JSON")
    p.add_argument("--write", action="store_true", help="record the section in BENCHMARKS.md")
    return p


def _names(text: str, allowed: tuple[str, ...], what: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = sorted(set(names) - set(allowed))
    if bad or not names:
        raise ValueError(f"unknown {what} {bad or text!r}; choose from {allowed}")
    return names


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = _parser().parse_args(argv)
    methods = _names(args.methods, METHODS, "methods")
    dtypes = _names(args.dtypes, DTYPES, "dtypes")
    from jaxspec import models

    load_start = runs.load_average()
    conversations = workloads.load(args.workload, args.n)
    model, tokenizer = models.load(None, dtype="float32")
    prompts = chat_prompts.prompt_ids(model, tokenizer, conversations,
                                      max_new_tokens=args.max_new_tokens)
    reports = [r for d in dtypes
               for r in compare(model, tokenizer, prompts, methods=methods, dtype=d,
                                max_new_tokens=args.max_new_tokens, batch_size=args.batch_size)]
    teacher = [] if args.teacher_forced_k == 0 else teacher_forced_reports(
        model, prompts, dtypes=dtypes, k=args.teacher_forced_k,
        max_new_tokens=args.max_new_tokens)
    text = markdown(args.workload, reports, teacher) + "\n\n" + runs.load_note(
        load_start, runs.load_average())
    if args.json:
        print(json.dumps({"workload": args.workload, "reports": reports,
                          "teacher_forced": teacher}))
        argv = [a for a in argv if a != "--json"]
    report.publish(f"equivalence_{args.workload}", text, module="benchmarks.equivalence",
                   argv=argv, write=args.write, show=not args.json)
    return 1 if any(r["bugs"] for r in reports) or any(
        t["totals"]["bugs"] for t in teacher) else 0


if __name__ == "__main__":
    sys.exit(main())
