"""`jaxspec generate` and `jaxspec profile`.

    jaxspec generate --prompt "Write a haiku about JAX" --max-new-tokens 64
    jaxspec generate --prompt-file edit.txt --spec sa --max-draft-len 5 --json
    jaxspec generate --batch-file prompts.txt --spec auto        # one prompt per line, one batch
    jaxspec profile                    # measure the step-cost model adaptive K decides with
    jaxspec profile --show             # print it as measured so far

The benchmarks live in a source checkout, not in the package: `python -m benchmarks.harness`.
"""

import argparse
import json
import sys

from jaxspec import engine as engine_lib
from jaxspec.host import compiles


def _add_generate(sub):
    p = sub.add_parser("generate", help="generate text (streams to stdout)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="the prompt text")
    src.add_argument("--prompt-file", help="a file holding the prompt text")
    src.add_argument("--batch-file", help="one prompt per line, run as one continuous batch")
    p.add_argument("--model", default=None,
                   help="a .gguf file or HF-layout directory (default: embedded SmolLM2-135M)")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--spec", choices=engine_lib.SPEC_NAMES, default="auto",
                   help="speculation method (default: auto)")
    p.add_argument("--max-draft-len", type=int, default=None,
                   help=f"draft tokens per step for sa/ngram "
                        f"(default {engine_lib.DEFAULT_DRAFT_LEN})")
    p.add_argument("--max-seq-len", type=int, default=2048)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default=None,
                   help="weights and activations (default: float32 on CPU, bfloat16 on GPU)")
    p.add_argument("--kv-dtype", choices=("float32", "bfloat16"), default=None,
                   help="the KV cache (default: as --dtype)")
    p.add_argument("--mesh", default=None, metavar="data=D,model=M",
                   help="run over D x M devices: batch rows over data, weights and KV heads "
                        "over model")
    p.add_argument("--numerics", choices=("exact", "fast"), default=None,
                   help="exact: speculative greedy output is bit for bit plain greedy output, "
                        "whatever the batch; fast: XLA's own choices (default: exact on GPU, "
                        "fast on CPU)")
    p.add_argument("--max-batch-size", type=int, default=None,
                   help="concurrent requests (default: the number of prompts, at most 8, rounded "
                        "up to a multiple of the mesh's data size); AUTO picks its draft "
                        "length from it")
    p.add_argument("--raw", action="store_true", help="do not apply the chat template")
    p.add_argument("--json", action="store_true",
                   help='print {"token_ids", "text", "stats"} instead of streaming')
    p.add_argument("--compile-cache", default=str(compiles.default_cache_dir()),
                   help="persistent XLA compilation cache directory ('' disables it)")


def _add_profile(sub):
    p = sub.add_parser("profile", help="measure (or --show) the step-cost model of adaptive K")
    p.add_argument("--model", default=None,
                   help="a .gguf file or HF-layout directory (default: embedded SmolLM2-135M)")
    p.add_argument("--batch-sizes", default="1,2,4,8", help="batch buckets to measure")
    p.add_argument("--widths", default=None,
                   help="draft widths K to measure (default: every width adaptive K may use)")
    p.add_argument("--contexts", default="512,2048", help="cached tokens per row")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--show", action="store_true", help="print the model, measure nothing")
    p.add_argument("--compile-cache", default=str(compiles.default_cache_dir()),
                   help="persistent XLA compilation cache directory ('' disables it)")


def parse_mesh(text: str) -> tuple[int, int]:
    """`data=D,model=M` -> (D, M).

    Raises:
      ValueError: `text` is not of that form.
    """
    try:
        parts = dict(item.split("=", 1) for item in text.split(","))
        data, model = int(parts.pop("data")), int(parts.pop("model"))
    except (ValueError, KeyError):
        raise ValueError(f"--mesh takes data=D,model=M, got {text!r}") from None
    if parts:
        raise ValueError(f"--mesh takes data=D,model=M, got {text!r}")
    return data, model


def _mesh(text: str | None):
    """A mesh over the first D * M devices (None stays None)."""
    if text is None:
        return None
    from jaxspec.device import sharding

    return sharding.make_mesh(*parse_mesh(text))


def _ints(text: str, name: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--{name} takes comma-separated integers, got {text!r}") from None
    if not values or min(values) < 0:
        raise ValueError(f"--{name} takes non-negative integers, got {text!r}")
    return values


def _profile(args) -> int:
    from jaxspec import config as config_lib
    from jaxspec import models
    from jaxspec.host import adaptive
    from jaxspec.host import cost_model
    from jaxspec.host import profile

    widths = (_ints(args.widths, "widths") if args.widths
              else list(adaptive.widths_up_to(config_lib.ADAPTIVE_MAX_DRAFT_LEN)))
    batch_sizes = _ints(args.batch_sizes, "batch-sizes")
    contexts = _ints(args.contexts, "contexts")
    compiles.enable_persistent_cache(args.compile_cache)
    model, _ = models.load(args.model)
    path = cost_model.default_path(cost_model.model_key(model))
    costs = cost_model.StepCostModel(path)
    if not args.show:
        profile.profile(model, costs, batch_sizes=batch_sizes, widths=widths, contexts=contexts,
                        repeats=args.repeats)
    print(f"Step-cost model ({path}):\n")
    print(profile.format_table(costs))
    return 0


def _read_prompts(args) -> list[str]:
    if args.prompt is not None:
        return [args.prompt]
    path = args.prompt_file or args.batch_file
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"prompt file not found: {path}") from None
    if args.prompt_file:
        return [text]
    return [line for line in text.splitlines() if line.strip()]


def _summary_line(stats: dict) -> str:
    """Steady-state speed apart from the iterations that compiled (first calls), so a cold start
    does not read as the engine's speed."""
    parts = [f"{stats['generated_tokens']} tokens in {stats['wall_time_s']:.2f}s"]
    if stats.get("first_call_time_s"):
        parts.append(f"first calls (compilation included) {stats['first_call_time_s']:.2f}s")
    steady = stats.get("steady_tokens_per_s")
    parts.append(f"steady {steady} tok/s" if steady is not None
                 else f"{stats['tokens_per_s']} tok/s")
    if stats.get("mean_acceptance_length") is not None and stats.get("spec_steps"):
        parts.append(f"mean acceptance length {stats['mean_acceptance_length']:.2f}")
        parts.append(f"acceptance rate {stats['acceptance_rate']}")
    return "[jaxspec] " + ", ".join(parts)


def _generate(args) -> int:
    from jaxspec.host import requests as requests_lib
    from jaxspec.host import scheduler as scheduler_lib

    prompts = _read_prompts(args)
    params = requests_lib.SamplingParams(
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
        top_p=args.top_p, seed=args.seed)
    spec = engine_lib.spec_from_name(args.spec, args.max_draft_len)
    compiles.enable_persistent_cache(args.compile_cache)
    mesh = _mesh(args.mesh)
    batch = args.max_batch_size or min(len(prompts), 8)
    if mesh is not None and args.max_batch_size is None:
        data = mesh.shape["data"]
        batch = -(-batch // data) * data            # every data shard gets its rows
    engine = engine_lib.Engine.load(
        args.model, spec=spec, dtype=args.dtype, kv_dtype=args.kv_dtype, mesh=mesh,
        numerics=args.numerics, compile_cache=args.compile_cache,
        scheduler=scheduler_lib.SchedulerConfig(max_batch_size=batch,
                                                max_seq_len=args.max_seq_len))
    chat = not args.raw
    if args.json or len(prompts) > 1:
        result = engine.generate_batch(prompts, params=params, chat=chat)
        if args.json:
            gens = [{"token_ids": g.token_ids, "text": g.text, "finish_reason": g.finish_reason,
                     "stats": g.stats} for g in result.generations]
            out = ({"generations": gens, "stats": result.stats} if args.batch_file
                   else {**gens[0], "stats": {**result.stats, **gens[0]["stats"]}})
            print(json.dumps(out))
            return 0
        for i, g in enumerate(result.generations):
            print(f"--- prompt {i} ({g.finish_reason}) ---\n{g.text}")
        print(_summary_line(result.stats), file=sys.stderr)
        return 0
    for piece in engine.stream(prompts[0], params=params, chat=chat):
        print(piece, end="", flush=True)
    print()
    print(_summary_line(engine.last_stats), file=sys.stderr)
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="jaxspec", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    _add_generate(sub)
    _add_profile(sub)
    args = parser.parse_args(argv)
    try:
        return _profile(args) if args.command == "profile" else _generate(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"jaxspec: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
