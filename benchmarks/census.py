"""The GPU step's op census, on any machine: what the compiled step is made of, per decoder layer.

    python -m benchmarks.census                              # SmolLM2-135M's shapes, both numerics
    python -m benchmarks.census --json build/census.json --write
    python -m benchmarks.census --layers 2 --numerics exact  # quicker; one numerics

The engine's jitted step (`jaxspec.device.step.step`: batch 1, host drafts, the Pallas kernels) is
exported for CUDA with `jax.export` over abstract weights of SmolLM2-135M's shapes, plain (K=0)
and verifying K=4, in float32 and bfloat16: no GPU and no weights are needed (the Triton custom
calls are let through the export's safety check). Its StableHLO text is then read op by op:

* per decoder layer: `stablehlo.dot_general`s, reductions (`stablehlo.reduce`), converts
  (`stablehlo.convert`) and custom calls by target. An op belongs to the layer whose
  `layer{i}` named scope (models/llama.py) its location carries; every op of a function called
  from a layer's op (a nested jit, a kernel's wrapper) counts in that layer, once per call.
* for the whole step: the same totals, and every `stablehlo.while` with whether its trip count
  is known at compile time (a counter starting from a constant, compared against a constant or a
  loop-invariant constant) or only at run time (any other condition).

Issue 31's targets for the GPU step are printed with whether each is met (`TARGETS`).
"""

import argparse
import collections
import dataclasses
import json
import pathlib
import re
import sys

from benchmarks import report

SECTION = "census"
KS = (0, 4)
DTYPES = ("float32", "bfloat16")
COUNTED = ("dot_general", "reduce", "convert", "custom_call")
PAGE_SIZE = 16
CONTEXT_PAGES = 64            # a 1,024-token table: the op counts do not depend on its width
# Issue 31's targets for the step at the launch floor (DESIGN.md section 8): a handful of large
# kernels per layer, no while loop whose trip count only the run knows (one CUDA graph), and
# bfloat16 adding at most as many dtype conversions again as float32 has.
TARGETS = dict(dot_generals_per_layer=5, custom_calls_per_layer=1, runtime_while_loops=0,
               bfloat16_convert_ratio=2.0)

_FUNC = re.compile(r"^func\.func\s+(?:\w+\s+)?@([\w$.-]+)\(")
_OP = re.compile(r'^(?:(?P<results>%[\w#:]+(?:, %[\w#:]+)*) = )?"?(?P<name>[a-z_]+(?:\.[a-z_]+)+'
                 r'|call|return)\b"?')
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_VALUE = re.compile(r"%[\w]+(?:#\d+)?")
_LAYER = re.compile(r'"(?:[^"]*/)?layer(\d+)/')
_LOC_REF = re.compile(r"#loc\d+")


@dataclasses.dataclass
class Op:
    """One operation of the StableHLO text.

    Attributes:
      name: "stablehlo.dot_general", "call", "return", ...
      results: the SSA names it defines ("%155" for `%155:10 = ...`).
      text: its first line, string literals blanked out.
      target: the callee of a call, the target of a custom call, else None.
      loc: its location (an alias "#loc12" or inline text).
      regions: the ops of each of its regions (a while's cond and body, a reduce's reducer).
    """

    name: str
    results: tuple[str, ...]
    text: str
    target: str | None = None
    loc: str = ""
    regions: list[list["Op"]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class _Frame:
    op: Op | None            # None: a function's body
    body: list[Op]
    base: int                # brace depth before the line that opened it


def _blank_strings(line: str) -> str:
    """`line` with every string literal's content replaced by underscores (same length, so
    positions agree): a Triton kernel's serialized IR may hold braces or "loc(" bytes."""
    return _STRING.sub(lambda m: '"' + "_" * (len(m.group()) - 2) + '"', line)


def _trailing_loc(line: str, code: str) -> str | None:
    if not code.endswith(")"):
        return None
    start = code.rfind(" loc(")
    return None if start < 0 else line[start + 5:-1]


def parse(text: str) -> tuple[dict[str, list[Op]], dict[str, str]]:
    """(function name -> its body's ops, location alias "#locN" -> its definition) of a
    StableHLO module's text (`jax.export.Exported.mlir_module()`)."""
    functions: dict[str, list[Op]] = {}
    aliases: dict[str, str] = {}
    stack: list[_Frame] = []
    depth = 0
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("#loc"):
            name, _, body = line.partition(" = ")
            aliases[name] = body
            continue
        code = _blank_strings(line)
        before = depth
        depth += code.count("{") - code.count("}")
        func = _FUNC.match(line)
        if func:
            functions[func.group(1)] = body = []
            stack = [_Frame(None, body, before)]
            continue
        op = _OP.match(line) if stack else None
        if op:
            name = op.group("name")
            results = tuple(r.split(":")[0] for r in (op.group("results") or "").split(", ") if r)
            target = re.search(r'call_target_name = "([^"]*)"', line) or re.search(
                r"^(?:call|stablehlo\.custom_call|func\.call) @([\w$.-]+)", line[op.start("name"):])
            new = Op(name, results, code, target.group(1) if target else None)
            stack[-1].body.append(new)
            loc = _trailing_loc(line, code)
            if depth > before or loc is None:            # an op with regions
                stack.append(_Frame(new, [], before))
                if code.endswith("{"):
                    new.regions.append(stack[-1].body)
            else:
                new.loc = loc
            continue
        if not stack:
            continue
        frame = stack[-1]
        if frame.op is not None and code.endswith("{"):   # cond {, } do {, reducer(...) {
            frame.body = []
            frame.op.regions.append(frame.body)
        if code.startswith("}") and depth == frame.base:
            if frame.op is not None:
                frame.op.loc = _trailing_loc(line, code) or ""
            stack.pop()
    return functions, aliases


class _Layers:
    """Finds the decoder layer a location names, through its aliases (memoised)."""

    def __init__(self, aliases: dict[str, str]):
        self._aliases = aliases
        self._memo: dict[str, int | None] = {}

    def __call__(self, loc: str) -> int | None:
        found = _LAYER.search(loc)
        if found:
            return int(found.group(1))
        for ref in _LOC_REF.findall(loc):
            if ref not in self._memo:
                self._memo[ref] = None                    # the alias graph has no cycles
                self._memo[ref] = self(self._aliases.get(ref, ""))
            if self._memo[ref] is not None:
                return self._memo[ref]
        return None


def _operands(op: Op, after: str) -> list[str]:
    """The SSA values in `op.text` after the word `after`, up to its type signature."""
    rest = op.text.split(after, 1)[1]
    return _VALUE.findall(rest.split(" : ")[0])


def _lookup(value: str, scopes: list[dict[str, Op]]) -> Op | None:
    name = value.split("#")[0]
    return next((s[name] for s in reversed(scopes) if name in s), None)


def trip_count_known(op: Op, scopes: list[dict[str, Op]]) -> bool:
    """Whether a `stablehlo.while`'s trip count is known at compile time: its condition compares
    a loop variable that starts from a constant with a constant (defined in the condition or
    captured from around the loop, or a loop variable the body passes through unchanged from a
    constant start). `scopes` hold the enclosing regions' definitions, innermost last."""
    header = op.text.split("stablehlo.while(", 1)[1].split(") :")[0]
    init = dict(re.findall(r"(%\w+) = (%[\w#]+)", header))
    order = list(init)
    if len(op.regions) != 2 or not op.regions[0]:
        return False
    cond, body = op.regions
    cond_defs = {r: o for o in cond for r in o.results}
    returned = [o for o in body if o.name == "stablehlo.return"]
    passed = _operands(returned[-1], "stablehlo.return") if returned else []
    compare = _lookup(_operands(cond[-1], "stablehlo.return")[0], [cond_defs])
    if compare is None or compare.name != "stablehlo.compare":
        return False

    def from_constant(value):
        start = _lookup(init[value], scopes) if value in init else None
        return start is not None and start.name == "stablehlo.constant"

    def constant(value):
        if value not in init:                   # defined in the condition or captured
            defined = _lookup(value, [*scopes, cond_defs])
            return defined is not None and defined.name == "stablehlo.constant"
        invariant = value in init and order.index(value) < len(passed) and (
            passed[order.index(value)] == value)
        return invariant and from_constant(value)

    a, b = _operands(compare, "stablehlo.compare")[:2]
    return any(constant(x) and from_constant(y) for x, y in ((a, b), (b, a)))


def _zero() -> dict:
    return dict(**{name: 0 for name in COUNTED}, custom_call_targets={}, while_loops=0,
                runtime_while_loops=0)


def count(text: str, num_layers: int) -> dict:
    """The census of one lowered step (its StableHLO text).

    Returns:
      {"layers": [per layer {dot_general, reduce, convert, custom_call, custom_call_targets
       (target -> count), while_loops, runtime_while_loops (those whose trip count is known only
       at run time)}], "outside": the same for ops in no layer (embedding, final norm, logits,
       verify), "total": the same for the whole step}.

    Raises:
      ValueError: ops name a layer >= `num_layers`, or layers have no op at all (the
        `layer{i}` named scopes are missing).
    """
    functions, aliases = parse(text)
    layer_of = _Layers(aliases)
    counts: dict = collections.defaultdict(_zero)

    def walk(ops: list[Op], layer: int | None, scopes: list[dict[str, Op]]):
        defs: dict[str, Op] = {}
        for op in ops:
            here = layer if layer is not None else layer_of(op.loc)
            kind = op.name.removeprefix("stablehlo.")
            if kind in COUNTED:
                counts[here][kind] += 1
            if kind == "custom_call":
                targets = counts[here]["custom_call_targets"]
                targets[op.target] = targets.get(op.target, 0) + 1
            defs.update((r, op) for r in op.results)
            if kind == "while":
                counts[here]["while_loops"] += 1
                counts[here]["runtime_while_loops"] += not trip_count_known(op, scopes + [defs])
            if op.name in ("call", "func.call"):
                walk(functions[op.target], here, [])
            for region in op.regions:
                walk(region, here, scopes + [defs])

    walk(functions["main"], None, [])
    found = sorted(k for k in counts if k is not None)
    if found != list(range(num_layers)):
        raise ValueError(f"expected ops in layers 0..{num_layers - 1}, found layers {found}: "
                         "are the layer{i} named scopes of models/llama.py in place?")
    layers = [counts[i] for i in range(num_layers)]
    outside = counts[None]
    total = _zero()
    for part in (*layers, outside):
        for name in (*COUNTED, "while_loops", "runtime_while_loops"):
            total[name] += part[name]
        for target, n in part["custom_call_targets"].items():
            total["custom_call_targets"][target] = total["custom_call_targets"].get(target, 0) + n
    return dict(layers=layers, outside=outside, total=total)


def lower(k: int, dtype: str, *, num_layers: int | None = None, batch: int = 1,
          numerics: str = "fast", implementation: str = "pallas", shape: dict | None = None
          ) -> str:
    """The StableHLO text of the engine's step exported for CUDA: abstract weights of `shape`
    (default SmolLM2-135M's; `num_layers` overrides its depth), `batch` rows of host drafts
    verified K at a time, the kernels of `implementation` ("pallas": the GPU path; "xla": the
    references), weights and KV pages in `dtype`."""
    from flax import nnx
    import jax
    from jax import export
    import jax.numpy as jnp

    from benchmarks import gpu_sections
    from jaxspec.device import kv_cache
    from jaxspec.device import sampling
    from jaxspec.device import step as step_lib
    from jaxspec.models import llama
    from jaxspec.models import precision

    shape = dict(gpu_sections.SMOLLM2_SHAPE if shape is None else shape)
    if num_layers is not None:
        shape["num_layers"] = num_layers
    cfg = llama.LlamaConfig(**shape)
    weights_dtype = jnp.dtype(dtype)
    graphdef, params = nnx.split(nnx.eval_shape(lambda: llama.LlamaForCausalLM(
        cfg, rngs=nnx.Rngs(0))))
    params = nnx.from_flat_state([
        (path, var.replace(jax.ShapeDtypeStruct(var.shape,
                                                precision.param_dtype(var, weights_dtype))))
        for path, var in nnx.to_flat_state(params)])
    pages = jax.ShapeDtypeStruct((cfg.num_layers, CONTEXT_PAGES + 1, PAGE_SIZE, cfg.num_kv_heads,
                                  cfg.resolved_head_dim), weights_dtype)
    i32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.int32)              # noqa: E731
    f32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)            # noqa: E731
    inputs = step_lib.StepInputs(
        last_tokens=i32(batch), drafts=i32(batch, k), draft_lens=i32(batch), slots=i32(batch),
        view=kv_cache.CacheView(page_table=i32(batch, CONTEXT_PAGES), lengths=i32(batch),
                                num_new=i32(batch), implementation=implementation,
                                numerics=numerics),
        sampling=sampling.SamplingArrays(temperature=f32(batch), top_k=i32(batch),
                                         top_p=f32(batch), seed=i32(batch)))
    step_cfg = step_lib.StepConfig(graphdef=graphdef, k=k, draft_source="host",
                                   implementation=implementation)
    exported = export.export(
        jax.jit(lambda p, s, x: step_lib.step(p, s, x, cfg=step_cfg)), platforms=("cuda",),
        disabled_checks=[export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")],
    )(step_lib.weights(params), step_lib.DeviceState(kv=kv_cache.KVPages(k=pages, v=pages)),
      inputs)
    return exported.mlir_module()


def census(*, ks=KS, dtypes=DTYPES, num_layers: int | None = None, numerics: str = "fast"
           ) -> dict:
    """Every (K, dtype) variant's census (`count`) and the targets (`targets`)."""
    from benchmarks import gpu_sections

    layers = gpu_sections.SMOLLM2_SHAPE["num_layers"] if num_layers is None else num_layers
    variants = [dict(k=k, dtype=dtype, **count(lower(k, dtype, num_layers=layers,
                                                     numerics=numerics), layers))
                for k in ks for dtype in dtypes]
    return dict(model="SmolLM2-135M shapes", num_layers=layers, batch=1, draft_source="host",
                implementation="pallas", numerics=numerics, variants=variants,
                targets=targets(variants))


def targets(variants: list[dict]) -> list[dict]:
    """Issue 31's targets over the variants: [{name, measured, limit, met}]."""
    per_layer = [layer for v in variants for layer in v["layers"]]
    rows = [
        dict(name="dot_generals per layer", measured=max(x["dot_general"] for x in per_layer),
             limit=TARGETS["dot_generals_per_layer"]),
        dict(name="custom calls per layer", measured=max(x["custom_call"] for x in per_layer),
             limit=TARGETS["custom_calls_per_layer"]),
        dict(name="while loops with a run-time trip count",
             measured=sum(v["total"]["runtime_while_loops"] for v in variants),
             limit=TARGETS["runtime_while_loops"]),
    ]
    by = {(v["k"], v["dtype"]): v for v in variants}
    for k in dict.fromkeys(v["k"] for v in variants):
        if (k, "float32") in by and (k, "bfloat16") in by:
            full, half = (by[k, d]["total"]["convert"] for d in ("float32", "bfloat16"))
            rows.append(dict(name=f"bfloat16 / float32 converts, K={k}",
                             measured=round(half / max(full, 1), 2),
                             limit=TARGETS["bfloat16_convert_ratio"]))
    for row in rows:
        row["met"] = row["measured"] <= row["limit"]
    return rows


def _cells(part: dict) -> str:
    targets_text = ", ".join(f"`{t}` x{n}" for t, n in sorted(part["custom_call_targets"].items()))
    calls = f"{part['custom_call']}" + (f": {targets_text}" if targets_text else "")
    return (f"{part['dot_general']} | {part['reduce']} | {part['convert']} | {calls} | "
            f"{part['while_loops']} ({part['runtime_while_loops']})")


def _runs(layers: list[dict]) -> list[tuple[int, int, dict]]:
    """Consecutive layers with equal counts, as (first, last, counts)."""
    runs = []
    for i, part in enumerate(layers):
        if runs and runs[-1][2] == part:
            runs[-1] = (runs[-1][0], i, part)
        else:
            runs.append((i, i, part))
    return runs


def markdown(result: dict) -> str:
    lines = [
        "## GPU step census: the step lowered for CUDA, op by op", "",
        f"The jitted step (`jaxspec.device.step.step`) exported for CUDA with `jax.export` on "
        f"this machine (no GPU): {result['model']} ({result['num_layers']} layers), batch "
        f"{result['batch']}, {result['draft_source']} drafts, the {result['implementation']} "
        f"kernels, numerics \"{result['numerics']}\". Counts of StableHLO ops per decoder layer "
        "(consecutive equal layers merged; an op called from a layer counts in it), outside "
        "the layers (embedding, final norm, logits, verify) and for the whole step.", "",
        "| step | part | dot_general | reduce | convert | custom_call | while (run-time trip "
        "count) |",
        "| --- | --- | ---: | ---: | ---: | --- | ---: |"]
    for v in result["variants"]:
        name = f"K={v['k']} {v['dtype']}"
        for first, last, part in _runs(v["layers"]):
            span = f"layer {first}" if first == last else f"layers {first}-{last}, each"
            lines.append(f"| {name} | {span} | {_cells(part)} |")
        lines.append(f"| {name} | outside the layers | {_cells(v['outside'])} |")
        lines.append(f"| {name} | **whole step** | {_cells(v['total'])} |")
    lines += ["", "| issue 31 target | measured | limit | met |", "| --- | ---: | ---: | --- |"]
    for t in result["targets"]:
        lines.append(f"| {t['name']} | {t['measured']} | {t['limit']} | "
                     f"{'yes' if t['met'] else '**no**'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="python -m benchmarks.census",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=None,
                        help="decoder layers (default: SmolLM2-135M's 30)")
    parser.add_argument("--numerics", default="exact,fast",
                        help="exact, fast or both, comma-separated (exact: the GPU default)")
    parser.add_argument("--json", type=pathlib.Path, default=None, help="write the census here")
    parser.add_argument("--write", action="store_true", help="record the section in BENCHMARKS.md")
    args = parser.parse_args(argv)
    names = args.numerics.split(",")
    unknown = [n for n in names if n not in ("exact", "fast")]
    if unknown:
        parser.error(f"unknown numerics {unknown}")
    results = [census(num_layers=args.layers, numerics=n) for n in names]
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results[0] if len(results) == 1 else results, indent=1))
    text = "\n\n".join(markdown(r) if i == 0 else markdown(r).split("\n", 2)[2]
                       for i, r in enumerate(results))
    report.publish(SECTION, text, module="benchmarks.census", argv=argv, write=args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
