"""What this backend's kernels allow a decode step: the model's projections on a few rows and
cached attention, each beside a streaming read of the same bytes, and the steps they make up.

A verify step of width K runs every projection on 1 + K rows per request and attends for 1 + K
tokens. A plain step (1 row) only has to read the weights once, and so would a verify step of a few
rows if the matmul read each weight once. The first table times the projections of every layer
of the embedded model (its four matmuls: fused q/k/v, o, fused gate/up, down; attention and norms
left out, the model's own weights) on 1 to 17 rows, beside a reduction that reads every weight
once. The second times, at several contexts, the real jitted step (plain and K = 5,
`jaxspec.host.profile`) and `attention.cached_attention` (the XLA path every CPU step runs) over
every layer for 1 and 1 + K tokens, beside a reduction over the same live K and V slots. The
verify step's extra time over the plain step is then split into what the projections on 1 + K
rows and the cached attention for 1 + K tokens add.
"""

import argparse
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import report

SECTION = "step_floor"
ROWS = (1, 2, 3, 6, 9, 17)
CONTEXTS = (1024, 4096, 8000)
VERIFY_K = 5
PAGE_SIZE = 16
PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
# Keeps the chained residual stream finite over every layer (its values do not change the time).
RESIDUAL_SCALE = 1e-3


def _median_seconds(fn, *args, repeats: int) -> float:
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@jax.jit
def projections(kernels, x):
    """Every layer's projections on x f32[R, D], chained as a decoder layer chains them."""
    keys = jnp.zeros((), x.dtype)
    for qkv, o, gate_up, down in kernels:
        groups = qkv.shape[2] - 2
        qkv_x = jnp.tensordot(x, qkv, axes=1)                     # [R, Hkv, G + 2, hd]
        keys = keys + jnp.sum(qkv_x[:, :, groups:])
        x = x + RESIDUAL_SCALE * (qkv_x[:, :, :groups].reshape(len(x), -1) @ o)
        gate_up_x = jnp.tensordot(x, gate_up, axes=1)             # [R, 2, I]
        x = x + RESIDUAL_SCALE * ((jax.nn.silu(gate_up_x[:, 0]) * gate_up_x[:, 1]) @ down)
    return x, keys


@jax.jit
def read_all(arrays):
    """Reads every array once (the streaming rate's reference)."""
    return sum(jnp.sum(a) for a in jax.tree.leaves(arrays))


def layer_kernels(model) -> list[tuple[jax.Array, ...]]:
    return [tuple(getattr(layer, name).kernel[...] for name in PROJECTIONS)
            for layer in model.layers]


def measure_projections(model, rows=ROWS, *, repeats: int) -> dict:
    kernels = layer_kernels(model)
    nbytes = sum(w.size * w.dtype.itemsize for layer in kernels for w in layer)
    dim = kernels[0][0].shape[0]
    seconds = {}
    for r in rows:
        x = jnp.asarray(np.random.default_rng(r).standard_normal((r, dim)), kernels[0][0].dtype)
        seconds[r] = _median_seconds(projections, kernels, x, repeats=repeats)
    return dict(bytes=nbytes, seconds=seconds,
                read_s=_median_seconds(read_all, kernels, repeats=repeats))


def measure_attention(spec, contexts=CONTEXTS, *, k: int = VERIFY_K, repeats: int) -> dict:
    """`cached_attention` over `spec.num_layers` layers for 1 and 1 + k new tokens, and a read of
    the same live K and V slots, at each context."""
    from jaxspec.device import attention

    hkv, groups, d = spec.num_kv_heads, spec.num_heads // spec.num_kv_heads, spec.head_dim
    rows = []
    for context in contexts:
        live = -(-context // PAGE_SIZE)
        # The table of a request this long verifying k drafts, as the engine sizes it
        # (`SchedulerConfig.pages_per_seq`) and `jaxspec.host.profile` times the step.
        cols = -(-(context + 1 + k) // PAGE_SIZE)
        rng = np.random.default_rng(context)
        # Constant pages: the time does not depend on the values, and 8k tokens of random pages
        # took longer to draw than to time.
        shape = (spec.num_layers, cols + 1, PAGE_SIZE, hkv, d)
        k_pages = jnp.full(shape, 0.5, spec.dtype)
        v_pages = jnp.full(shape, -0.5, spec.dtype)
        table = jnp.arange(1, cols + 1, dtype=jnp.int32)[None, :]
        lengths = jnp.full((1,), context, jnp.int32)

        @jax.jit
        def every_layer(q, k_pages, v_pages, table, lengths):
            ppb = attention.pages_per_block(hkv, q.shape[2])
            return [attention.cached_attention(q, k_pages, v_pages, table, lengths, layer=i,
                                               pages_per_block=ppb)
                    for i in range(spec.num_layers)]

        seconds = {}
        for tokens in (1, 1 + k):
            q = jnp.asarray(rng.standard_normal((1, hkv, groups * tokens, d)), jnp.float32)
            seconds[tokens] = _median_seconds(every_layer, q * d ** -0.5, k_pages, v_pages,
                                              table, lengths, repeats=repeats)
        live_k, live_v = k_pages[:, 1:live + 1], v_pages[:, 1:live + 1]
        rows.append(dict(context=context, seconds=seconds,
                         bytes=2 * spec.num_layers * context * hkv * d * k_pages.dtype.itemsize,
                         read_s=_median_seconds(read_all, (live_k, live_v), repeats=repeats)))
    return dict(num_layers=spec.num_layers, rows=rows)


def measure_steps(model, contexts=CONTEXTS, *, k: int = VERIFY_K, repeats: int) -> dict:
    """Median seconds of the jitted step at batch 1, plain and of width k, at each context."""
    from jaxspec.host import cost_model
    from jaxspec.host import profile

    costs = profile.profile(model, cost_model.StepCostModel(None), batch_sizes=(1,),
                            widths=(0, k), contexts=contexts, repeats=repeats, progress=False)
    return {c: {w: costs.measured(1, w, c) for w in (0, k)} for c in contexts}


def markdown(results: dict, repeats: int) -> str:
    proj, att, steps, k = (results["projections"], results["attention"], results["steps"],
                           results["k"])
    base = proj["seconds"][1]
    gb = proj["bytes"] / 1e9
    lines = [
        "## Step floor: projections on a few rows, cached attention, and the steps they make up",
        "",
        f"{results['model']}, batch 1: every layer's projections (fused q/k/v, o, fused "
        f"gate/up, down: {gb:.2f} GB of weights) on R rows (the rows of a verify step of "
        f"K = R - 1); the jitted step, plain and K={k}; `cached_attention` (XLA, the CPU path) "
        "over every layer for 1 and 1 + K tokens; each kernel beside a reduction that reads the "
        f"same bytes once. Medians of {repeats} calls after a compiling one. Each kernel's cost "
        "for 1 + K instead of 1 is part of what a verify step adds to a plain step.",
        "",
        "| rows R | projections ms | weights read GB/s | vs 1 row |",
        "| ---: | ---: | ---: | ---: |",
    ]
    for r, s in proj["seconds"].items():
        lines.append(f"| {r} | {1e3 * s:.2f} | {gb / s:.1f} | {s / base:.2f}x |")
    extra_proj = proj["seconds"][1 + k] - base
    lines += ["", f"Reading every weight once: {1e3 * proj['read_s']:.2f} ms "
              f"({gb / proj['read_s']:.1f} GB/s).", "",
              f"| context | step ms plain | step ms K={k} | verify / plain | verify - plain ms "
              f"| of it: projections on {1 + k} rows | of it: attention for {1 + k} tokens "
              f"| attention ms, 1 token | K+V GB/s, 1 token | streaming read ms "
              "| attention / read |",
              "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row in att["rows"]:
        c, one = row["context"], row["seconds"][1]
        plain, verify = steps[c][0], steps[c][k]
        lines.append(f"| {c:,} | {1e3 * plain:.1f} | {1e3 * verify:.1f} | {verify / plain:.2f}x "
                     f"| {1e3 * (verify - plain):.1f} | {1e3 * extra_proj:.1f} "
                     f"| {1e3 * (row['seconds'][1 + k] - one):.1f} | {1e3 * one:.2f} "
                     f"| {row['bytes'] / 1e9 / one:.1f} | {1e3 * row['read_s']:.2f} "
                     f"| {one / row['read_s']:.1f}x |")
    return "\n".join(lines)


def measure(*, repeats: int) -> dict:
    from jaxspec import models

    model, _ = models.load(None)
    return dict(model="SmolLM2-135M", k=VERIFY_K,
                projections=measure_projections(model, repeats=repeats),
                attention=measure_attention(model.cache_spec, repeats=repeats),
                steps=measure_steps(model, repeats=repeats))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--write", action="store_true", help="update BENCHMARKS.md")
    args = parser.parse_args(argv)
    text = markdown(measure(repeats=args.repeats), args.repeats)
    report.publish(SECTION, text, module="benchmarks.step_floor",
                   argv=sys.argv[1:] if argv is None else argv, write=args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
