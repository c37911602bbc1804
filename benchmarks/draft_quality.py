"""Tokens per verify step of each way of drafting from text already seen, against the copy bound,
teacher-forced over plain greedy output (issue 34).

    python -m benchmarks.draft_quality                              # every workload below
    python -m benchmarks.draft_quality --workloads code_editing --n 8 --json

For each prompt, plain greedy decoding gives the reply; then each drafter walks it as the engine
would at a fixed width: a step drafts from the prompt and the reply so far, the target accepts the
longest drafted path that the reply continues with (verification is exact, so the reply is what
any lossless method outputs) and commits one bonus token after it. Nothing is timed: the figures
are what the engine's verify steps would commit, without its adaptive width, without noise.

Drafters:
  first          the first occurrence of the longest earlier suffix (TensorRT-LLM's semantics, the
                 device automaton), K tokens.
  frequent       `SAConfig(selection="frequent")`: the best-scoring continuation over every
                 suffix length (`jaxspec.host.frequent.frequent_draft`), K tokens.
  tree N         the N most probable continuations as a tree (`frequent.frequent_tree`): the
                 step accepts the deepest node the reply follows; a path may be up to N deep.
  copy bound K   the longest prefix of the reply's continuation found anywhere in the text
                 (`benchmarks.oracle.copy_bound`): the best any single copied draft of K can do.

The engine verifies trees as `SAConfig(selection="frequent", tree_budget=N)` with the drafter and
acceptance rule above (the harness's `sa_tree` times them); its adaptive width may cut a tree
short, which the fixed budgets here do not.
"""

import argparse
import json
import sys

import numpy as np

from benchmarks import chat_prompts
from benchmarks import oracle
from benchmarks import report
from benchmarks import workloads
from jaxspec.host import frequent
from jaxspec.host import sa_reference

WORKLOADS = {"code_editing": 8, "agentic": 4, "translation": 4, "document_qa": 2,
             "humaneval": 4, "mtbench": 4}
TREE_BUDGETS = (16, 32, 64)
GOAL_FREQUENT, GOAL_TREE = 6.5, 7.5       # code editing: frequent at K=16, a tree of 32


def _path_index(tokens: list[int], parents: list[int]) -> dict[tuple[int, int], int]:
    return {(p, t): i for i, (t, p) in enumerate(zip(tokens, parents, strict=True))}


def accepted_steps(prompt, output, draft, room_cap: int | None = None) -> list[int]:
    """Accepted drafts of each verify step over `output` (decoding starts after its first token,
    the prefill's), `draft(text, room)` returning a tree `(tokens, parents)` drafted after
    `text` (a linear draft: parents 0..n-2 after -1); `room_cap` caps a step's drafts."""
    steps, done = [], 1
    while done < len(output):
        room = len(output) - done - 1
        if room_cap is not None:
            room = min(room, room_cap)
        tokens, parents = draft([*prompt, *output[:done]], room) if room > 0 else ([], [])
        children = _path_index(tokens, parents)
        node, a = -1, 0
        while a < room and (node, output[done + a]) in children:
            node = children[(node, output[done + a])]
            a += 1
        steps.append(a)
        done += a + 1
    return steps


def _linear(draft: list[int]) -> tuple[list[int], list[int]]:
    return draft, list(range(-1, len(draft) - 1))


def _joined(text) -> tuple[np.ndarray, int]:
    return np.asarray([*text, frequent.SEPARATOR], np.int64), len(text)


class FirstOccurrence:
    """The automaton's drafts for one growing text, extended incrementally."""

    def __init__(self, k: int):
        self.k = k
        self.automaton = sa_reference.SuffixAutomaton()
        self.length = 0

    def __call__(self, text, room):
        for token in text[self.length:]:
            self.automaton.extend(token)
        self.length = len(text)
        return _linear(self.automaton.draft(min(self.k, room))[1])


def drafters(k: int) -> dict[str, callable]:
    """Name -> a factory of one prompt's drafter."""
    out = {f"first K={k}": lambda: FirstOccurrence(k),
           f"frequent K={k}": lambda: lambda text, room: _linear(frequent.frequent_draft(
               *_joined(text), min(k, room))[0])}
    for n in TREE_BUDGETS:
        out[f"tree {n}"] = lambda n=n: lambda text, room: frequent.frequent_tree(
            *_joined(text), n)[:2]
    return out


def per_step(pairs, k: int) -> dict[str, float]:
    """Tokens per verify step (bonus included) of every drafter and the copy bounds, pooled over
    the `(prompt, output)` pairs."""
    def tokens(steps):
        return 1 + float(np.mean(steps)) if steps else 1.0

    columns = {name: tokens([a for p, o in pairs for a in accepted_steps(p, o, factory())])
               for name, factory in drafters(k).items()}
    for bound in (k, 2 * k):
        columns[f"copy bound K={bound}"] = tokens(
            [a for p, o in pairs for a in oracle.copy_bound(p, o, bound)])
    return columns


def plain_outputs(model, tokenizer, workload: str, n: int, max_new_tokens: int):
    """(prompt, plain greedy reply) of the workload's first `n` conversations."""
    from jaxspec import engine as engine_lib

    prompts = chat_prompts.prompt_ids(model, tokenizer, workloads.load(workload, n),
                                      max_new_tokens=max_new_tokens, batch_size=4)
    engine = engine_lib.Engine(model, tokenizer, spec=None)
    out = engine.generate_batch(prompts, max_new_tokens=max_new_tokens)
    return [(p, g.token_ids) for p, g in zip(prompts, out.generations, strict=True)]


def markdown(results: dict, *, k: int, max_new_tokens: int) -> str:
    names = list(next(iter(results.values()))["columns"])
    lines = [f"Teacher-forced over plain greedy replies of at most {max_new_tokens} tokens "
             f"(SmolLM2, float32): tokens per verify step, bonus included, at a fixed width (no "
             f"adaptive K). Trees: a budget of N nodes, up to N deep, what "
             f"`SAConfig(tree_budget=N)` verifies at that width.", "",
             "| workload | prompts | " + " | ".join(names) + " |",
             "| --- | ---: |" + " ---: |" * len(names)]
    for workload, r in results.items():
        lines.append(f"| {workload} | {r['prompts']} | "
                     + " | ".join(f"{r['columns'][c]:.2f}" for c in names) + " |")
    editing = results.get("code_editing")
    if editing:
        cols = editing["columns"]
        mark = lambda ok: "met" if ok else "NOT met"  # noqa: E731
        got_f, got_t = cols[f"frequent K={k}"], cols.get("tree 32")
        lines += ["", f"- code editing, frequent at K={k}: {got_f:.2f} tokens a step (goal >= "
                  f"{GOAL_FREQUENT}: {mark(got_f >= GOAL_FREQUENT)})"]
        if got_t is not None:
            lines.append(f"- code editing, tree of 32: {got_t:.2f} tokens a step (goal >= "
                         f"{GOAL_TREE}: {mark(got_t >= GOAL_TREE)})")
    return "\n".join(lines) + "\n"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.draft_quality",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--n", type=int, default=None,
                        help="prompts per workload (default: 8 for code editing, else 4 or 2)")
    parser.add_argument("--max-new-tokens", type=int, default=192)
    parser.add_argument("--k", type=int, default=16, help="the linear drafts' width")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--write", action="store_true",
                        help="update the draft_quality section of BENCHMARKS.md")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    if (args.n is not None and args.n < 1) or args.k < 1 or args.max_new_tokens < 2:
        print("bad arguments: --n and --k must be >= 1, --max-new-tokens >= 2", file=sys.stderr)
        return 2
    import tqdm

    from jaxspec import models

    model, tokenizer = models.load(None)
    results = {}
    names = args.workloads.split(",")
    for name in tqdm.tqdm(names, unit="workload", file=sys.stderr):
        try:
            pairs = plain_outputs(model, tokenizer, name, args.n or WORKLOADS.get(name, 4),
                                  args.max_new_tokens)
        except workloads.WorkloadUnavailable as e:
            print(f"skipped {name}: {e}", file=sys.stderr)
            continue
        results[name] = {"prompts": len(pairs), "columns": per_step(pairs, args.k)}
    text = markdown(results, k=args.k, max_new_tokens=args.max_new_tokens)
    if args.json:
        print(json.dumps(results))
        print(text, file=sys.stderr)
    report.publish("draft_quality", text, module="benchmarks.draft_quality", argv=argv,
                   write=args.write, show=not args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
