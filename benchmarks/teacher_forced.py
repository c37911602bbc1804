"""Teacher-forced divergence: every position computed by a plain step and by a verify step from
the same tokens, and the two logit vectors compared (issue 33).

    python -m benchmarks.teacher_forced --model tiny --k 4 --max-new-tokens 32
    python -m benchmarks.teacher_forced --model smollm2 --dtypes float32,bfloat16 --json

Speculative greedy output can part from plain greedy output although verification is exact: a
verify step computes 1 + K query rows per request and a plain step one, in other floating-point
orders. Comparing two free-running outputs shows where they part, not how far apart the logits
were all along (after the first split the two texts differ). Teacher forcing keeps the inputs
identical. For each prompt:

1. prefill, then decode greedily with the plain step (K=0) for `max_new_tokens` positions,
   keeping the logits at each;
2. from a copy of the same prefilled state, run verify steps over plain's own tokens: the step
   for positions p .. p + K feeds plain's generated token p as its last token and tokens
   p + 1 .. p + K as drafts, and the host advances the cached length by K + 1 whatever was
   accepted (KV rollback is a length reset, kv_cache.py); the last window's unused drafts are
   padding, its logits there unread;
3. compare position by position: bitwise equality of the two float32 logit vectors, the largest
   |difference|, whether the argmax differs and, where it does, the plain logits' top-2 margin
   (a near tie that rounding flipped has a margin of a few ulps of the logit scale).

Position i is the logits after feeding generated token i (token 0 comes from the prefill), so
the argmax of plain's logits at i is generated token i + 1.
"""

import argparse
import json
import sys

import numpy as np

DTYPES = ("float32", "bfloat16")
PREFILL_BUCKET = 64     # prompts padded to a multiple: one compilation for a report's prompts


def _greedy(rows: int):
    from jaxspec.device import sampling

    return sampling.SamplingArrays(temperature=np.zeros(rows, np.float32),
                                   top_k=np.zeros(rows, np.int32),
                                   top_p=np.ones(rows, np.float32), seed=np.zeros(rows, np.int32))


def logits(model, prompt, *, k: int, max_new_tokens: int, numerics: str = "fast",
           implementation: str | None = None, page_size: int = 16,
           prefill_width: int | None = None) -> tuple[list[int], np.ndarray, np.ndarray]:
    """One prompt's plain and teacher-forced verify logits.

    `prefill_width` (>= the prompt's length; default the length) pads the prefill's tokens and
    sizes the page table: prompts of one width share one compilation of each entry point.

    Returns:
      (generated tokens i32[max_new_tokens + 1] of plain greedy decoding, plain logits
      f32[max_new_tokens, V], verify logits f32[max_new_tokens, V]); row i is the logits after
      feeding generated token i.
    """
    from flax import nnx
    import jax
    import jax.numpy as jnp

    from jaxspec.device import kv_cache
    from jaxspec.device import step as step_lib

    graphdef, params = nnx.split(model)
    graphdef, params = step_lib.canonical_graphdef(graphdef), step_lib.weights(params)
    plain_cfg = step_lib.canonical(step_lib.StepConfig(
        graphdef=graphdef, k=0, logits=True, implementation=implementation))
    verify_cfg = step_lib.canonical(step_lib.StepConfig(
        graphdef=graphdef, k=k, draft_source="host", logits=True, implementation=implementation))
    spec, n, greedy = model.cache_spec, len(prompt), _greedy(1)
    width = n if prefill_width is None else prefill_width
    if width < n:
        raise ValueError(f"prefill_width {width} is shorter than the prompt ({n} tokens)")
    cols = -(-(width + max_new_tokens + k + 1) // page_size)
    table = np.arange(1, cols + 1, dtype=np.int32)[None]

    def view(length: int, num_new: int) -> kv_cache.CacheView:
        return kv_cache.CacheView(page_table=table, lengths=np.asarray([length], np.int32),
                                  num_new=np.asarray([num_new], np.int32),
                                  implementation=implementation, numerics=numerics)

    def inputs(fed: list[int], length: int, span: int) -> step_lib.StepInputs:
        """A step over `span` = 1 + K positions feeding `fed` (padded with zero drafts)."""
        drafts = np.zeros((1, span - 1), np.int32)
        drafts[0, :len(fed) - 1] = fed[1:]
        return step_lib.StepInputs(
            last_tokens=np.asarray(fed[:1], np.int32), drafts=drafts,
            draft_lens=np.asarray([len(fed) - 1], np.int32), view=view(length, span),
            sampling=greedy, slots=np.zeros(1, np.int32))

    kv = kv_cache.init_pages(num_layers=spec.num_layers, num_pages=cols + 1, page_size=page_size,
                             num_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim,
                             dtype=spec.dtype)
    padded = np.zeros((1, width), np.int32)
    padded[0, :n] = prompt
    state, first, _ = step_lib.prefill(params, step_lib.init_state(kv), padded, view(0, n),
                                       greedy, cfg=plain_cfg)
    # The steps donate the state: the verify run starts from a copy of the prefilled one.
    prefilled = jax.tree.map(jnp.copy, state)
    tokens, plain = [int(first[0])], []
    for i in range(max_new_tokens):
        state, out = step_lib.step(params, state, inputs(tokens[-1:], n + i, 1), cfg=plain_cfg)
        plain.append(np.asarray(out.logits[0, 0]))
        tokens.append(int(out.new_tokens[0, 0]))

    state = prefilled
    verify = np.empty((max_new_tokens, model.vocab_size), np.float32)
    for start in range(0, max_new_tokens, k + 1):
        fed = tokens[start:min(start + k + 1, max_new_tokens)]
        state, out = step_lib.step(params, state, inputs(fed, n + start, k + 1), cfg=verify_cfg)
        verify[start:start + len(fed)] = np.asarray(out.logits[0, :len(fed)])
    return tokens, np.stack(plain), verify


def compare(plain: np.ndarray, verify: np.ndarray, *, k: int) -> dict:
    """Position by position, plain logits f32[N, V] against verify logits f32[N, V] computed in
    windows of K + 1 positions (window w holds positions w(K+1) .. w(K+1) + K).

    Returns:
      a JSON-ready dict: positions, verify_steps, not_bitwise_equal (positions whose vectors
      differ in any bit), max_abs_diff, max_abs_diff_by_window_index (K + 1 values: the row of
      the verify step the position sat in), argmax_flips (count) and flips ([{position, window:
      [step, index], plain_token, verify_token, plain_top (plain's top logit), plain_margin,
      verify_margin}]), min_plain_margin
      (the closest plain top-2 at any position), and per position max_abs_diff and
      bitwise_equal.
    """
    if plain.shape != verify.shape or plain.ndim != 2:
        raise ValueError(f"logits must be two equal [N, V] arrays, got {plain.shape} and "
                         f"{verify.shape}")
    plain, verify = plain.astype(np.float32), verify.astype(np.float32)
    n = plain.shape[0]
    equal = np.all(plain.view(np.uint32) == verify.view(np.uint32), axis=-1)
    diff = np.abs(plain - verify).max(axis=-1) if n else np.zeros(0, np.float32)
    plain_top, verify_top = np.argmax(plain, axis=-1), np.argmax(verify, axis=-1)
    plain_margin, verify_margin = _margins(plain), _margins(verify)
    index = np.arange(n) % (k + 1)
    flips = [dict(position=int(p), window=[int(p) // (k + 1), int(index[p])],
                  plain_token=int(plain_top[p]), verify_token=int(verify_top[p]),
                  plain_top=float(plain[p, plain_top[p]]), plain_margin=float(plain_margin[p]),
                  verify_margin=float(verify_margin[p]))
             for p in np.nonzero(plain_top != verify_top)[0]]
    return dict(positions=n, verify_steps=-(-n // (k + 1)), not_bitwise_equal=int(n - equal.sum()),
                max_abs_diff=float(diff.max(initial=0.0)),
                max_abs_diff_by_window_index=[float(diff[index == j].max(initial=0.0))
                                              for j in range(k + 1)],
                argmax_flips=len(flips), flips=flips,
                min_plain_margin=float(plain_margin.min(initial=np.inf)),
                max_abs_diff_per_position=[float(x) for x in diff],
                bitwise_equal=[bool(x) for x in equal])


def _margins(x: np.ndarray) -> np.ndarray:
    """Top-1 minus top-2 logit per row."""
    if x.shape[-1] < 2:
        return np.full(x.shape[:-1], np.inf, np.float32)
    top2 = np.partition(x, -2, axis=-1)[..., -2:]
    return top2[..., 1] - top2[..., 0]


def teacher_forced(model, prompts, *, k: int, max_new_tokens: int, numerics: str = "fast",
                   implementation: str | None = None, page_size: int = 16) -> dict:
    """The teacher-forced comparison of plain and verify logits on every prompt (module doc).

    Args:
      model: a `CausalLM` in the dtype to measure (`jaxspec.models.precision.cast`).
      prompts: token id lists.
      k: drafts per verify step (>= 1).
      max_new_tokens: plain greedy positions per prompt (>= 1), each compared.
      numerics: the cache view's numerics, "fast" or "exact".
      implementation: attention's kernels ("pallas", "xla" or None: Pallas on GPU).
      page_size: KV page size.

    Returns:
      a JSON-ready dict: the settings, "prompts" (per prompt `compare`'s dict plus its tokens)
      and "totals" (positions, verify_steps, not_bitwise_equal, argmax_flips, max_abs_diff,
      max_abs_diff_by_window_index, min_flip_margin: the smallest plain margin at a flip).

    Raises:
      ValueError: k < 1, max_new_tokens < 1, no prompts or an empty one, or an unknown numerics.
    """
    if k < 1 or max_new_tokens < 1:
        raise ValueError(f"k and max_new_tokens must be >= 1, got {k} and {max_new_tokens}")
    if not prompts or not all(len(p) for p in prompts):
        raise ValueError("teacher_forced needs at least one prompt, none of them empty")
    if numerics not in ("fast", "exact"):
        raise ValueError(f"numerics must be 'fast' or 'exact', got {numerics!r}")
    rows = []
    width = -(-max(len(p) for p in prompts) // PREFILL_BUCKET) * PREFILL_BUCKET
    for prompt in prompts:
        tokens, plain, verify = logits(model, list(prompt), k=k, max_new_tokens=max_new_tokens,
                                       numerics=numerics, implementation=implementation,
                                       page_size=page_size, prefill_width=width)
        rows.append(dict(prompt_tokens=len(prompt), tokens=tokens,
                         **compare(plain, verify, k=k)))
    flips = [f for r in rows for f in r["flips"]]
    totals = dict(
        prompts=len(rows), positions=sum(r["positions"] for r in rows),
        verify_steps=sum(r["verify_steps"] for r in rows),
        not_bitwise_equal=sum(r["not_bitwise_equal"] for r in rows),
        argmax_flips=len(flips), max_abs_diff=max(r["max_abs_diff"] for r in rows),
        max_abs_diff_by_window_index=[max(r["max_abs_diff_by_window_index"][j] for r in rows)
                                      for j in range(k + 1)],
        min_flip_margin=min((f["plain_margin"] for f in flips), default=None))
    return dict(k=k, max_new_tokens=max_new_tokens, numerics=numerics,
                implementation=implementation, dtype=str(model.dtype), prompts=rows,
                totals=totals)


def markdown_rows(model_name: str, reports: list[dict]) -> list[str]:
    """Table rows (`MARKDOWN_HEADER`'s columns), one per report."""
    lines = []
    for r in reports:
        t = r["totals"]
        margin = "–" if t["min_flip_margin"] is None else f"{t['min_flip_margin']:.3g}"
        by_index = " / ".join(f"{x:.2g}" for x in t["max_abs_diff_by_window_index"])
        lines.append(f"| {model_name} | {r['dtype']} | {r['numerics']} | {r['k']} | "
                     f"{t['positions']} | {t['not_bitwise_equal']} | {t['max_abs_diff']:.3g} | "
                     f"{by_index} | {t['argmax_flips']} | {margin} |")
    return lines


MARKDOWN_HEADER = [
    "| model | dtype | numerics | K | positions | not bitwise equal | max \\|diff\\| "
    "| max \\|diff\\| by window row 0 / ... / K | argmax flips | smallest flip margin |",
    "| --- | --- | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: |"]


def random_prompts(vocab_size: int, lengths, seed: int = 0) -> list[list[int]]:
    """Prompts of the given lengths, uniform over the vocabulary (the tiny model's)."""
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(0, vocab_size, n)] for n in lengths]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.teacher_forced",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tiny", choices=("tiny", "smollm2"))
    parser.add_argument("--workload", default="code_editing", help="smollm2's prompts")
    parser.add_argument("--n", type=int, default=2, help="prompts")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--dtypes", default="float32")
    parser.add_argument("--numerics", default="fast", choices=("fast", "exact"))
    parser.add_argument("--implementation", default=None, choices=("pallas", "xla"))
    parser.add_argument("--json", action="store_true", help="print the reports as JSON")
    args = parser.parse_args(argv)
    from jaxspec.models import precision

    if args.model == "tiny":
        from jaxspec.models import tiny

        model = tiny.tiny_model(seed=0)
        prompts = random_prompts(model.vocab_size, [9, 13, 7, 11][:args.n])
    else:
        from benchmarks import chat_prompts
        from benchmarks import workloads
        from jaxspec import models

        model, tokenizer = models.load(None, dtype="float32")
        prompts = chat_prompts.prompt_ids(model, tokenizer,
                                          workloads.load(args.workload, args.n),
                                          max_new_tokens=args.max_new_tokens)
    reports = [teacher_forced(precision.cast(model, dtype), prompts, k=args.k,
                              max_new_tokens=args.max_new_tokens, numerics=args.numerics,
                              implementation=args.implementation)
               for dtype in args.dtypes.split(",")]
    if args.json:
        print(json.dumps(reports))
    else:
        print("\n".join(MARKDOWN_HEADER + markdown_rows(args.model, reports)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
