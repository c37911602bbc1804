"""Measuring the step-cost model ahead of time (`jaxspec profile`).

The executor learns step times as it runs; profiling fills the model for every (rows bucket,
width, context) a configuration can use before any traffic, so adaptive K decides from
measurements from its first step. Each key is one jitted step compiled once, then timed
`repeats` times with random tokens and drafts (the cost does not depend on the values).
"""

import time

from flax import nnx
import jax
import numpy as np
from tqdm import tqdm

from jaxspec.device import kv_cache
from jaxspec.device import sampling
from jaxspec.device import step as step_lib
from jaxspec.host import cost_model as cost_model_lib


def step_inputs(rows: int, k: int, context: int, page_size: int, cols: int, vocab: int,
                rng, implementation: str | None = None,
                numerics: str = "fast") -> step_lib.StepInputs:
    """A step's batch of random tokens and K host drafts per row, every row `context` tokens
    into a table of `cols` pages."""
    # Every row reads the same pages: the step reads and writes as much as with its own.
    table = np.tile(np.arange(1, cols + 1, dtype=np.int32), (rows, 1))
    return step_lib.StepInputs(
        last_tokens=rng.integers(0, vocab, rows).astype(np.int32),
        drafts=rng.integers(0, vocab, (rows, k)).astype(np.int32),
        draft_lens=np.full((rows,), k, np.int32),
        view=kv_cache.CacheView(page_table=table, lengths=np.full((rows,), context, np.int32),
                                num_new=np.full((rows,), 1 + k, np.int32),
                                implementation=implementation, numerics=numerics),
        sampling=sampling.SamplingArrays(temperature=np.zeros(rows, np.float32),
                                         top_k=np.zeros(rows, np.int32),
                                         top_p=np.ones(rows, np.float32),
                                         seed=np.zeros(rows, np.int32)),
        slots=np.zeros((rows,), np.int32))


def profile(model, costs: cost_model_lib.StepCostModel, *, batch_sizes, widths, contexts,
            repeats: int = 5, page_size: int = 16, progress: bool = True,
            implementation: str | None = None):
    """Times the step at every (rows, width, context) and records the medians in `costs`.

    Args:
      model: the `CausalLM` to profile.
      costs: the model to fill (saved at the end).
      batch_sizes, widths, contexts: the grid; contexts are cached tokens per row.
      repeats: timed calls per key after the compiling one.
      implementation: the attention kernel, "pallas", "xla" or None (Pallas on GPU, XLA
        elsewhere; `jaxspec.device.ops`).

    The KV pages are in the model's dtype (`cache_spec.dtype`), as the executor allocates them.
    """
    graphdef, params = nnx.split(model)
    params = step_lib.weights(params)          # as the executor passes them: timed alike
    spec = model.cache_spec
    cols = -(-(max(contexts) + 1 + max(widths)) // page_size)
    kv = kv_cache.init_pages(num_layers=spec.num_layers, num_pages=cols + 1, page_size=page_size,
                             num_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim,
                             dtype=spec.dtype)
    state = step_lib.init_state(kv)
    rng = np.random.default_rng(0)
    grid = [(r, k, c) for r in batch_sizes for k in widths for c in contexts]
    for rows, k, context in tqdm(grid, desc="profile", disable=not progress):
        cfg = step_lib.canonical(step_lib.StepConfig(graphdef=graphdef, k=k, draft_source="host",
                                                     implementation=implementation))
        inputs = step_inputs(rows, k, context, page_size, cols, model.vocab_size, rng,
                             implementation)
        state, out = step_lib.step(params, state, inputs, cfg=cfg)      # compiles
        jax.block_until_ready(out)
        for _ in range(repeats):
            start = time.perf_counter()
            state, out = step_lib.step(params, state, inputs, cfg=cfg)
            jax.device_get(out)
            costs.observe(rows, k, context, time.perf_counter() - start)
    costs.save()
    return costs


def format_table(costs: cost_model_lib.StepCostModel) -> str:
    """The model as a Markdown table: median ms per step, and each width against K = 0."""
    rows = costs.table()
    plain = {(r, c): t for r, k, c, t, _ in rows if k == 0}
    lines = ["| rows | K | context bucket | step (ms) | vs K=0 | samples |",
             "| ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r, k, c, t, n in rows:
        ratio = f"{t / plain[r, c]:.2f}x" if (r, c) in plain else "–"
        lines.append(f"| {r} | {k} | {c} | {1e3 * t:.1f} | {ratio} | {n} |")
    return "\n".join(lines)
