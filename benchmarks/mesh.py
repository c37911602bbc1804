"""Per-device memory and step time vs mesh shape, on CPU virtual devices: a functional check of
the sharded engine (every device shares the same 2 cores, so the step times say what the mesh
code path costs in bookkeeping and collectives, never what a real mesh would gain).

    python -m benchmarks.mesh --write       # SmolLM2, meshes 1x1 1x3 2x1 2x3 and no mesh

One subprocess with `--xla_force_host_platform_device_count` set to the largest mesh runs every
shape on the same prompts (code_editing, batch 2, plain and SA): per shape the largest per-device
bytes of weights and KV pages (`jaxspec.device.sharding.device_bytes`), the median over repeats
of the mean decode step, and whether the tokens equal those of the engine without a mesh. The
`none` row is today's single-device path; `1x1` is the mesh code path on one device, their ratio
the mesh path's overhead.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

from benchmarks import report
from benchmarks import runs

SECTION = "mesh"
DEFAULT_MESHES = "none,1x1,1x3,2x1,2x3"
SPECS = ("none", "sa")


def parse_meshes(text: str) -> list[tuple[int, int] | None]:
    """`none,1x1,2x3` -> [None, (1, 1), (2, 3)]."""
    shapes = []
    for item in text.split(","):
        if item == "none":
            shapes.append(None)
            continue
        try:
            data, model = (int(v) for v in item.split("x"))
        except ValueError:
            raise ValueError(f"a mesh is DATAxMODEL or none, got {item!r}") from None
        shapes.append((data, model))
    return shapes


def measure(shapes, *, n: int, max_new_tokens: int, repeats: int, tiny: bool = False,
            model=None, tokenizer=None, prompts=None) -> list:
    """One row per (shape, spec): SmolLM2 on code editing, the tiny model (`tiny`), or the
    given `model`, `tokenizer` and `prompts` (token ids). Runs where the devices are: the
    subprocess `main` starts, or the GPU check on one GPU."""
    import jax

    import jaxspec as js
    from jaxspec.device import sharding

    if model is None and tiny:
        from jaxspec.models import tiny as tiny_lib

        model, tokenizer = tiny_lib.tiny_model(seed=0), None
        prompts = [[1, 2, 3, 1, 2, 3, 1, 2] * 2, [5, 6, 7, 5, 6, 7]][:n]
    elif model is None:
        from benchmarks import chat_prompts
        from benchmarks import workloads
        from jaxspec import models

        model, tokenizer = models.load(None)
        prompts = chat_prompts.prompt_ids(model, tokenizer, workloads.load("code_editing", n),
                                          max_new_tokens=max_new_tokens, batch_size=n)
    scheduler = runs.scheduler_for(prompts, max_new_tokens, len(prompts))
    rows, reference = [], {}
    for shape in shapes:
        mesh = None if shape is None else jax.make_mesh(shape, ("data", "model"))
        for spec in SPECS:
            steps, outputs = [], None
            for _ in range(1 + repeats):                       # the first pass compiles
                engine = js.Engine(model, tokenizer, spec=spec, mesh=mesh, scheduler=scheduler)
                result = engine.generate_batch(prompts, max_new_tokens=max_new_tokens)
                steps.append(result.stats["mean_step_time_ms"])
                outputs = [g.token_ids for g in result.generations]
            executor = engine.executor
            weights = max(sharding.device_bytes(executor.params).values())
            kv = max(sharding.device_bytes(executor.state.kv).values())
            reference.setdefault(spec, outputs)
            rows.append(dict(mesh=shape, spec=spec, step_ms=statistics.median(steps[1:]),
                             weights_mib=weights / 2**20, kv_mib=kv / 2**20,
                             identical=outputs == reference[spec]))
    return rows


def table(rows: list[dict]) -> list[str]:
    """The rows as a Markdown table, each against the same spec without a mesh."""
    base = {r["spec"]: r for r in rows if r["mesh"] is None}
    lines = ["| mesh (data x model) | spec | step ms | vs none | weights MiB/device | share | "
             "KV MiB/device | share | tokens |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        b = base.get(r["spec"], r)
        mesh = "none" if r["mesh"] is None else f"{r['mesh'][0]}x{r['mesh'][1]}"
        lines.append(
            f"| {mesh} | {r['spec']} | {r['step_ms']:.1f} | {r['step_ms'] / b['step_ms']:.2f}x | "
            f"{r['weights_mib']:.1f} | {r['weights_mib'] / b['weights_mib']:.3f} | "
            f"{r['kv_mib']:.1f} | {r['kv_mib'] / b['kv_mib']:.3f} | "
            f"{'identical' if r['identical'] else 'DIFFERENT'} |")
    return lines


def markdown(rows: list[dict], *, n: int, max_new_tokens: int, repeats: int,
             tiny: bool = False) -> str:
    what = ("the tiny random test model on synthetic repeats" if tiny
            else "SmolLM2-135M on `code_editing`")
    return "\n".join([
        "## Many devices: per-device memory and step time vs mesh (CPU virtual devices)",
        "",
        f"A functional check, not a speed claim: {what} ({n} prompts at "
        f"batch {n}, {max_new_tokens} new tokens), every mesh over virtual CPU devices that share "
        "the same 2 cores, so a wider mesh only adds collectives here. *Step ms* is the median "
        f"over {repeats} passes (after one that compiles) of the mean decode step. Bytes are the "
        "largest per-device share; *tokens* compares with the engine without a mesh. `none` is "
        "the single-device path, `1x1` the mesh code path on one device.",
        "",
        *table(rows)])


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m benchmarks.mesh",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--meshes", default=DEFAULT_MESHES, help="e.g. none,1x1,2x3")
    parser.add_argument("--n", type=int, default=2, help="prompts, all in one batch")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tiny", action="store_true", help="the tiny random model (tests)")
    parser.add_argument("--write", action="store_true", help="record in BENCHMARKS.md")
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    shapes = parse_meshes(args.meshes)
    if args.inner:
        rows = measure(shapes, n=args.n, max_new_tokens=args.max_new_tokens,
                       repeats=args.repeats, tiny=args.tiny)
        print(json.dumps(rows))
        return 0
    devices = max([d * m for d, m in filter(None, shapes)], default=1)
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
    done = subprocess.run([sys.executable, "-m", "benchmarks.mesh", "--inner", *argv],
                          env=env, stdout=subprocess.PIPE, text=True)
    if done.returncode:
        return done.returncode
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    for r in rows:
        r["mesh"] = tuple(r["mesh"]) if r["mesh"] else None
    text = markdown(rows, n=args.n, max_new_tokens=args.max_new_tokens, repeats=args.repeats,
                    tiny=args.tiny)
    report.publish(SECTION, text, module="benchmarks.mesh", argv=argv, write=args.write)
    return 0 if all(r["identical"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
