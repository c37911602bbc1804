"""Context sweep: batch 1 from 128 to 8k tokens of context, jaxspec and HF side by side (issue 12).

    python -m benchmarks.context_sweep --contexts 128,512,1024,2048,4096,8000 --max-new-tokens 64
    python -m benchmarks.context_sweep --contexts 128,1024 --max-new-tokens 16 --repeats 1
    python -m benchmarks.context_sweep --plots benchmarks/plots --write      # BENCHMARKS.md

At each context length L one prompt of exactly L tokens, chat template included: the start of a
long real text cut at a token boundary, then an instruction to repeat it (rewrite the code without
its comments; repeat the document's first section), so the reply copies the prompt and
speculation has something to draft. The text is this Python's `argparse` source (`--source
module`), or the Python Language Reference's topics in alphabetical order (`--source topics`,
`pydoc_data.topics`).

Every context runs the harness's protocol (`benchmarks.harness.compare`: an untimed warm-up per
jaxspec method that compiles every shape the timed passes use, then `--repeats` rounds of every
method, medians over rounds, outputs compared token by token) with these methods:
  plain      jaxspec without speculation
  sa         jaxspec, suffix automaton, K = --max-draft-len
  oracle     jaxspec, drafts = plain's own output: every verify step has K drafts, so its step time
             is the cost of a K-token verify step at this context
  hf_greedy  HF transformers greedy on torch CPU
  hf_pld     HF prompt lookup, `prompt_lookup_num_tokens=K`

Per method and context: prefill tokens/s (jaxspec: the engine's prefill time; HF: a 1-token
generation), decode step time (jaxspec: the engine's mean step time of a warm pass; HF greedy: its
decode seconds per token), SA's time per committed token (step time / mean acceptance length),
tokens/s with prefill, and whether SA's output equals plain's.
"""

import argparse
import importlib
import inspect
import os
import pathlib
import sys
import time

from benchmarks import harness
from benchmarks import hf_baseline
from benchmarks import report
from benchmarks import runs
from jaxspec import engine as engine_lib

SECTION = "context_sweep"
CONTEXTS = (128, 512, 1024, 2048, 4096, 8000)
METHODS = ("plain", "sa", "oracle", "hf_greedy", "hf_pld")
SOURCES = ("module", "topics")
SOURCE_MODULE = "argparse"  # ~22k tokens of Python: every context up to 8k is one cut of it
# (before, after) the text in the user message. SmolLM2-135M ignores "copy this from its first
# line"; these two make it repeat the text's opening (measured at 1k tokens: SA commits 2.2 and 2.7
# tokens per step).
FRAMES = {
    "module": ("```python\n",
               "\n```\n\nRewrite this code with the comments removed. Change nothing else."),
    "topics": ("Document:\n\n",
               "\n\nRepeat the first section of the document exactly as written."),
}
MIN_TEXT_TOKENS = 32  # below this a prompt is template and instruction, not context
# Issue 12's goals, read at these contexts (batch 1, ratios from this run).
STEP_GROWTH = (4096, 128, 1.4)   # plain decode step at 4096 / at 128 <= 1.4
MIN_DECODE_VS_HF = 1.5           # plain decode tok/s / HF greedy's >= 1.5 at every context
PREFILL_VS_HF = (4096, 1.2)      # plain prefill tok/s / HF's >= 1.2 at 4096
VERIFY_VS_PLAIN = (1024, 1.4)    # a K-draft verify step / a plain step <= 1.4 at 1024


def source_text(source: str) -> str:
    """The real text prompts are cut from (see the module docstring)."""
    if source == "module":
        return inspect.getsource(importlib.import_module(SOURCE_MODULE))
    if source == "topics":
        from pydoc_data import topics

        return "\n\n".join(topics.topics[key].strip() for key in sorted(topics.topics))
    raise ValueError(f"unknown source {source!r}; expected one of {SOURCES}")


def _encode(tokenizer, text: str) -> list[int]:
    """Token ids of `text` in the middle of a prompt: no BOS."""
    ids = tokenizer.encode(text)
    if tokenizer.add_bos and ids[:1] == [tokenizer.bos_token_id]:
        ids = ids[1:]
    return ids


def context_prompt(tokenizer, length: int, *, source: str = "module") -> list[int]:
    """A prompt of exactly `length` tokens: the chat template around the start of the source text,
    cut at a token boundary to fit, framed by FRAMES[source].

    Raises:
      ValueError: an unknown source, or `length` leaves fewer than MIN_TEXT_TOKENS tokens of
        text or more than the text has.
    """
    text_ids = _encode(tokenizer, source_text(source))
    marker = "\x00TEXT\x00"
    before, after = FRAMES[source]
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": before + marker + after}], add_generation_prompt=True)
    head, tail = chat.split(marker)
    head_ids = tokenizer.encode(head)  # BOS, if the model wants one, belongs here
    tail_ids = _encode(tokenizer, tail)
    room = length - len(head_ids) - len(tail_ids)
    if room < MIN_TEXT_TOKENS:
        raise ValueError(f"a {length}-token prompt leaves {room} tokens of text after the template "
                         f"and instruction; need at least {MIN_TEXT_TOKENS}")
    if room > len(text_ids):
        raise ValueError(f"a {length}-token prompt needs {room} tokens of text; the {source!r} "
                         f"source has {len(text_ids)}")
    return head_ids + text_ids[:room] + tail_ids


def row(length: int, results: dict) -> dict:
    """One context's numbers from `harness.compare`'s results (None where a method is absent)."""
    m = results["methods"]

    def get(method, key):
        return m.get(method, {}).get(key)

    def per_s(seconds):
        return None if not seconds else length / seconds

    hf_decode = get("hf_greedy", "decode_tokens_per_s")
    sa_step, sa_length = get("sa", "mean_step_time_ms"), get("sa", "mean_acceptance_length")
    plain_step, verify_step = get("plain", "mean_step_time_ms"), get("oracle", "mean_step_time_ms")
    return dict(
        context=length,
        prefill_tokens_per_s={"plain": per_s(get("plain", "prefill_s")),
                              "hf_greedy": per_s(get("hf_greedy", "prefill_s"))},
        step_ms={"plain": plain_step, "sa": sa_step, "oracle": verify_step,
                 "hf_greedy": None if not hf_decode else 1e3 / hf_decode},
        sa_ms_per_token=None if not (sa_step and sa_length) else sa_step / sa_length,
        sa_k_mean=get("sa", "k_mean"), oracle_k_mean=get("oracle", "k_mean"),
        sa_acceptance_length=sa_length,
        tokens_per_s={method: s["tokens_per_s"] for method, s in m.items()},
        decode_tokens_per_s={method: s["decode_tokens_per_s"] for method, s in m.items()},
        plain_vs_hf_decode=harness.ratio(results, "plain", "hf_greedy", decode=True),
        sa_vs_plain=harness.ratio(results, "sa", "plain"),
        sa_vs_hf_pld=harness.ratio(results, "sa", "hf_pld"),
        verify_vs_plain=None if not (plain_step and verify_step) else verify_step / plain_step,
        sa_identical="sa" in m and not any(x["method"] == "sa" for x in results["mismatches"]),
        compiles_timed={method: s["compiles_timed"] for method, s in m.items()
                        if s["compiles_warmup"] is not None},
        methods=m, mismatches=results["mismatches"])


def sweep(model, tokenizer, *, hf=None, contexts=CONTEXTS, source: str = "module",
          max_new_tokens: int = 64, max_draft_len: int = engine_lib.DEFAULT_DRAFT_LEN,
          repeats: int = 3, progress: bool = True) -> dict:
    """`harness.compare` at every context length on its `context_prompt` (see the module doc).

    Args:
      model, tokenizer: the jaxspec model and its tokenizer.
      hf: a `benchmarks.hf_baseline.HFModel`, or None to leave HF out.
      contexts: prompt lengths in tokens, chat template included.
      source: "module" or "topics".
      max_new_tokens, max_draft_len, repeats: as the harness's.
      progress: a progress bar per context on stderr.

    Raises:
      ValueError: a context and its reply exceed the model's context length, or `context_prompt`
        refuses one (checked before anything runs).
    """
    cfg = harness.BenchConfig(n=1, methods=METHODS, max_new_tokens=max_new_tokens,
                              max_draft_len=max_draft_len, repeats=repeats)
    limit = getattr(getattr(model, "cache_spec", None), "max_context_len", None)
    if limit is not None and max(contexts) + max_new_tokens + 1 > limit:
        raise ValueError(f"a {max(contexts)}-token context + {max_new_tokens} new tokens exceeds "
                         f"the model's context of {limit} tokens")
    prompts = [context_prompt(tokenizer, length, source=source) for length in contexts]
    rows = []
    for length, prompt in zip(contexts, prompts, strict=True):
        results = harness.compare(model, tokenizer, [prompt], cfg, hf=hf, progress=progress,
                                  label=f"context {length}")
        rows.append(row(length, results))
    return dict(contexts=list(contexts), source=source, max_new_tokens=max_new_tokens,
                max_draft_len=max_draft_len, repeats=repeats,
                hf_runtime=None if hf is None else hf.threads_note, rows=rows)


def _fmt(value, spec: str = ".1f", suffix: str = "") -> str:
    return "–" if value is None else f"{value:{spec}}{suffix}"


def _at(results: dict, context: int) -> dict | None:
    return next((r for r in results["rows"] if r["context"] == context), None)


def _verdict(value: float | None, goal: float, *, at_most: bool) -> str:
    if value is None:
        return "not measured"
    met = value <= goal if at_most else value >= goal
    return f"{value:.2f}x (goal {'<=' if at_most else '>='} {goal}: {'met' if met else 'not met'})"


def goal_lines(results: dict) -> list[str]:
    """Issue 12's goals with this run's ratios; a goal whose context did not run says so."""
    k = results["max_draft_len"]
    lines = []
    hi, lo, most = STEP_GROWTH
    top, bottom = _at(results, hi), _at(results, lo)
    growth = (None if top is None or bottom is None or not bottom["step_ms"]["plain"]
              else top["step_ms"]["plain"] / bottom["step_ms"]["plain"])
    lines.append(f"- jaxspec plain decode step at {hi} / at {lo} tokens: "
                 + _verdict(growth, most, at_most=True))
    decode = {r["context"]: r["plain_vs_hf_decode"] for r in results["rows"]}
    measured = {c: v for c, v in decode.items() if v is not None}
    if measured:
        worst = min(measured, key=measured.get)
        per_context = ", ".join(f"{c}: {v:.2f}x" for c, v in measured.items())
        lines.append(f"- jaxspec plain / HF greedy decode tok/s, lowest at {worst} tokens: "
                     + _verdict(measured[worst], MIN_DECODE_VS_HF, at_most=False)
                     + f" ({per_context})")
    else:
        lines.append("- jaxspec plain / HF greedy decode tok/s: not measured")
    at, least = PREFILL_VS_HF
    r = _at(results, at)
    prefill = None
    if r is not None and r["prefill_tokens_per_s"]["hf_greedy"]:
        prefill = r["prefill_tokens_per_s"]["plain"] / r["prefill_tokens_per_s"]["hf_greedy"]
    lines.append(f"- jaxspec / HF prefill tok/s at {at} tokens: "
                 + _verdict(prefill, least, at_most=False))
    at, most = VERIFY_VS_PLAIN
    r = _at(results, at)
    lines.append(f"- K={k} verify step / plain step at {at} tokens: "
                 + _verdict(None if r is None else r["verify_vs_plain"], most, at_most=True))
    different = [str(r["context"]) for r in results["rows"] if not r["sa_identical"]]
    lines.append("- jaxspec SA token-identical to plain at every context: "
                 + ("yes" if not different else f"no (differs at {', '.join(different)})"))
    return lines


def markdown(results: dict, *, plot: pathlib.Path | None = None) -> str:
    """The results as a BENCHMARKS.md section."""
    k = results["max_draft_len"]
    text = (f"`{SOURCE_MODULE}`'s source" if results["source"] == "module"
            else "the Python Language Reference's topics")
    about = [
        f"One prompt per context, exactly that many tokens (chat template included): the start of "
        f"{text} and an instruction to repeat it; batch 1, up to "
        f"{results['max_new_tokens']} new tokens, K={k}. Medians of {results['repeats']} round(s) "
        "after an untimed warm-up of every jaxspec method. *Prefill tok/s*: prompt tokens / "
        "prefill seconds (HF: a 1-token generation). *Step ms*: jaxspec's mean decode step in a "
        f"warm pass; the oracle drafts plain's own output, so its step is a K={k} verify step; HF "
        "greedy's is decode seconds per token. *SA ms/token*: SA's step / its mean acceptance "
        "length (bonus token included). *tok/s* counts prefill.",
        f"HF runs on torch CPU ({results['hf_runtime']})." if results["hf_runtime"] else
        "HF left out.",
        runs.load_note(*results.get("load_average", (None, None))),
    ]
    lines = [
        f"## Context sweep: batch 1 from {min(results['contexts'])} to "
        f"{max(results['contexts'])} tokens of context",
        "",
        " ".join(filter(None, about)),
        "",
        "| context | prefill tok/s jaxspec | prefill tok/s HF | step ms plain "
        f"| step ms SA (K mean) | SA ms/token | step ms K={k} verify | step ms HF greedy "
        "| decode tok/s plain | decode tok/s HF greedy | plain / HF decode |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results["rows"]:
        step, prefill, decode = r["step_ms"], r["prefill_tokens_per_s"], r["decode_tokens_per_s"]
        lines.append(
            f"| {r['context']:,} | {_fmt(prefill['plain'], '.0f')} "
            f"| {_fmt(prefill['hf_greedy'], '.0f')} | {_fmt(step['plain'])} "
            f"| {_fmt(step['sa'])} ({_fmt(r['sa_k_mean'], '.1f')}) "
            f"| {_fmt(r['sa_ms_per_token'])} | {_fmt(step['oracle'])} "
            f"| {_fmt(step['hf_greedy'])} | {_fmt(decode.get('plain'), '.2f')} "
            f"| {_fmt(decode.get('hf_greedy'), '.2f')} "
            f"| {_fmt(r['plain_vs_hf_decode'], '.2f', 'x')} |")
    labels = [m for m in METHODS if any(m in r["tokens_per_s"] for r in results["rows"])]
    lines += [
        "",
        "Tokens/s with prefill (what a user waits for), and SA's speedup over plain and over HF "
        "prompt lookup in the same rounds:",
        "",
        "| context | " + " | ".join(harness.LABELS[m] for m in labels)
        + " | SA / plain | SA / HF prompt lookup | SA = plain |",
        "| ---: | " + " | ".join("---:" for _ in labels) + " | ---: | ---: | :---: |",
    ]
    for r in results["rows"]:
        cells = " | ".join(_fmt(r["tokens_per_s"].get(m), ".2f") for m in labels)
        lines.append(f"| {r['context']:,} | {cells} | {_fmt(r['sa_vs_plain'], '.2f', 'x')} "
                     f"| {_fmt(r['sa_vs_hf_pld'], '.2f', 'x')} "
                     f"| {'yes' if r['sa_identical'] else '**no**'} |")
    lines += ["", "Goals (issue 12):", *goal_lines(results)]
    recompiled = [f"{harness.LABELS[m]} at {r['context']}" for r in results["rows"]
                  for m, n in r["compiles_timed"].items() if n]
    if recompiled:
        lines += ["", "**Compilations inside timed passes** (their step times include them): "
                  + ", ".join(recompiled) + "."]
    mismatches = [(r["context"], x) for r in results["rows"] for x in r["mismatches"]]
    if mismatches:
        lines += ["", "**Token mismatches** (method vs reference, first differing token): "
                  + "; ".join(f"{harness.LABELS[x['method']]} vs {harness.LABELS[x['reference']]}"
                              f" at {c} tokens, token {x['position']} ({x['when']})"
                              for c, x in mismatches)]
    if plot is not None:
        rel = os.path.relpath(plot, report.BENCHMARKS_MD.parent)
        lines += ["", f"![decode step time vs context length]({rel})"]
    return "\n".join(lines)


def plot_step_times(results: dict, path: pathlib.Path) -> pathlib.Path:
    """`benchmarks.plots.step_time_vs_context` of this run's jaxspec and HF greedy step times."""
    from benchmarks import plots

    k = results["max_draft_len"]
    per_token = "jaxspec SA, per committed token"
    step_ms = {"jaxspec plain": [r["step_ms"]["plain"] for r in results["rows"]],
               "jaxspec SA": [r["step_ms"]["sa"] for r in results["rows"]],
               per_token: [r["sa_ms_per_token"] for r in results["rows"]],
               f"jaxspec K={k} verify": [r["step_ms"]["oracle"] for r in results["rows"]],
               "HF greedy": [r["step_ms"]["hf_greedy"] for r in results["rows"]]}
    return plots.step_time_vs_context(results["contexts"], step_ms, path,
                                      title=f"batch 1, decode step time (K={k})",
                                      dashed=(per_token,))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.context_sweep",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--contexts", default=",".join(map(str, CONTEXTS)),
                        help="prompt lengths in tokens, chat template included (at most 8192 "
                             "with the new tokens)")
    parser.add_argument("--source", default="module", choices=SOURCES)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--max-draft-len", type=int, default=engine_lib.DEFAULT_DRAFT_LEN)
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds")
    parser.add_argument("--plots", type=pathlib.Path, default=None,
                        help="write context_step_time.png into this folder")
    parser.add_argument("--no-hf", action="store_true", help="leave the HF baseline out")
    parser.add_argument("--write", action="store_true", help="update BENCHMARKS.md")
    parser.add_argument("--no-progress", action="store_true")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        contexts = tuple(int(c) for c in args.contexts.split(","))
    except ValueError:
        parser.error(f"--contexts must be comma-separated ints, got {args.contexts!r}")
    from jaxspec import models

    start, load_start = time.perf_counter(), runs.load_average()
    model, tokenizer = models.load(None)
    hf = None
    reason = "HF baseline skipped: --no-hf" if args.no_hf else hf_baseline.unavailable_reason()
    if reason:
        print(reason, file=sys.stderr)
    else:
        hf = hf_baseline.HFModel.load()
    results = sweep(model, tokenizer, hf=hf, contexts=contexts, source=args.source,
                    max_new_tokens=args.max_new_tokens, max_draft_len=args.max_draft_len,
                    repeats=args.repeats, progress=not args.no_progress)
    results.update(load_average=[load_start, runs.load_average()],
                   elapsed_s=time.perf_counter() - start)
    plot = (None if args.plots is None
            else plot_step_times(results, args.plots / "context_step_time.png"))
    report.publish(SECTION, markdown(results, plot=plot), module="benchmarks.context_sweep",
                   argv=argv, write=args.write)
    print(f"\n[{results['elapsed_s']:.0f} s; numbers from a shared machine are noisy]",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
