"""Where a decode step's time goes: the compiled executable's kernels and a profiler trace.

    python -m benchmarks.gpu_check --sections profile        # on a lent GPU (--cpu: smoke run)

For each step key (dtype, K, batch), on the model the GPU check's step section times:

  census    from `jit(step).lower(...).compile().as_text()`: the kernels one call launches
            (fusions, custom calls by target, the GEMMs among them, copies, with the copies as
            large as the KV pages apart), the while loops (and whether the compiler knows their
            trip count: a loop it does not syncs with the host every iteration on XLA:GPU) and
            the conditionals. (XLA:GPU as of JAX 0.11 forms its command buffers from the thunks,
            after the HLO: the trace shows them.)
  timing    wall time of one step outside the profiler, two ways: synced (the host reads each
            step's outputs before the next dispatch, as the executor does) and pipelined (steps
            dispatched back to back, read at the end). Their gap is what the host's round trip
            costs; the pipelined figure is what the device needs.
  trace     a `jax.profiler` trace of `TRACE_STEPS` synced steps, summarised: from the device
            planes, kernels per step, device-busy time per step (the union of the kernels'
            intervals) against wall time per step, and the kernels with the most time; from the
            host's, CUDA graph launches per step, the time spent updating and launching them,
            and the executable's host time. XLA runs command buffers kernel by kernel under the
            profiler unless `--xla_enable_command_buffers_during_profiling` is set (the GPU
            check sets it), so the timing above stays what a user gets.
"""

import collections
import dataclasses
import glob
import pathlib
import re
import shutil
import statistics
import tempfile
import time

from flax import nnx
import jax
import numpy as np

from jaxspec.device import kv_cache
from jaxspec.device import step as step_lib
from jaxspec.host import profile as profile_lib

TRACE_STEPS = 12
TOP_KERNELS = 10
PAGE_SIZE = 16

# Opcodes that launch nothing: bookkeeping, or control flow whose bodies are counted instead.
_NOT_KERNELS = frozenset({
    "parameter", "constant", "get-tuple-element", "tuple", "bitcast", "call", "while",
    "conditional", "after-all", "opt-barrier", "partition-id", "replica-id", "add-dependency",
    "copy-done", "async-done", "async-update", "domain", "get-dimension-size"})
_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\(.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_OPCODE = re.compile(r"\s([a-z][a-z0-9\-]*)\(")
_CALLED = re.compile(r"\b(to_apply|body|condition|calls|branch_computations)="
                     r"(\{[^}]*\}|%?[\w.\-]+)")
_TARGET = re.compile(r'custom_call_target="([^"]+)"')
_FUSION_KIND = re.compile(r'"fusion_backend_config":\{.*?"kind":"([^"]+)"')
_TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"')


@dataclasses.dataclass(frozen=True)
class Instruction:
    name: str
    opcode: str
    type: str          # the result type as printed (shape and layout)
    line: str
    called: dict       # attribute -> names of the computations it names


def parse_hlo(text: str) -> tuple[dict[str, list[Instruction]], str | None]:
    """(computation name -> its instructions, the entry computation's name) of an HLO module's
    text (`Compiled.as_text()`)."""
    computations, entry, current = {}, None, None
    for raw in text.splitlines():
        header = _HEADER.match(raw)
        if header and not raw.startswith(" "):
            current = header.group(2)
            computations[current] = []
            if header.group(1):
                entry = current
            continue
        if raw.strip() == "}":
            current = None
            continue
        instruction = _INSTRUCTION.match(raw) if current else None
        if not instruction:
            continue
        name, rest = instruction.groups()
        opcode = _OPCODE.search(" " + rest)
        if not opcode:
            continue
        called = {attr: [n.strip().lstrip("%") for n in names.strip("{}").split(",") if n.strip()]
                  for attr, names in _CALLED.findall(rest)}
        computations[current].append(Instruction(
            name=name, opcode=opcode.group(1), type=rest[:opcode.start()].strip(), line=rest,
            called=called))
    return computations, entry


def _is_gemm(ins: Instruction) -> bool:
    """A cuBLAS call, or a fusion XLA emits as a GEMM (`"kind":"__triton_nested_gemm_fusion"`,
    `"__triton_gemm"`, `"__cublas..."` in its backend config)."""
    if ins.opcode == "custom-call":
        target = _TARGET.search(ins.line)
        return bool(target and "gemm" in target.group(1).lower())
    kind = _FUSION_KIND.search(ins.line)
    return ins.opcode == "fusion" and bool(kind) and (
        "gemm" in kind.group(1) or "cublas" in kind.group(1))


def census(text: str, kv_shape: tuple[int, ...] | None = None) -> dict:
    """Counts what one call of a compiled executable launches.

    A kernel is any instruction reached from the entry computation (through calls, command
    buffers, loop bodies and branches, each counted once) that is not bookkeeping; fused
    computations are not entered (a fusion is one kernel).

    Args:
      text: the compiled module's HLO text.
      kv_shape: the KV pages' shape; copies of that shape are counted apart.

    Returns:
      A JSON-ready dict: kernels, by_opcode, custom_calls (target -> count), gemms, copies,
      kv_copies, while_loops (each with its trip count or None and its body's kernels),
      conditionals, command_buffers (HLO-level regions, from XLAs that schedule them in the
      HLO) and kernels_in_command_buffers.
    """
    computations, entry = parse_hlo(text)
    kv_dims = None if kv_shape is None else "[" + ",".join(str(d) for d in kv_shape) + "]"
    counts = dict(kernels=0, by_opcode=collections.Counter(), custom_calls=collections.Counter(),
                  gemms=0, copies=0, kv_copies=0, while_loops=[], conditionals=0,
                  command_buffers=0, kernels_in_command_buffers=0)

    def walk(name: str, in_buffer: bool, seen: tuple) -> int:
        kernels = 0
        for ins in computations.get(name, ()):
            if ins.opcode in _NOT_KERNELS:
                if ins.opcode == "call":
                    for callee in ins.called.get("to_apply", ()):
                        region = callee.startswith("command_buffer")
                        counts["command_buffers"] += region
                        if callee not in seen:
                            kernels += walk(callee, in_buffer or region, (*seen, callee))
                elif ins.opcode == "while":
                    trip = _TRIP_COUNT.search(ins.line)
                    body = [walk(c, in_buffer, (*seen, c)) for attr in ("condition", "body")
                            for c in ins.called.get(attr, ()) if c not in seen]
                    counts["while_loops"].append(dict(
                        name=ins.name, trip_count=int(trip.group(1)) if trip else None,
                        kernels_per_iteration=sum(body)))
                    kernels += sum(body)
                elif ins.opcode == "conditional":
                    counts["conditionals"] += 1
                    kernels += sum(walk(c, in_buffer, (*seen, c))
                                   for c in ins.called.get("branch_computations", ())
                                   if c not in seen)
                continue
            kernels += 1
            counts["by_opcode"][ins.opcode] += 1
            counts["kernels_in_command_buffers"] += in_buffer
            if ins.opcode == "custom-call":
                target = _TARGET.search(ins.line)
                counts["custom_calls"][target.group(1) if target else "?"] += 1
            counts["gemms"] += _is_gemm(ins)
            if ins.opcode in ("copy", "copy-start") or (
                    ins.opcode == "fusion" and "kind=kLoop" in ins.line and "copy" in ins.name):
                counts["copies"] += 1
                counts["kv_copies"] += bool(kv_dims and ins.type.split("{")[0].endswith(kv_dims))
        return kernels

    if entry is None:
        raise ValueError("the HLO text has no ENTRY computation")
    counts["kernels"] = walk(entry, False, (entry,))
    counts["by_opcode"] = dict(counts["by_opcode"].most_common())
    counts["custom_calls"] = dict(counts["custom_calls"].most_common())
    return counts


# ------------------------------------------------------------------------------ the trace


@dataclasses.dataclass(frozen=True)
class Event:
    plane: str
    line: str
    name: str
    start_ns: float
    duration_ns: float


def read_trace(folder: str) -> list[Event]:
    """Every event of the `.xplane.pb` files a `jax.profiler` trace wrote under `folder`."""
    from jax.profiler import ProfileData

    events = []
    for path in sorted(glob.glob(f"{folder}/**/*.xplane.pb", recursive=True)):
        for plane in ProfileData.from_file(path).planes:
            for line in plane.lines:
                events += [Event(plane.name, line.name, e.name, e.start_ns, e.duration_ns)
                           for e in line.events]
    return events


def _is_kernel_line(plane: str, line: str) -> bool:
    """The device planes' lines that hold kernels and copies (one per stream), not the XLA
    module and op annotations beside them."""
    return plane.startswith("/device:") and not any(
        word in line for word in ("XLA", "Steps", "Source", "Launch", "Framework", "TensorFlow"))


def _union_ns(intervals) -> float:
    total, end = 0.0, -float("inf")
    for start, stop in sorted(intervals):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def summarize_trace(events: list[Event], steps: int, wall_s: float) -> dict:
    """Kernels per step, device-busy time per step against the traced wall time per step, and
    the `TOP_KERNELS` kernels with the most time. Without device planes (the CPU) the kernel
    figures are None."""
    kernels = [e for e in events if _is_kernel_line(e.plane, e.line) and e.duration_ns > 0]
    host = [e for e in events if not e.plane.startswith("/device:")]

    def host_ms(prefix: str) -> float:
        return sum(e.duration_ns for e in host if e.name.startswith(prefix)) / 1e6 / steps

    out = dict(steps=steps, wall_ms_per_step=1e3 * wall_s / steps,
               # XLA:GPU records command buffers (CUDA graphs) from its thunks, not in the HLO:
               # the host's graph launches and updates say whether and how they ran.
               graph_launches_per_step=sum(e.name.startswith("cuGraphLaunch") for e in host)
               / steps,
               graph_update_ms_per_step=host_ms("command_buffer::update"),
               graph_launch_ms_per_step=host_ms("cuGraphLaunch"),
               host_execute_ms_per_step=host_ms("[0] GpuExecutable::ExecuteThunks"),
               device_planes=sorted({e.plane for e in events if e.plane.startswith("/device:")}),
               kernel_lines=sorted({f"{e.plane} {e.line}" for e in kernels}))
    if not kernels:
        return dict(out, kernels_per_step=None, busy_ms_per_step=None, top_kernels=[])
    totals = collections.defaultdict(lambda: [0, 0.0])
    for e in kernels:
        totals[e.name][0] += 1
        totals[e.name][1] += e.duration_ns
    busy = _union_ns((e.start_ns, e.start_ns + e.duration_ns) for e in kernels)
    top = sorted(totals.items(), key=lambda kv: -kv[1][1])[:TOP_KERNELS]
    return dict(out, kernels_per_step=len(kernels) / steps, busy_ms_per_step=busy / 1e6 / steps,
                kernel_ms_per_step=sum(e.duration_ns for e in kernels) / 1e6 / steps,
                top_kernels=[dict(name=name[:160], calls_per_step=n / steps,
                                  us_per_step=ns / 1e3 / steps) for name, (n, ns) in top])


def _cell(trace: dict, key: str) -> str:
    if key == "busy_wall":
        busy = trace.get("busy_ms_per_step")
        return "–" if busy is None else f"{busy:.2f} / {trace['wall_ms_per_step']:.2f}"
    if key == "graph_ms":
        return (f"{trace.get('graph_update_ms_per_step', 0):.2f} / "
                f"{trace.get('graph_launch_ms_per_step', 0):.2f}")
    value = trace.get(key)
    return "–" if value is None else f"{value:.2f}" if key.endswith("ms_per_step") else (
        f"{value:.0f}")


# ------------------------------------------------------------------------------ one key


def profile_key(model, *, batch: int, k: int, context: int, repeats: int,
                implementation: str | None = None, numerics: str = "fast", trace: bool = True,
                dump: pathlib.Path | None = None) -> dict:
    """The census, the timing and (with `trace`) the trace summary of one step key.

    The step is the executor's (`jaxspec.device.step.step`, host drafts of length K, greedy),
    on `batch` rows of `context` cached tokens each. With `dump`, the compiled HLO goes to
    `dump.hlo.txt` and the trace to `dump.xplane.pb`, for reading offline.
    """
    graphdef, params = nnx.split(model)
    params = step_lib.weights(params)
    spec = model.cache_spec
    cols = -(-(context + 1 + k) // PAGE_SIZE)
    kv = kv_cache.init_pages(num_layers=spec.num_layers, num_pages=cols + 1, page_size=PAGE_SIZE,
                             num_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim,
                             dtype=spec.dtype)
    state = step_lib.init_state(kv)
    cfg = step_lib.canonical(step_lib.StepConfig(graphdef=graphdef, k=k, draft_source="host",
                                                 implementation=implementation))
    inputs = profile_lib.step_inputs(batch, k, context, PAGE_SIZE, cols, model.vocab_size,
                                     np.random.default_rng(0), implementation, numerics)
    start = time.perf_counter()
    compiled = step_lib.step.lower(params, state, inputs, cfg=cfg).compile()
    text = compiled.as_text()
    result = dict(compile_s=time.perf_counter() - start, census=census(text, tuple(kv.k.shape)))
    if dump is not None:
        dump.parent.mkdir(parents=True, exist_ok=True)
        dump.with_suffix(".hlo.txt").write_text(text)

    def run(n: int, synced: bool):
        nonlocal state
        out = None
        for _ in range(n):
            state, out = step_lib.step(params, state, inputs, cfg=cfg)
            if synced:
                jax.device_get(out)
        jax.block_until_ready((state, out))

    run(2, True)                           # the jit cache's own compile, and a warm call
    for name, synced in (("synced", True), ("pipelined", False)):
        times = []
        for _ in range(3):
            start = time.perf_counter()
            run(repeats, synced)
            times.append((time.perf_counter() - start) / repeats)
        result[f"{name}_ms"] = 1e3 * statistics.median(times)
    if trace:
        with tempfile.TemporaryDirectory() as folder:
            jax.profiler.start_trace(folder)
            start = time.perf_counter()
            run(TRACE_STEPS, True)
            wall = time.perf_counter() - start
            jax.profiler.stop_trace()
            result["trace"] = summarize_trace(read_trace(folder), TRACE_STEPS, wall)
            if dump is not None:
                for path in glob.glob(f"{folder}/**/*.xplane.pb", recursive=True)[:1]:
                    shutil.copy(path, dump.with_suffix(".xplane.pb"))
    return result


def table(rows: list[dict]) -> list[str]:
    """Markdown lines: one row per key, then each key's heaviest kernels."""
    lines = ["| numerics | dtype | batch | K | context | kernels | GEMMs | custom calls "
             "| copies (KV) | while loops (run-time trip) | synced / pipelined ms "
             "| traced kernels | busy / wall ms | graph launches | graph update / launch ms "
             "| host execute ms |",
             "| --- | --- |" + " ---: |" * 14]
    for r in rows:
        c, t = r["census"], r.get("trace") or {}
        loops = c["while_loops"]
        unknown = sum(loop["trip_count"] is None for loop in loops)
        lines.append(
            f"| {r.get('numerics', 'fast')} | {r['dtype']} | {r['batch']} | {r['k']} "
            f"| {r['context']:,} | {c['kernels']} | {c['gemms']} "
            f"| {sum(c['custom_calls'].values())} | {c['copies']} ({c['kv_copies']}) "
            f"| {len(loops)} ({unknown}) | {r['synced_ms']:.2f} / {r['pipelined_ms']:.2f} | "
            + " | ".join(_cell(t, key) for key in (
                "kernels_per_step", "busy_wall", "graph_launches_per_step", "graph_ms",
                "host_execute_ms_per_step")) + " |")
    for r in rows:
        top = (r.get("trace") or {}).get("top_kernels")
        if top:
            lines += ["", f"Heaviest kernels, {r.get('numerics', 'fast')} {r['dtype']} batch "
                      f"{r['batch']} K={r['k']} "
                      f"(us per step, calls per step): "
                      + "; ".join(f"`{x['name'][:60]}` {x['us_per_step']:.0f} us "
                                  f"x{x['calls_per_step']:.0f}" for x in top)]
    return lines
