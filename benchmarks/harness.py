"""Every decoding method side by side on one workload, in one process and one run.

    python -m benchmarks.harness --workload code_editing --n 4 --max-new-tokens 128
    python -m benchmarks.harness --workload mtbench --batch-size 4 --methods sa,auto --json
    python -m benchmarks.harness sweep --batch-sizes 1,2,4,8   # the batch sweep: benchmarks.sweep
    python -m benchmarks.harness plain-vs-hf       # greedy, jaxspec vs HF: benchmarks.plain_vs_hf
    python -m benchmarks.harness all               # what `make bench` runs: benchmarks.run_all

Methods, on the same prompt token ids and the same model (SmolLM2-135M-Instruct):
  plain      jaxspec without speculation: the reference for speed and for tokens (always runs)
  sa         the suffix automaton, drafting on the device, K = --max-draft-len (with
             --adaptive: up to K, chosen per iteration and row, `SAConfig(adaptive=True)`)
  ngram      the host n-gram pool, K, patterns of up to 3 tokens (--adaptive: as sa)
  auto       jaxspec's AUTO choice for this batch size
  oracle     drafts = plain's own greedy output, the ceiling for K (`benchmarks.oracle`); the
             copy bound, the ceiling of drafting from text already seen, is computed from plain's
             outputs for every workload
  hf_greedy  HF transformers greedy on torch CPU (batch 1 only; needs the `bench` extra)
  hf_pld     HF `prompt_lookup_num_tokens=K` (K = --pld-draft-len, default --max-draft-len)

Procedure: the prompts are built first (earlier turns of a conversation answered by plain greedy
decoding, `benchmarks.chat_prompts`). Every method then runs once untimed, which compiles every
XLA shape the timed passes use (HF, which compiles nothing, only generates a few tokens after a
short prompt); an adaptive method, which compiles a draft width when it first picks it, runs
again while its untimed pass still compiled something (at most `MAX_WARMUPS` passes). What the
control plane asks for compiles in the background, as for users (`jaxspec.host.compiles`); after
each untimed pass the harness waits for those compiles, so no timed pass shares the CPU with one.
`--eager` compiles every program asked for at once inside the untimed passes instead (the old
protocol, reported as such). `benchmarks.as_user` times a fresh engine per request with nothing
waited for. Then
`--repeats` rounds each run every method once, in the order above, so drift
on a shared machine hits all methods alike. Reported numbers are medians over rounds; a speedup
is the median over rounds of the method's tokens/s divided by plain's in the same round
(`benchmarks.runs` defines the throughputs). Every output is compared with plain's token by token
(HF prompt lookup with HF greedy); a difference is printed as MISMATCH and listed in the results.
"""

import argparse
import contextlib
import dataclasses
import json
import os
import pathlib
import statistics
import sys
import time

from benchmarks import chat_prompts
from benchmarks import hf_baseline
from benchmarks import oracle
from benchmarks import report
from benchmarks import runs
from benchmarks import workloads
from jaxspec import engine as engine_lib
from jaxspec.host import compiles

METHODS = ("plain", "sa", "sa_frequent", "sa_tree", "ngram", "auto", "oracle", "hf_greedy",
           "hf_pld")
HF_METHODS = ("hf_greedy", "hf_pld")
ADAPTABLE = ("sa", "sa_frequent", "sa_tree", "ngram")    # methods --adaptive makes adaptive
LABELS = {"plain": "jaxspec plain", "sa": "jaxspec SA", "sa_frequent": "jaxspec SA frequent",
          "sa_tree": "jaxspec SA tree",
          "ngram": "jaxspec NGram",
          "auto": "jaxspec AUTO", "oracle": "jaxspec oracle", "hf_greedy": "HF greedy",
          "hf_pld": "HF prompt lookup"}
# The issues' goals, checked where their workload runs: (numerator, denominator, minimum).
GOALS = {
    "code_editing": (("sa", "plain", 3.0), ("sa", "hf_pld", 1.5), ("sa", "oracle", 0.8)),
    "mtbench_turn1": (("auto", "plain", 0.99),),
    "long_document_qa": (("sa", "plain", 1.5), ("sa", "hf_pld", 1.3)),
}
# Issue 13: no workload makes the default (AUTO) slower than plain by more than this.
NEVER_SLOWER = ("auto", "plain", 0.98)
# Where a workload's goals come from.
GOAL_ISSUES = {
    "code_editing": "issue 13 (adaptive SA vs plain and HF prompt lookup K=10); oracle and "
                    "drafting overhead: issue 6",
    "mtbench_turn1": "issue 13; drafting overhead: issue 6",
    "raw_text": "issue 13 (AUTO never slower); drafting overhead: issue 6",
    "long_document_qa": "issue 12; AUTO vs plain: issue 13; drafting overhead: issue 6",
}
# Methods whose outputs a goal requires token-identical to plain's (every method is checked).
IDENTICAL_GOALS = {"long_document_qa": ("sa",)}
# HF's warm-up prompt: the last tokens of the first prompt. torch compiles nothing per shape, and
# a full 8k-token prompt would cost a minute of prefill for nothing.
HF_WARMUP_TOKENS = 64
MAX_DRAFTING_OVERHEAD_PCT = 2.0
SAMPLING_SEED = 0            # every sampled request's seed (--temperature)
MAX_WARMUPS = 3              # untimed passes of an adaptive method, at most
SUBCOMMANDS = {"sweep": "benchmarks.sweep", "plain-vs-hf": "benchmarks.plain_vs_hf",
               "all": "benchmarks.run_all"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class BenchConfig:
    """One harness run.

    Attributes:
      workload: a name in `benchmarks.workloads.WORKLOADS`.
      n: conversations taken from the workload.
      batch_size: the engine's max_batch_size: requests decoded together.
      max_new_tokens: tokens generated per prompt at most.
      max_draft_len: K for sa, ngram, oracle and HF prompt lookup.
      repeats: timed rounds.
      methods: the methods to run, in `METHODS` order; plain is always added.
      adaptive: sa and ngram choose their draft length per iteration, up to max_draft_len.
      pld_draft_len: HF prompt lookup's K (None: max_draft_len).
      tree_budget: sa_tree's nodes per step (None: 2 x max_draft_len); max_draft_len caps its
        depth.
      temperature: 0 decodes greedily; above, every method samples, each token keyed by
        (SAMPLING_SEED, its position), so plain and speculative outputs stay comparable token
        by token (HF's sampling is not keyed so: no HF methods then).
      eager: untimed passes compile every program asked for at once (the old protocol) rather
        than in the background.
    """

    workload: str = "code_editing"
    n: int = 4
    batch_size: int = 1
    max_new_tokens: int = 128
    max_draft_len: int = engine_lib.DEFAULT_DRAFT_LEN
    repeats: int = 3
    methods: tuple[str, ...] = METHODS
    adaptive: bool = False
    pld_draft_len: int | None = None
    tree_budget: int | None = None
    temperature: float = 0.0
    eager: bool = False

    def __post_init__(self):
        if self.workload not in workloads.WORKLOADS:
            raise ValueError(f"unknown workload {self.workload!r}; known: "
                             f"{', '.join(workloads.WORKLOADS)}")
        for name in ("n", "batch_size", "max_new_tokens", "max_draft_len", "repeats"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.tree_budget is None:
            object.__setattr__(self, "tree_budget", 2 * self.max_draft_len)
        if self.pld_draft_len is not None and (isinstance(self.pld_draft_len, bool) or not
                                               isinstance(self.pld_draft_len, int) or
                                               self.pld_draft_len < 1):
            raise ValueError(f"pld_draft_len must be an int >= 1, got {self.pld_draft_len!r}")
        if (isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float))
                or not self.temperature >= 0):
            raise ValueError(f"temperature must be a number >= 0, got {self.temperature!r}")
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown:
            raise ValueError(f"unknown methods {unknown}; known: {', '.join(METHODS)}")
        object.__setattr__(self, "methods",
                           tuple(m for m in METHODS if m == "plain" or m in self.methods))

    @property
    def section(self) -> str:
        """The BENCHMARKS.md section of this workload and batch size."""
        suffix = "" if self.batch_size == 1 else f"_b{self.batch_size}"
        if self.temperature:
            suffix += f"_t{self.temperature:g}"
        return f"bench_{self.workload}{suffix}"


def spec_for(method: str, max_draft_len: int, adaptive: bool = False,
             tree_budget: int | None = None):
    """The engine spec of a jaxspec method other than the oracle (`tree_budget`: sa_tree's,
    None for 2 x max_draft_len)."""
    name = {"plain": "none", "sa_frequent": "sa", "sa_tree": "sa"}.get(method, method)
    spec = engine_lib.spec_from_name(name, None if method == "auto" else max_draft_len)
    if method in ("sa_frequent", "sa_tree"):
        spec = dataclasses.replace(spec, selection="frequent")
    if method == "sa_tree":
        spec = dataclasses.replace(spec, tree_budget=tree_budget or 2 * max_draft_len)
    if adaptive and method in ADAPTABLE:
        spec = dataclasses.replace(spec, adaptive=True)
    return spec


def _median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _summary(timed: list[runs.Run], plain: list[runs.Run], warmup: runs.Run | None) -> dict:
    out = dict(
        tokens_per_s=_median(r.tokens_per_s for r in timed),
        tokens_per_s_runs=[round(r.tokens_per_s, 3) for r in timed],
        decode_tokens_per_s_runs=[None if r.decode_tokens_per_s is None
                                  else round(r.decode_tokens_per_s, 3) for r in timed],
        speedup=_median(r.tokens_per_s / p.tokens_per_s for r, p in zip(timed, plain, strict=True)),
        decode_tokens_per_s=_median(r.decode_tokens_per_s for r in timed),
        decode_speedup=_median(
            r.decode_tokens_per_s / p.decode_tokens_per_s for r, p in zip(timed, plain, strict=True)
            if r.decode_tokens_per_s and p.decode_tokens_per_s),
        generated_tokens=timed[-1].generated,
        prefill_s=_median(r.prefill_s for r in timed),
        peak_rss_mib=max((r.peak_mib for r in timed if r.peak_mib is not None), default=None),
        first_pass_s=None if warmup is None else warmup.wall_s,
        compiles_warmup=None if warmup is None else warmup.compiles,
        compiles_timed=sum(r.compiles for r in timed),
    )
    stats = timed[-1].stats
    if stats is not None:
        step_ms = _median(r.stats["mean_step_time_ms"] for r in timed)
        draft_ms = _median(r.stats["drafting_overhead_ms_per_step"] for r in timed)
        out.update(
            {key: stats[key] for key in ("acceptance_rate", "mean_acceptance_length",
                                         "acceptance_length_histogram", "per_position_acceptance",
                                         "k_mean", "decode_steps")},
            mean_step_time_ms=step_ms, drafting_overhead_ms_per_step=draft_ms,
            drafting_overhead_pct=None if not step_ms or draft_ms is None
            else 100 * draft_ms / step_ms)
    return out


def ratio(results: dict, numerator: str, denominator: str, *,
          decode: bool = False) -> float | None:
    """Median over rounds of numerator's tokens/s over denominator's, None if either is absent.

    Against the oracle it is the ratio of speedups: the share of the ceiling reached. With
    `decode`, decode tokens/s (prefill left out) instead.
    """
    methods = results["methods"]
    if numerator not in methods or denominator not in methods:
        return None
    if denominator == "oracle":
        key = "decode_speedup" if decode else "speedup"
        num, den = methods[numerator][key], methods["oracle"][key]
        return None if num is None or not den else num / den
    key = "decode_tokens_per_s_runs" if decode else "tokens_per_s_runs"
    pairs = zip(methods[numerator][key], methods[denominator][key], strict=True)
    return _median(a / b for a, b in pairs if a is not None and b)


class OutputChecker:
    """Compares outputs with their reference and reports each (method, prompt) difference once.

    Args:
      labels: display name of each method.
      log: called with one line per new difference.
    """

    def __init__(self, labels: dict[str, str], log):
        self.mismatches: list[dict] = []
        self._seen = set()
        self._labels = labels
        self._log = log

    def check(self, method: str, outputs, reference, reference_name: str, when: str):
        for i, (got, want) in enumerate(zip(outputs, reference, strict=True)):
            position = runs.first_mismatch(got, want)
            if position is None or (method, i) in self._seen:
                continue
            self._seen.add((method, i))
            self.mismatches.append(dict(method=method, reference=reference_name, prompt=i,
                                        position=position, when=when))
            self._log(f"MISMATCH: {self._labels[method]} differs from "
                      f"{self._labels[reference_name]} on prompt {i} at generated token "
                      f"{position} ({when})")


def compare(model, tokenizer, prompts: list[list[int]], cfg: BenchConfig, *, hf=None,
            progress: bool = True, label: str | None = None) -> dict:
    """Runs every method of `cfg` on `prompts` (token ids) and summarises; see the module doc.

    Args:
      model, tokenizer: the jaxspec model; tokenizer None means no stop tokens.
      prompts: prompt token ids.
      cfg: methods, lengths, batch size, repeats (`cfg.workload` only labels the results).
      hf: a `benchmarks.hf_baseline.HFModel`, or None to leave the HF methods out.
      progress: show a progress bar on stderr.
      label: names the run in the progress bar and as the results' `workload` (default:
        `cfg.workload`).

    Returns:
      A JSON-ready dict: `methods` (per method: throughputs, speedups, median prefill seconds,
      acceptance metrics, drafting overhead, peak RSS, compile counts), `mismatches`, and the
      run's settings.
    """
    import tqdm

    label = label or cfg.workload
    methods = [m for m in cfg.methods if (hf is not None and not cfg.temperature)
               or m not in HF_METHODS]
    sampling = (dict(temperature=float(cfg.temperature), seed=SAMPLING_SEED)
                if cfg.temperature else {})
    scheduler = runs.scheduler_for(prompts, cfg.max_new_tokens, cfg.batch_size)
    stops = runs.stop_ids(tokenizer)
    k = cfg.max_draft_len
    pld_k = cfg.pld_draft_len or k
    bar = tqdm.tqdm(total=len(methods) * (1 + cfg.repeats), disable=not progress, unit="pass",
                    desc=label, file=sys.stderr)
    checker = OutputChecker(LABELS, lambda line: tqdm.tqdm.write(line, file=sys.stderr))
    warmups: dict[str, runs.Run] = {}
    timed: dict[str, list[runs.Run]] = {m: [] for m in methods}
    hf_prefill_s = None

    def one_pass(method: str) -> runs.Run:
        if method in HF_METHODS:
            return runs.run_hf(hf, prompts, max_new_tokens=cfg.max_new_tokens, stops=stops,
                               prompt_lookup_num_tokens=pld_k if method == "hf_pld" else None,
                               prefill_s=hf_prefill_s)
        if method == "oracle":
            truth = dict(zip(map(tuple, prompts), warmups["plain"].outputs, strict=True))
            spec = oracle.OracleDrafter(k, truth)
        else:
            spec = spec_for(method, k, cfg.adaptive, cfg.tree_budget)
        return runs.run_jaxspec(model, tokenizer, prompts, spec=spec,
                                max_new_tokens=cfg.max_new_tokens, scheduler=scheduler,
                                **sampling)

    def check(method: str, run: runs.Run, when: str):
        ref = "hf_greedy" if method == "hf_pld" and timed.get("hf_greedy") else "plain"
        reference = timed[ref][0] if ref == "hf_greedy" else warmups["plain"]
        checker.check(method, run.outputs, reference.outputs, ref, when)

    for method in methods:
        bar.set_description(f"{label} warm-up {method}")
        if method in HF_METHODS:
            hf.generate(prompts[0][-HF_WARMUP_TOKENS:], max_new_tokens=2, stop_ids=stops,
                        prompt_lookup_num_tokens=pld_k if method == "hf_pld" else None)
            if hf_prefill_s is None:
                hf_prefill_s = runs.hf_prefill_seconds(hf, prompts, stops)
        else:
            with compiles.LEDGER.eager() if cfg.eager else contextlib.nullcontext():
                warmups[method] = one_pass(method)
            compiles.LEDGER.wait()
            check(method, warmups[method], "warm-up")
            # Adaptive K compiles a width the first time it picks one: warm up again while a
            # pass still compiles, so the timed rounds mostly time decoding.
            adaptive = method == "auto" or (cfg.adaptive and method in ADAPTABLE)
            last = warmups[method]
            for _ in range(MAX_WARMUPS - 1):
                if not (adaptive and last.compiles):
                    break
                with compiles.LEDGER.eager() if cfg.eager else contextlib.nullcontext():
                    again = last = one_pass(method)
                compiles.LEDGER.wait()
                check(method, again, "warm-up")
                warmups[method] = dataclasses.replace(
                    warmups[method], compiles=warmups[method].compiles + again.compiles,
                    compile_s=warmups[method].compile_s + again.compile_s)
        bar.update()
    for round_ in range(1, cfg.repeats + 1):
        for method in methods:
            bar.set_description(f"{label} round {round_}/{cfg.repeats} {method}")
            run = one_pass(method)
            timed[method].append(run)
            check(method, run, f"round {round_}")
            bar.set_postfix_str(f"{run.tokens_per_s:.1f} tok/s")
            bar.update()
    bar.close()
    copied = [a for p, o in zip(prompts, warmups["plain"].outputs, strict=True)
              for a in oracle.copy_bound(p, o, k)]
    return dict(
        workload=label, config=dataclasses.asdict(cfg), num_prompts=len(prompts),
        mean_prompt_tokens=statistics.mean(map(len, prompts)),
        copy_bound_acceptance_length=1 + statistics.mean(copied) if copied else None,
        hf_runtime=None if hf is None or cfg.temperature else hf.threads_note,
        methods={m: _summary(timed[m], timed["plain"], warmups.get(m)) for m in methods},
        mismatches=checker.mismatches)


def _fmt(value, spec: str = ".2f", suffix: str = "") -> str:
    return "–" if value is None else f"{value:{spec}}{suffix}"


def goal_lines(results: dict) -> list[str]:
    """The issue's goals that apply to this workload, met or not.

    A ratio goal is judged on tokens/s as a user sees it (prefill included); the decode-only
    ratio is shown beside it, since prefill weighs heavily on short replies.
    """
    lines = []
    for num, den, minimum in GOALS.get(results["workload"], ()):
        value = ratio(results, num, den)
        if value is not None:
            verdict = "met" if value >= minimum else "not met"
            lines.append(f"- {LABELS[num]} / {LABELS[den]}: {value:.3f} "
                         f"(goal >= {minimum}: {verdict}; decode only: "
                         f"{_fmt(ratio(results, num, den, decode=True), '.3f')})")
    num, den, minimum = NEVER_SLOWER
    value = ratio(results, num, den)
    if value is not None and not any(g[0] == num and g[1] == den
                                     for g in GOALS.get(results["workload"], ())):
        lines.append(f"- {LABELS[num]} / {LABELS[den]}: {value:.3f} (never slower, goal >= "
                     f"{minimum}: {'met' if value >= minimum else 'not met'})")
    for method in IDENTICAL_GOALS.get(results["workload"], ()):
        if method in results["methods"]:
            same = not any(x["method"] == method for x in results["mismatches"])
            lines.append(f"- {LABELS[method]} token-identical to {LABELS['plain']}: "
                         f"{'yes' if same else 'no'} (goal: {'met' if same else 'not met'})")
    for method in ("sa", "auto"):
        pct = results["methods"].get(method, {}).get("drafting_overhead_pct")
        if pct is not None:
            verdict = "met" if pct < MAX_DRAFTING_OVERHEAD_PCT else "not met"
            lines.append(f"- {LABELS[method]} host drafting overhead: {pct:.2f}% of step time "
                         f"(goal < {MAX_DRAFTING_OVERHEAD_PCT}%: {verdict}; the device part is "
                         "in `sa_overhead`)")
    return lines


def markdown(results: dict, *, plot: pathlib.Path | None = None) -> str:
    """The results as a BENCHMARKS.md section."""
    cfg = results["config"]
    methods = results["methods"]
    oracle_speedup = methods.get("oracle", {}).get("speedup")
    about = [
        f"Prompts of {results['mean_prompt_tokens']:.0f} tokens on average "
        f"({'chat template included' if results.get('chat', True) else 'raw text, no template'}"
        f"). Medians of {cfg['repeats']} rounds after an untimed warm-up; *tok/s* counts "
        "prefill, *decode tok/s* leaves it out; speedups are per-round ratios to jaxspec plain. "
        "Acceptance length counts the bonus token. *% of oracle* = speedup / the oracle's "
        "speedup. *Drafting* is host time per step: drafting for NGram and the oracle, slot "
        "bookkeeping for SA and AUTO, whose automaton extends and drafts on the device inside the "
        "step (its cost there is in the `sa_overhead` section), and the K decision where K is "
        "adaptive. Peak RSS is the whole process (every model loaded).",
        f"HF runs on torch CPU ({results['hf_runtime']})." if results["hf_runtime"] else "",
        runs.load_note(*results.get("load_average", (None, None))),
    ]
    k_note = " (SA and NGram adaptive, up to K)" if cfg.get("adaptive") else ""
    if cfg.get("temperature"):
        k_note += f", sampled at temperature {cfg['temperature']:g}"
    if cfg.get("pld_draft_len") not in (None, cfg["max_draft_len"]):
        k_note += f", HF prompt lookup K={cfg['pld_draft_len']}"
    if "sa_tree" in results["methods"]:
        k_note += f", SA tree: up to {cfg['tree_budget']} nodes a step, K deep"
    lines = [
        f"## Workload `{results['workload']}`: batch {cfg['batch_size']}, "
        f"{results['num_prompts']} prompts, {cfg['max_new_tokens']} new tokens, "
        f"K={cfg['max_draft_len']}{k_note}",
        "",
        " ".join(filter(None, about)),
        "",
        "| method | tok/s | speedup | decode tok/s | decode speedup | acceptance rate "
        "| mean acceptance length | drafting ms/step (% of step) | step ms | % of oracle "
        "| peak RSS MiB | compiles warm-up / timed |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for method, m in methods.items():
        overhead = (f"{m['drafting_overhead_ms_per_step']:.3f} "
                    f"({_fmt(m['drafting_overhead_pct'], '.2f', '%')})"
                    if m.get("drafting_overhead_ms_per_step") is not None else "–")
        of_oracle = (_fmt(100 * m["speedup"] / oracle_speedup, ".0f", "%")
                     if oracle_speedup and method in (*ADAPTABLE, "auto") else "–")
        compiles = ("–" if m["compiles_warmup"] is None
                    else f"{m['compiles_warmup']} / {m['compiles_timed']}")
        lines.append(
            f"| {LABELS[method]} | {_fmt(m['tokens_per_s'])} | {_fmt(m['speedup'], '.2f', 'x')} "
            f"| {_fmt(m['decode_tokens_per_s'])} | {_fmt(m['decode_speedup'], '.2f', 'x')} "
            f"| {_fmt(m.get('acceptance_rate'), '.3f')} "
            f"| {_fmt(m.get('mean_acceptance_length'), '.2f')} | {overhead} "
            f"| {_fmt(m.get('mean_step_time_ms'), '.1f')} | {of_oracle} "
            f"| {_fmt(m['peak_rss_mib'], '.0f')} | {compiles} |")
    copy_bound = results.get("copy_bound_acceptance_length")
    if copy_bound is not None:
        lines += ["", f"Copy bound: a drafter that copies from the text already seen accepts at "
                  f"most {copy_bound:.2f} tokens per step at K={cfg['max_draft_len']} (bonus "
                  "included): each step it drafts the longest prefix of plain's continuation "
                  "found anywhere in the prompt and the reply so far (`benchmarks.oracle`)."]
    goals = goal_lines(results)
    if goals:
        lines += ["", f"Goals ({GOAL_ISSUES.get(results['workload'], 'issue 6')}):", *goals]
    lines.append("")
    if results["mismatches"]:
        lines.append("**Token mismatches** (method vs reference, prompt, first differing token):")
        lines += [f"- {LABELS[x['method']]} vs {LABELS[x['reference']]}: prompt {x['prompt']}, "
                  f"token {x['position']} ({x['when']})" for x in results["mismatches"]]
    else:
        both_hf = all(m in methods for m in HF_METHODS)
        lines.append("Every output is token-identical to jaxspec plain"
                     + (" (HF prompt lookup to HF greedy)." if both_hf else "."))
    for note in results.get("skipped", ()):
        lines.append(f"\n{note}.")
    if plot is not None:
        rel = os.path.relpath(plot, report.BENCHMARKS_MD.parent)
        lines += ["", f"![acceptance-length histograms, {results['workload']}]({rel})"]
    return "\n".join(lines)


def bench(cfg: BenchConfig, *, use_hf: bool = True, progress: bool = True,
          log=print) -> dict:
    """Loads SmolLM2, the workload and (if wanted and installed) HF, then `compare`s.

    Raises:
      WorkloadUnavailable: the workload's data package is missing.
    """
    from jaxspec import models

    start, load_start = time.perf_counter(), runs.load_average()
    conversations = workloads.load(cfg.workload, cfg.n)
    model, tokenizer = models.load(None)
    prompts = chat_prompts.prompt_ids(model, tokenizer, conversations,
                                      max_new_tokens=cfg.max_new_tokens,
                                      batch_size=max(cfg.batch_size, 4))
    hf, skipped = None, []
    if any(m in HF_METHODS for m in cfg.methods):
        reason = ("HF baseline skipped: --no-hf" if not use_hf
                  else "HF baseline skipped: sampled decoding (HF's samples are not keyed by "
                  "position, so its outputs cannot be compared token by token)"
                  if cfg.temperature
                  else "HF baseline skipped: HF prompt lookup runs at batch 1 only"
                  if cfg.batch_size != 1 else hf_baseline.unavailable_reason())
        if reason:
            skipped.append(reason)
            log(reason)
        else:
            hf = hf_baseline.HFModel.load()
    results = compare(model, tokenizer, prompts, cfg, hf=hf, progress=progress)
    results.update(skipped=skipped, elapsed_s=time.perf_counter() - start,
                   load_average=[load_start, runs.load_average()],
                   chat=all(c.chat for c in conversations))
    return results


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.harness",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--workload", default="code_editing", choices=list(workloads.WORKLOADS))
    parser.add_argument("--n", type=int, default=4, help="conversations from the workload")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--max-draft-len", type=int, default=engine_lib.DEFAULT_DRAFT_LEN)
    parser.add_argument("--adaptive", action="store_true",
                        help="sa and ngram choose K per iteration, up to --max-draft-len")
    parser.add_argument("--pld-draft-len", type=int, default=None,
                        help="HF prompt lookup's K (default: --max-draft-len)")
    parser.add_argument("--tree-budget", type=int, default=None,
                        help="sa_tree's nodes per step (default: 2 x --max-draft-len)")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds")
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="sample at this temperature (keyed per position; 0: greedy)")
    parser.add_argument("--methods", default=",".join(METHODS),
                        help=f"comma-separated subset of {','.join(METHODS)} (plain always runs)")
    parser.add_argument("--json", action="store_true",
                        help="print the results as JSON on stdout (the table goes to stderr)")
    parser.add_argument("--plots", type=pathlib.Path, default=None,
                        help="write the acceptance-length histogram PNG into this folder")
    parser.add_argument("--no-hf", action="store_true", help="leave the HF baseline out")
    parser.add_argument("--write", action="store_true",
                        help="update this workload's section of BENCHMARKS.md")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--eager", action="store_true",
                        help="untimed passes compile every program asked for at once (the old "
                             "protocol) instead of in the background")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in SUBCOMMANDS:
        import importlib

        return importlib.import_module(SUBCOMMANDS[argv[0]]).main(argv[1:])
    args = _parser().parse_args(argv)
    cfg = BenchConfig(workload=args.workload, n=args.n, batch_size=args.batch_size,
                      max_new_tokens=args.max_new_tokens, max_draft_len=args.max_draft_len,
                      repeats=args.repeats, methods=tuple(args.methods.split(",")),
                      adaptive=args.adaptive, pld_draft_len=args.pld_draft_len,
                      tree_budget=args.tree_budget, temperature=args.temperature,
                      eager=args.eager)
    out = sys.stderr if args.json else sys.stdout
    command = " ".join(["python -m benchmarks.harness", *map(report.checkout_relative, argv)])
    try:
        results = bench(cfg, use_hf=not args.no_hf, progress=not args.no_progress,
                        log=lambda line: print(line, file=sys.stderr))
    except workloads.WorkloadUnavailable as e:
        print(f"workload {cfg.workload} skipped: {e}", file=sys.stderr)
        if args.write:
            report.write_section(cfg.section, f"## Workload `{cfg.workload}`\n\nSkipped: {e}",
                                 command=command)
        return 0
    plot = None
    if args.plots is not None:
        from benchmarks import plots

        histograms = {LABELS[m]: r.get("acceptance_length_histogram")
                      for m, r in results["methods"].items() if m != "plain"}
        plot = plots.acceptance_histograms(
            histograms, args.plots / f"{cfg.section}_acceptance.png",
            title=f"{cfg.workload}, batch {cfg.batch_size}, K={cfg.max_draft_len}")
    text = markdown(results, plot=plot)
    print(text, file=out)
    print(f"\n[{results['elapsed_s']:.0f} s; numbers from a shared machine are noisy]", file=out)
    if args.json:
        print(json.dumps(results))
    if args.write:
        report.write_section(cfg.section, text, command=command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
