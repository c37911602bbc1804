"""The GPU check: one prepared command that proves the Pallas kernels and times the engine on a
lent GPU, writing what it measured as it goes.

    python -m benchmarks.gpu_check --out $OUT            # on the GPU (README, "GPU check")
    python -m benchmarks.gpu_check --cpu                 # tiny sizes, interpreted kernels, CPU
    python -m benchmarks.gpu_check --record RESULT.json  # a GPU result into BENCHMARKS.md
    python -m benchmarks.gpu_check --record A.json B.json   # gpu_ship's two calls, merged

Sections, in this order (`--sections` picks some): first what the step's speed depends on and
what the real model does (jaxspec, then HF on the same GPU), then the step grid, then the kernels'
proofs.

  profile    where a step's time goes (`benchmarks.step_profile`): for the plain and K=4 steps,
             exact and fast numerics, bfloat16 and float32, batch 1, the compiled executable's
             kernels, GEMMs, copies,
             while loops and command-buffer (CUDA graph) regions; the step's wall time synced
             and pipelined; a profiler trace's kernels and device-busy time per step.
  engine     with `--gguf PATH`: plain vs SA tokens/s on code editing (`benchmarks.harness`);
             on CPU without it, the tiny model on synthetic prompts. Without it on a GPU,
             skipped: `benchmarks.gpu_ship` sends the embedded GGUF (94 MiB) in two calls.
  divergence teacher-forced logits (`benchmarks.teacher_forced`): every position computed by a
             plain step and by a verify step over plain's own tokens, compared bitwise, exact
             and fast numerics, float32 and bfloat16; the GGUF's prompts with `--gguf`, else
             SmolLM2's shapes with random weights. Fails if exact mode differs anywhere.
  hf         HF transformers on the same model and prompts (`benchmarks.hf_baseline`), torch on
             `cuda`, float32, batch 1: greedy and prompt lookup K=10 tokens/s, and whether
             prompt lookup's output equals greedy's (the baseline a GPU user would pick). With
             `--cpu`, on the CPU (the tiny model's weights in transformers' Llama without a GGUF).
  step       the engine's jitted step on a SmolLM2-135M-shaped model with random weights (same
             shapes, same cost), timed by `jaxspec.host.profile`: plain (K=0) and verify K,
             bfloat16 and float32, Pallas and XLA attention, contexts 512 to 8k.

  kernels    the automaton kernels (extend + lookup, longest and fixed-M; the global search)
             against the XLA reference (`benchmarks.kernel_check`): batch 1 to 256, histories
             of 1k to 32k tokens, slots reused; integers compared exactly.
  attention  the paged-attention kernel against its reference on SmolLM2's shapes, up to 8k
             cached tokens, float32 and bfloat16 pages.
  sa_timing  the automaton's step for both implementations at batch 1, 8, 64, 256 and 1k, 8k,
             32k tokens of history (`benchmarks.sa_overhead.measure_steps`).
  mesh       the engine without a mesh and on a 1 x 1 mesh (the sharded code path) on this one
             device, plain and SA, bfloat16 SmolLM2 shapes: same tokens, step time of each.

The sections live in `benchmarks.gpu_sections`; this module holds the sizes, the output and the
command line.

Each (batch, K) of the step compiles the 30-layer model once (contexts reuse it), so the step grid
is chosen, not a full product: K = 0 and 4 for every dtype and attention at batch 1 and 64 first,
then K = 1..8 at batch 1 (bfloat16, Pallas), then batch 8 and K = 8 at 64. A time budget
(`--budget-s`) bounds the run: the step section stops before a key it has no time left for (the
engine section's time kept back if it comes later) and lists what it skipped; the other sections
stop only when the whole budget is spent.

Results go to `--out` (gpu_check.json and gpu_check.md, the table also printed), rewritten after
every section and step key, so a run cut short still returns what it measured. The exit status is
1 when a kernel disagrees with its reference (the section stops at the first mismatch, naming
the case; the others still run) or a section fails, 2 when there is no GPU without `--cpu`.
Nothing here writes BENCHMARKS.md but `--record`, which takes only results measured on a GPU.
"""

import argparse
import dataclasses
import datetime
import importlib.metadata
import json
import os
import pathlib
import platform
import shutil
import statistics
import subprocess
import sys
import time
import traceback

from benchmarks import gpu_sections

SECTIONS = ("profile", "engine", "divergence", "hf", "step", "kernels", "attention",
            "sa_timing", "mesh")
# The sections that use --gguf on a GPU: `benchmarks.gpu_ship` sends them in its second call.
MODEL_SECTIONS = ("engine", "divergence", "hf")
RESULT_JSON, RESULT_MD = "gpu_check.json", "gpu_check.md"
BENCHMARKS_SECTION = "gpu_check"
PACKAGES = ("jax", "jaxlib", "flax", "numpy", "numba", "tokenizers", "gguf", "triton", "torch",
            "transformers")
DEFAULT_BUDGET_S = {"gpu": 300.0, "cpu": 600.0}


def _gpu_step_grid() -> tuple[tuple[str, str, int, int], ...]:
    """(dtype, attention, batch, K) in the order they run (see the module doc)."""
    bf16, f32 = "bfloat16", "float32"
    grid = [(dtype, impl, batch, k) for batch in (1, 64)
            for dtype, impl in ((bf16, "pallas"), (bf16, "xla"), (f32, "pallas"))
            for k in (0, 4)]
    grid += [(bf16, "pallas", 1, k) for k in (1, 2, 3, 5, 6, 7, 8)]
    grid += [(bf16, "pallas", 8, k) for k in (0, 2, 4, 8)] + [(bf16, "pallas", 64, 8)]
    return tuple(grid)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Sizes:
    """What one run covers.

    Attributes:
      batches: automaton rows (= slots) per case, checked and timed.
      histories: automaton prompt tokens per row.
      modes: automaton lookup modes checked (`kernel_check.MODES`); the timed ones among them.
      check_steps: steps per automaton case.
      timing_steps, timing_warmup: timed and untimed steps per automaton measurement.
      attention: (batch, K, context, page dtype) per attention case.
      model: "smollm2" (SmolLM2-135M's shapes, random weights) or "tiny".
      step_grid: (dtype, attention implementation, batch, K) per step key, in order.
      contexts: cached tokens per row for every step key.
      step_repeats: timed steps per (key, context).
      profile_keys: (numerics, dtype, batch, K) per profile key; profile_context: their cached
        tokens.
      engine_batches, engine_prompts, max_new_tokens, engine_repeats: the engine section.
      divergence_prompts, divergence_tokens, divergence_k, divergence_numerics: the divergence
        section's prompts, positions per prompt, verify width and numerics compared.
    """

    batches: tuple[int, ...]
    histories: tuple[int, ...]
    modes: tuple[str, ...]
    check_steps: int
    timing_steps: int
    timing_warmup: int
    attention: tuple[tuple[int, int, int, str], ...]
    model: str
    step_grid: tuple[tuple[str, str, int, int], ...]
    contexts: tuple[int, ...]
    step_repeats: int
    profile_keys: tuple[tuple[str, str, int, int], ...]
    profile_context: int
    engine_batches: tuple[int, ...]
    engine_prompts: int
    max_new_tokens: int
    engine_repeats: int
    divergence_prompts: int
    divergence_tokens: int
    divergence_k: int
    divergence_numerics: tuple[str, ...] = ("exact", "fast")

    @property
    def capacity(self) -> int:
        """Automaton tokens per slot: the same for every case, so timing reuses the checks'
        compiled shapes."""
        from benchmarks import kernel_check

        steps = max(self.check_steps, self.timing_warmup + self.timing_steps)
        return max(self.histories) + steps * (kernel_check.DRAFT_LEN + 1)


GPU_SIZES = Sizes(
    batches=(1, 8, 64, 256), histories=(1024, 8192, 32768),
    modes=("longest", "fixed-3", "global", "global-fixed-2"), check_steps=16, timing_steps=16,
    timing_warmup=3,
    attention=((1, 0, 8192, "float32"), (8, 4, 8192, "bfloat16"), (64, 8, 2048, "bfloat16"),
               (64, 0, 8192, "float32"), (16, 16, 1000, "bfloat16")),
    model="smollm2", step_grid=_gpu_step_grid(), contexts=(512, 2048, 8192), step_repeats=5,
    profile_keys=tuple((n, "bfloat16", 1, k) for n in ("exact", "fast") for k in (0, 4))
    + (("exact", "float32", 1, 0), ("fast", "float32", 1, 0)),
    profile_context=2048,
    engine_batches=(1, 8), engine_prompts=8, max_new_tokens=128, engine_repeats=1,
    divergence_prompts=2, divergence_tokens=64, divergence_k=4)
# Interpreted kernels and the tiny model: every line of the script runs, no number means much.
CPU_SIZES = Sizes(
    batches=(3,), histories=(40, 160), modes=GPU_SIZES.modes, check_steps=6, timing_steps=2,
    timing_warmup=1, attention=((2, 0, 40, "float32"), (3, 2, 70, "bfloat16")), model="tiny",
    step_grid=(("float32", "xla", 1, 0), ("float32", "xla", 1, 2), ("bfloat16", "xla", 2, 0),
               ("bfloat16", "xla", 2, 2)),
    contexts=(100, 300), step_repeats=2,
    profile_keys=(("exact", "float32", 1, 0), ("fast", "bfloat16", 2, 2)), profile_context=100,
    engine_batches=(2,), engine_prompts=2, max_new_tokens=8,
    engine_repeats=1, divergence_prompts=1, divergence_tokens=6, divergence_k=2)


class Run:
    """One run's results, output folder, clock and log."""

    def __init__(self, out: pathlib.Path, sizes: Sizes, *, cpu: bool, budget_s: float,
                 seed: int, gguf: str | None, argv: list[str], dump: bool = False):
        self.out, self.sizes, self.cpu, self.seed, self.gguf = out, sizes, cpu, seed, gguf
        self.dump = dump
        self.start = time.monotonic()
        self.deadline = self.start + budget_s
        self.results = dict(status="running", meta=dict(argv=argv, budget_s=budget_s),
                            sizes=dataclasses.asdict(sizes), sections={})

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def log(self, message: str):
        print(f"[{time.monotonic() - self.start:7.1f}s] {message}", flush=True)

    def save(self):
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / RESULT_JSON).write_text(json.dumps(self.results, indent=1) + "\n")
        (self.out / RESULT_MD).write_text(markdown(self.results) + "\n")


def machine(argv: list[str]) -> dict:
    """Where and when: the device, its driver, the Python packages, the date."""
    import jax

    meta = dict(date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                backend=jax.default_backend(),
                devices=[d.device_kind for d in jax.devices()], python=platform.python_version(),
                platform=platform.platform(), cpus=os.cpu_count(), argv=argv, packages={})
    for name in PACKAGES:
        try:
            meta["packages"][name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            meta["packages"][name] = None
    meta["gpu"] = meta["driver"] = None
    if shutil.which("nvidia-smi"):
        try:
            line = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                 "--format=csv,noheader"], capture_output=True, text=True, timeout=20,
                check=True).stdout.splitlines()[0]
            meta["gpu"], meta["driver"], meta["gpu_memory"] = (x.strip() for x in line.split(","))
        except (subprocess.SubprocessError, OSError, IndexError, ValueError):
            pass
    return meta


def run_section(run: Run, name: str):
    from benchmarks import kernel_check

    run.log(f"section {name}")
    section = run.results["sections"][name] = dict(status="running")
    start = time.monotonic()
    try:
        gpu_sections.SECTIONS[name](run, section)
        if section["status"] == "running":
            section["status"] = "partial" if section.get("skipped") else "ok"
    except kernel_check.Mismatch as e:
        section.update(status="mismatch", failure=str(e))
        run.log(f"MISMATCH in section {name}: {e}")
    except Exception as e:  # noqa: BLE001 - one section's failure must not lose the others'
        section.update(status="error", failure=f"{type(e).__name__}: {e}",
                       traceback=traceback.format_exc())
        run.log(f"ERROR in section {name}: {type(e).__name__}: {e}")
    section["seconds"] = time.monotonic() - start
    run.log(f"section {name}: {section['status']} ({section['seconds']:.1f} s)")
    run.save()


# ------------------------------------------------------------------------------------ markdown


def _fmt(value, spec: str = ".2f") -> str:
    return "–" if value is None else f"{value:{spec}}"


def _ratio(numerator, denominator) -> str:
    return "–" if numerator is None or not denominator else f"{numerator / denominator:.2f}x"


def _step_tables(section: dict) -> list[str]:
    rows = section.get("rows", [])
    ks = sorted({r["k"] for r in rows})
    at = {(r["dtype"], r["implementation"], r["batch"], r["context"], r["k"]): r["ms"]
          for r in rows}
    lines = ["| dtype | attention | batch | context | "
             + " | ".join(f"K={k} (ms)" for k in ks) + " |",
             "| --- | --- | ---: | ---: |" + " ---: |" * len(ks)]
    for key in sorted({k[:4] for k in at}):
        cells = []
        for k in ks:
            ms, plain = at.get((*key, k)), at.get((*key, 0))
            cells.append("–" if ms is None else f"{ms:.2f}" if not plain or k == 0
                         else f"{ms:.2f} ({ms / plain:.2f}x)")
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]:,} | " + " | ".join(cells)
                     + " |")
    keys = section.get("keys", [])
    if keys:
        lines += ["", f"{len(keys)} step keys, each compiled once: compile "
                  f"{statistics.median(k['compile_s'] for k in keys):.1f} s median, "
                  f"{max(k['compile_s'] for k in keys):.1f} s at most; key wall "
                  f"{sum(k['seconds'] for k in keys):.0f} s in all."]
    return lines


def _hf_lines(section: dict, engine: dict, packages: dict) -> list[str]:
    """The hf section's table, and jaxspec's batch-1 tokens/s over HF's on the same prompts."""
    methods = section["methods"]
    names = {"greedy": "HF greedy", "prompt_lookup": f"HF prompt lookup K={section['k']}"}
    lines = ["", f"transformers {packages.get('transformers') or '?'} / torch "
             f"{packages.get('torch') or '?'} on {section['runtime']}, "
             f"{pathlib.Path(section['model']).name}, "
             f"{section['workload']}: {section['dtype']} (matmul precision "
             f"{section['matmul_precision']}), batch 1, {section['prompts']} prompts, at most "
             f"{section['max_new_tokens']} new tokens, one timed pass after a warm-up.", "",
             "| method | tok/s | tokens | seconds |", "| --- | ---: | ---: | ---: |"]
    lines += [f"| {name} | {methods[m]['tokens_per_s']:.1f} | {methods[m]['tokens']} "
              f"| {methods[m]['seconds']:.1f} |" for m, name in names.items() if m in methods]
    if "lookup_equals_greedy" in section:
        where = "; ".join(f"prompt {x['prompt']} from token {x['position']}"
                          for x in section["mismatches"])
        lines += ["", f"HF prompt lookup equals HF greedy on {section['lookup_equals_greedy']} "
                  f"of {section['prompts']} prompts" + (f" (differs: {where})." if where else ".")]
    ours = next((b for b in engine.get("batches", ()) if b["batch"] == 1), None)
    if ours and engine.get("model") == section["model"] and ours["prompts"] == section["prompts"]:
        pairs = (("plain", "greedy", "jaxspec plain / HF greedy"),
                 ("sa", "prompt_lookup", "jaxspec SA / HF prompt lookup"))
        ratios = [f"{label} {ours[f'{a}_tokens_per_s'] / methods[b]['tokens_per_s']:.2f}x"
                  for a, b, label in pairs if b in methods]
        lines += ["", "Same prompts, the engine section at batch 1: " + ", ".join(ratios) + "."]
    return lines


def markdown(results: dict) -> str:
    """The run as Markdown: a line about the machine, then a table per section."""
    meta, sections = results["meta"], results["sections"]
    gpu = meta.get("gpu") or ", ".join(meta.get("devices", [])) or "?"
    packages = meta.get("packages", {})
    lines = ["## GPU check", "",
             f"{gpu} ({meta.get('backend', '?')}; driver {meta.get('driver') or '–'}), JAX "
             f"{packages.get('jax')} / jaxlib {packages.get('jaxlib')}, Python "
             f"{meta.get('python')}, {meta.get('date')}. Status: **{results['status']}**."]
    if meta.get("backend") == "cpu":
        lines += ["", "CPU smoke run (`--cpu`): interpreted kernels, tiny sizes and model; its "
                  "timings say nothing about a GPU."]
    for name in SECTIONS:
        if name not in sections:
            continue
        section = sections[name]
        lines += ["", f"### {name}: {section['status']} ({_fmt(section.get('seconds'), '.0f')} s)"]
        if section.get("failure"):
            lines += ["", f"**{section['status'].upper()}**: {section['failure']}"]
        if section.get("reason"):
            lines += ["", section["reason"]]
        if name in ("kernels", "attention") and section.get("cases"):
            if name == "kernels":
                lines += ["", "| case | steps | rows drafted | mean match length |",
                          "| --- | ---: | ---: | ---: |"]
                lines += [f"| {c['case']} | {c['steps']} | {c['drafted_rows']} / {c['rows']} "
                          f"| {c['mean_match_len']:.1f} |" for c in section["cases"]]
            else:
                lines += ["", "| case | largest difference | tolerance |", "| --- | ---: | ---: |"]
                lines += [f"| {c['case']} | {c['max_abs_error']:.2g} | {c['tolerance']:g} |"
                          for c in section["cases"]]
        if name == "sa_timing" and section.get("rows"):
            lines += ["", f"Median time of one automaton step committing K+1 = "
                      f"{section['draft_len'] + 1} tokens to every row, {section['steps']} steps "
                      f"(slot capacity {section['capacity']:,}).", "",
                      "| history | batch | mode | XLA (us) | Pallas (us) | XLA / Pallas |",
                      "| ---: | ---: | --- | ---: | ---: | ---: |"]
            lines += [f"| {r['history']:,} | {r['batch']} | {r['mode']} | {r['xla_us']:.0f} "
                      f"| {r['pallas_us']:.0f} | {r['xla_us'] / r['pallas_us']:.1f}x |"
                      for r in section["rows"]]
        if name == "profile" and section.get("rows"):
            from benchmarks import step_profile

            lines += ["", f"Model {section['model']} (random weights), {section['context']:,} "
                      "cached tokens. Kernels, GEMMs, custom calls, copies and loops are counted "
                      "in the compiled executable (loop bodies once); synced = the host reads "
                      "every step's outputs, pipelined = steps dispatched back to back (median "
                      f"of 3 x {section['repeats']} steps); per step in a profiler trace (CUDA "
                      "graphs on): kernels, device-busy against wall time, graph launches, the "
                      "host's time updating and launching graphs, and the executable's host "
                      "time.", "", *step_profile.table(section["rows"])]
        if name == "step" and section.get("rows"):
            lines += ["", f"One jitted step (`jaxspec.host.profile`, median of "
                      f"{section['repeats']}), model {section['model']} with random weights; "
                      "in brackets the ratio to K=0.", ""]
            lines += _step_tables(section)
        if name == "engine" and section.get("batches"):
            lines += ["", f"{pathlib.Path(section['model']).name}, {section['workload']}: a "
                      "fresh engine per pass over the prompts, in a process warmed by one untimed "
                      "pass of each method (its compiles are not in the figures; "
                      "`benchmarks.harness`)." + (
                          f" K={section['k']}; SA tree: up to {section['tree_budget']} nodes a "
                          "step, K deep." if "k" in section else ""), "",
                      "| batch | prompts | new tokens | plain tok/s | SA tok/s | speedup "
                      "| mean acceptance length | plain / SA step (ms) | SA tree tok/s "
                      "| tree / SA | tree acceptance length | tree step (ms) | mismatches |",
                      "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
                      "| ---: | ---: | ---: |"]
            lines += [f"| {b['batch']} | {b['prompts']} | {b['max_new_tokens']} "
                      f"| {b['plain_tokens_per_s']:.1f} | {b['sa_tokens_per_s']:.1f} "
                      f"| {b['speedup']:.2f}x | {_fmt(b['mean_acceptance_length'])} "
                      f"| {_fmt(b['plain_step_ms'], '.1f')} / {_fmt(b['sa_step_ms'], '.1f')} "
                      f"| {_fmt(b.get('tree_tokens_per_s'), '.1f')} "
                      f"| {_ratio(b.get('tree_tokens_per_s'), b['sa_tokens_per_s'])} "
                      f"| {_fmt(b.get('tree_mean_acceptance_length'))} "
                      f"| {_fmt(b.get('tree_step_ms'), '.1f')} "
                      f"| {len(b['mismatches'])} |" for b in section["batches"]]
        if name == "divergence" and section.get("reports"):
            from benchmarks import teacher_forced

            lines += ["", f"{section['model']}: every position computed by a plain step and by "
                      f"a K={section['k']} verify step over the same tokens "
                      "(`benchmarks.teacher_forced`), the float32 logits compared.", "",
                      *teacher_forced.MARKDOWN_HEADER,
                      *teacher_forced.markdown_rows(section["model_name"], section["reports"])]
        if name == "hf" and section.get("methods"):
            lines += _hf_lines(section, sections.get("engine", {}), packages)
        if name == "mesh" and section.get("rows"):
            from benchmarks import mesh as mesh_bench

            rows = [dict(r, mesh=r["mesh"] and tuple(r["mesh"])) for r in section["rows"]]
            lines += ["", f"Model {section['model']} (random weights), 2 synthetic prompts; "
                      "median step of the passes after the compiling one.", "",
                      *mesh_bench.table(rows)]
        if section.get("skipped"):
            lines += ["", f"Skipped for time ({len(section['skipped'])}): "
                      + "; ".join(section["skipped"]) + "."]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ the CLI


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(","))


def _profile_keys(text: str) -> tuple[tuple[str, str, int, int], ...]:
    keys = []
    for key in text.split(","):
        numerics, dtype, batch, k = key.split(":")
        keys.append((numerics, dtype, int(batch), int(k)))
    return tuple(keys)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("build/gpu_check"),
                        help="folder for gpu_check.json and gpu_check.md ($OUT on the device)")
    parser.add_argument("--cpu", action="store_true",
                        help="tiny sizes, interpreted kernels, on the CPU (the CI smoke run)")
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"comma-separated subset of {','.join(SECTIONS)}")
    parser.add_argument("--gguf", default=None, help="a GGUF model for the engine section")
    parser.add_argument("--budget-s", type=float, default=None,
                        help=f"seconds for all sections (default {DEFAULT_BUDGET_S['gpu']:.0f} "
                        "on a GPU)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dump", action="store_true",
                        help="the profile section also writes each key's compiled HLO and trace "
                        "into --out")
    parser.add_argument("--record", type=pathlib.Path, nargs="+", default=None,
                        metavar="RESULT_JSON", help="write a GPU run's results into BENCHMARKS.md "
                        "and exit (several: gpu_ship's calls, merged into one section)")
    sizes = parser.add_argument_group("sizes (default: the GPU's, or the CPU's with --cpu)")
    sizes.add_argument("--batches", type=_ints, help="automaton batch sizes, e.g. 1,8,64,256")
    sizes.add_argument("--histories", type=_ints, help="automaton prompt tokens, e.g. 1024,32768")
    sizes.add_argument("--modes", type=lambda s: tuple(s.split(",")),
                       help="automaton modes: longest,fixed-3,global,global-fixed-2")
    sizes.add_argument("--check-steps", type=int)
    sizes.add_argument("--timing-steps", type=int)
    sizes.add_argument("--step-batches", type=_ints, help="with the next three: the step grid "
                       "becomes their product (dtype, attention, batch, K)")
    sizes.add_argument("--step-ks", type=_ints)
    sizes.add_argument("--dtypes", type=lambda s: tuple(s.split(",")))
    sizes.add_argument("--implementations", type=lambda s: tuple(s.split(",")))
    sizes.add_argument("--contexts", type=_ints, help="step contexts, e.g. 512,2048,8192")
    sizes.add_argument("--step-repeats", type=int)
    sizes.add_argument("--profile-keys", type=_profile_keys,
                       help="profile keys numerics:dtype:batch:K, comma-separated, e.g. "
                       "exact:bfloat16:1:0")
    sizes.add_argument("--profile-context", type=int)
    sizes.add_argument("--divergence-numerics", type=lambda s: tuple(s.split(",")),
                       help="exact,fast or one of them")
    sizes.add_argument("--engine-batches", type=_ints)
    sizes.add_argument("--engine-prompts", type=int)
    sizes.add_argument("--max-new-tokens", type=int)
    return parser


def sizes_from(args) -> Sizes:
    """The preset of the platform with the command line's overrides."""
    from benchmarks import kernel_check

    sizes = CPU_SIZES if args.cpu else GPU_SIZES
    fields = dict(batches=args.batches, histories=args.histories, modes=args.modes,
                  check_steps=args.check_steps, timing_steps=args.timing_steps,
                  contexts=args.contexts, step_repeats=args.step_repeats,
                  profile_keys=args.profile_keys, profile_context=args.profile_context,
                  divergence_numerics=args.divergence_numerics,
                  engine_batches=args.engine_batches, engine_prompts=args.engine_prompts,
                  max_new_tokens=args.max_new_tokens)
    grid = (args.dtypes, args.implementations, args.step_batches, args.step_ks)
    if any(x is not None for x in grid):
        # An axis not given keeps the preset's values, in their order.
        dtypes, impls, batches, ks = (
            x if x is not None else tuple(dict.fromkeys(key[i] for key in sizes.step_grid))
            for i, x in enumerate(grid))
        fields["step_grid"] = tuple((d, i, b, k) for d in dtypes for i in impls for b in batches
                                    for k in ks)
    sizes = dataclasses.replace(sizes, **{k: v for k, v in fields.items() if v is not None})
    unknown = [m for m in sizes.modes if m not in kernel_check.MODES]
    if unknown:
        raise ValueError(f"unknown modes {unknown}; known: {', '.join(kernel_check.MODES)}")
    return sizes


def merged(runs: list[dict]) -> dict:
    """Several runs' results as one (`benchmarks.gpu_ship`'s two calls): the first's machine and
    date, the sections in `SECTIONS` order (a later run's replacing an earlier one's), the
    failures of all, and every run's command line."""
    sections = {}
    for results in runs:
        sections.update(results["sections"])
    order = {name: i for i, name in enumerate(SECTIONS)}
    failed = [n for n, s in sections.items() if s["status"] in ("mismatch", "error")]
    return dict(runs[0], status="failed: " + ", ".join(failed) if failed else "ok",
                sections={n: sections[n] for n in sorted(sections, key=lambda n: order.get(n, 99))},
                commands=[r["meta"]["argv"] for r in runs])


def portable(argv: list[str]) -> list[str]:
    """A device run's arguments as anyone would type them: `--out` the device's `$OUT`, `--gguf`
    the model's file name (gpu_ship joins it under a folder of the device's own), other paths
    relative to the checkout."""
    from benchmarks import report

    out = []
    for i, arg in enumerate(argv):
        flag = argv[i - 1] if i else ""
        out.append("$OUT" if flag == "--out" else pathlib.Path(arg).name if flag == "--gguf"
                   else report.checkout_relative(arg))
    return out


def record(paths: pathlib.Path | list[pathlib.Path], benchmarks_md: pathlib.Path | None = None
           ) -> int:
    """Writes GPU runs' Markdown into BENCHMARKS.md's GPU section (or `benchmarks_md`); several
    result files (`benchmarks.gpu_ship`'s two calls) become one section (`merged`)."""
    from benchmarks import report

    paths = [paths] if isinstance(paths, pathlib.Path) else list(paths)
    runs = [json.loads(path.read_text()) for path in paths]
    for path, results in zip(paths, runs, strict=True):
        if results["meta"].get("backend") != "gpu":
            print(f"{path} was measured on {results['meta'].get('backend')!r}, not a GPU: not "
                  "recorded", file=sys.stderr)
            return 2
    results = merged(runs)
    meta = results["meta"]
    where = (f"{meta.get('gpu') or ', '.join(meta['devices'])}, driver {meta.get('driver')}, "
             f"JAX {meta['packages'].get('jax')} on gpu, Python {meta.get('python')}")
    command = " ; ".join(" ".join(["python -m benchmarks.gpu_check", *portable(argv)])
                         for argv in results["commands"])
    benchmarks_md = benchmarks_md or report.BENCHMARKS_MD
    report.write_section(BENCHMARKS_SECTION, markdown(results), command=command, machine=where,
                         stamp=meta["date"], path=benchmarks_md)
    print(f"recorded {', '.join(map(str, paths))} ({meta['date']}, {where}) into {benchmarks_md}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    if args.record is not None:
        return record(args.record)
    sections = args.sections.split(",")
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        print(f"unknown sections {unknown}; known: {', '.join(SECTIONS)}", file=sys.stderr)
        return 2
    # Traces show the CUDA graphs a user's steps run (XLA drops them under the profiler).
    flag = "--xla_enable_command_buffers_during_profiling"
    if flag not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flag}=true".strip()
    import jax

    if args.cpu:
        jax.config.update("jax_platforms", "cpu")
    elif jax.default_backend() != "gpu":
        print(f"no GPU here (JAX backend {jax.default_backend()!r}): run on a lent GPU (README, "
              "'GPU check'), or add --cpu for the CPU smoke run", file=sys.stderr)
        return 2
    sizes = sizes_from(args)
    budget = args.budget_s or DEFAULT_BUDGET_S["cpu" if args.cpu else "gpu"]
    run = Run(args.out, sizes, cpu=args.cpu, budget_s=budget, seed=args.seed, gguf=args.gguf,
              argv=argv, dump=args.dump)
    run.results["meta"].update(machine(argv), budget_s=budget, sections=sections)
    meta = run.results["meta"]
    run.log(f"{meta['gpu'] or meta['devices'][0]} ({meta['backend']}), driver {meta['driver']}, "
            f"jax {meta['packages']['jax']}; budget {budget:.0f} s; writing to {args.out}")
    run.save()
    for name in sections:
        run_section(run, name)
    stats = jax.devices()[0].memory_stats() or {}
    meta["peak_device_bytes"] = stats.get("peak_bytes_in_use")
    failed = [n for n, s in run.results["sections"].items() if s["status"] in ("mismatch", "error")]
    run.results["status"] = "failed: " + ", ".join(failed) if failed else "ok"
    run.save()
    print("\n" + markdown(run.results), flush=True)
    run.log(f"done: {run.results['status']} ({args.out / RESULT_JSON})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
