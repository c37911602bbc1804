"""The GPU check's sections (`benchmarks.gpu_check` runs them; its docstring says what each
covers). Each is `section(run, section)`: it fills the JSON-ready dict `section` as it goes,
calls `run.save()` after each unit of work worth keeping, stops starting units when
`run.left()` is spent (listing them under "skipped"), and raises `kernel_check.Mismatch` when a
kernel disagrees with its reference.
"""

import functools
import statistics
import time

from flax import nnx
import numpy as np

from benchmarks import chat_prompts
from benchmarks import harness
from benchmarks import hf_baseline
from benchmarks import host_overhead
from benchmarks import kernel_check
from benchmarks import runs
from benchmarks import sa_overhead
from benchmarks import step_profile
from benchmarks import workloads
from jaxspec.host import cost_model
from jaxspec.host import profile
from jaxspec.models import llama
from jaxspec.models import precision
from jaxspec.models import tiny

ENGINE_RESERVE_S = 150.0        # kept from the step section for the engine when --gguf is given
# The engine section's K and tree budget: on the H200 a verify step of K=4 cost what a plain step
# costs (issue 31's table), so both speculating methods draft far; issue 34's goal compares a
# tree of 32 nodes with linear SA at the same depth.
ENGINE_K = 16
ENGINE_TREE_BUDGET = 32
FIRST_STEP_KEY_S = 20.0         # assumed time of a step key (compile + timing) before one ran
HF_PLD_K = 10                   # HF prompt lookup's K: what a GPU user of transformers would pick
NO_GGUF = ("no --gguf: the model sections need the GGUF (94 MiB; `benchmarks.gpu_ship` sends it "
           "to a device in two calls of 64 MiB)")
SMOLLM2_SHAPE = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30,
                     num_heads=9, num_kv_heads=3, rope_theta=100000.0, rms_norm_eps=1e-5,
                     tie_embeddings=True, max_position_embeddings=8192)


def kernels(run, section: dict):
    """The automaton kernels against the reference, every mode at every batch size."""
    section["cases"], section["skipped"] = [], []
    for mode in run.sizes.modes:
        for batch in run.sizes.batches:
            if run.left() <= 0:
                section["skipped"].append(f"automaton {mode}, batch {batch}")
                continue
            start = time.monotonic()
            case = kernel_check.check_automaton(
                batch, mode, histories=run.sizes.histories, capacity=run.sizes.capacity,
                steps=run.sizes.check_steps, seed=run.seed, interpret=run.cpu)
            case["seconds"] = time.monotonic() - start
            section["cases"].append(case)
            run.log(f"  ok: {case['case']} ({case['steps']} steps, {case['drafted_rows']} of "
                    f"{case['rows']} rows drafted, {case['seconds']:.1f} s)")


def attention(run, section: dict):
    """The paged-attention kernel against its reference on each attention case."""
    section["cases"], section["skipped"] = [], []
    for batch, k, context, dtype in run.sizes.attention:
        if run.left() <= 0:
            section["skipped"].append(f"attention batch {batch}, K={k}, context {context}")
            continue
        case = kernel_check.check_attention(batch, k, context, dtype, seed=run.seed,
                                            interpret=run.cpu)
        section["cases"].append(case)
        run.log(f"  ok: {case['case']} (largest difference {case['max_abs_error']:.2g})")


def sa_timing(run, section: dict):
    """The automaton's step, both implementations, per history, batch and timed mode."""
    sizes = run.sizes
    modes = [kernel_check.TIMED_MODES[m] for m in sizes.modes if m in kernel_check.TIMED_MODES]
    stream = np.asarray(host_overhead.stdlib_byte_tokens(
        max(sizes.batches) * max(sizes.histories)
        + (sizes.timing_warmup + sizes.timing_steps) * (sa_overhead.DRAFT_LEN + 1) + 1,
        recursive=True), np.int32)
    section.update(rows=[], skipped=[], steps=sizes.timing_steps, capacity=sizes.capacity,
                   draft_len=sa_overhead.DRAFT_LEN)
    for history in sizes.histories:
        for batch in sizes.batches:
            for mode in modes:
                if run.left() <= 0:
                    section["skipped"].append(f"{mode}, batch {batch}, history {history}")
                    continue
                row = dict(history=history, batch=batch, mode=mode)
                for impl in kernel_check.IMPLEMENTATIONS:
                    row[f"{impl}_us"] = 1e6 * sa_overhead.measure_steps(
                        stream, history, batch, mode, steps=sizes.timing_steps,
                        warmup=sizes.timing_warmup, implementation=impl,
                        capacity=sizes.capacity, interpret=run.cpu and impl == "pallas")
                section["rows"].append(row)
            run.log(f"  history {history}, batch {batch}: " + ", ".join(
                f"{r['mode']} {r['xla_us']:.0f} / {r['pallas_us']:.0f} us"
                for r in section["rows"] if (r["history"], r["batch"]) == (history, batch)))
            run.save()


def _model(name: str):
    """SmolLM2-135M's shapes with random weights, or the tiny test model."""
    if name == "tiny":
        return tiny.tiny_model(seed=0)
    return llama.LlamaForCausalLM(llama.LlamaConfig(**SMOLLM2_SHAPE), rngs=nnx.Rngs(0))


def step(run, section: dict):
    """The jitted step per (dtype, attention, batch, K) of the grid, at every context; a key
    that the time left (less the engine's share) cannot fit is skipped."""
    sizes = run.sizes
    engine_to_come = ("engine" in run.results["meta"]["sections"]
                      and "engine" not in run.results["sections"])
    reserve = ENGINE_RESERVE_S if run.gguf and engine_to_come else 0
    model = _model(sizes.model)
    models = {}
    section.update(model=sizes.model, contexts=list(sizes.contexts), repeats=sizes.step_repeats,
                   rows=[], keys=[], skipped=[])
    key_seconds = []
    for dtype, impl, batch, k in sizes.step_grid:
        needed = statistics.median(key_seconds) if key_seconds else FIRST_STEP_KEY_S
        if run.left() - reserve < needed:
            section["skipped"].append(f"{dtype} {impl} batch {batch} K={k}")
            continue
        if dtype not in models:
            models[dtype] = precision.cast(model, dtype)
        costs = cost_model.StepCostModel()
        start = time.monotonic()
        with runs.CompileCounter() as compiles:
            profile.profile(models[dtype], costs, batch_sizes=[batch], widths=[k],
                            contexts=list(sizes.contexts), repeats=sizes.step_repeats,
                            progress=False, implementation=impl)
        key_seconds.append(time.monotonic() - start)
        section["keys"].append(dict(dtype=dtype, implementation=impl, batch=batch, k=k,
                                    seconds=key_seconds[-1], compiles=compiles.count,
                                    compile_s=compiles.seconds))
        measured = [dict(dtype=dtype, implementation=impl, batch=r, k=kk, context=c, ms=1e3 * t)
                    for r, kk, c, t, _ in costs.table()]
        section["rows"] += measured
        run.log(f"  {dtype} {impl} batch {batch} K={k}: "
                + ", ".join(f"{m['context']} {m['ms']:.2f} ms" for m in measured)
                + f" ({compiles.count} compiles, {compiles.seconds:.1f} s)")
        run.save()


def profile_steps(run, section: dict):
    """Each profile key's compiled census, synced and pipelined step time, and trace summary
    (`benchmarks.step_profile`)."""
    sizes = run.sizes
    model = _model(sizes.model)
    models = {}
    section.update(model=sizes.model, context=sizes.profile_context,
                   repeats=sizes.step_repeats, rows=[], skipped=[])
    for numerics, dtype, batch, k in sizes.profile_keys:
        if run.left() <= 0:
            section["skipped"].append(f"{numerics} {dtype} batch {batch} K={k}")
            continue
        if dtype not in models:
            models[dtype] = precision.cast(model, dtype)
        name = f"{numerics}_{dtype}_b{batch}_k{k}"
        row = dict(numerics=numerics, dtype=dtype, batch=batch, k=k,
                   context=sizes.profile_context,
                   **step_profile.profile_key(
                       models[dtype], batch=batch, k=k, context=sizes.profile_context,
                       repeats=sizes.step_repeats, numerics=numerics,
                       dump=run.out / name if run.dump else None))
        section["rows"].append(row)
        census, trace = row["census"], row["trace"]
        run.log(f"  {name}: {census['kernels']} kernels, "
                f"{census['gemms']} GEMMs, {len(census['while_loops'])} loops, "
                f"{census['command_buffers']} graphs; {row['synced_ms']:.2f} ms synced, "
                f"{row['pipelined_ms']:.2f} pipelined; traced "
                f"{trace['kernels_per_step']} kernels, busy {trace['busy_ms_per_step']} ms "
                "per step")
        run.save()


def _synthetic_prompts(count: int, vocab: int) -> list[list[int]]:
    """Prompts that repeat themselves (something for the automaton to copy), for the tiny model."""
    rng = np.random.default_rng(0)
    return [rng.integers(0, vocab, 12).tolist() * 3 for _ in range(count)]


@functools.cache
def _gguf_workload(path: str, count: int, max_new_tokens: int):
    """(model, tokenizer, prompt ids) of the GGUF model on `count` code-editing prompts, loaded
    once for the sections that share them."""
    from jaxspec import models

    model, tokenizer = models.load(path)
    conversations = workloads.load("code_editing", count)
    return model, tokenizer, chat_prompts.prompt_ids(model, tokenizer, conversations,
                                                     max_new_tokens=max_new_tokens)


def engine(run, section: dict):
    """Plain vs SA vs SA token trees on code editing with the GGUF model (K = ENGINE_K, trees of
    ENGINE_TREE_BUDGET nodes K deep); on CPU the tiny model on synthetic prompts; skipped on a
    GPU without a GGUF."""
    sizes = run.sizes
    if run.gguf:
        model, tokenizer, prompts = _gguf_workload(run.gguf, sizes.engine_prompts,
                                                   sizes.max_new_tokens)
        section.update(model=run.gguf, workload="code_editing")
    elif run.cpu:
        model, tokenizer = _model("tiny"), None
        prompts = _synthetic_prompts(sizes.engine_prompts, model.vocab_size)
        section.update(model="tiny (random weights)", workload="synthetic repeats")
    else:
        section.update(status="skipped", reason=NO_GGUF)
        return
    section.update(k=ENGINE_K, tree_budget=ENGINE_TREE_BUDGET, batches=[])
    for batch in sizes.engine_batches:
        if run.left() <= 0:
            section.setdefault("skipped", []).append(f"batch {batch}")
            continue
        cfg = harness.BenchConfig(workload="code_editing", n=len(prompts), batch_size=batch,
                                  max_new_tokens=sizes.max_new_tokens,
                                  repeats=sizes.engine_repeats, max_draft_len=ENGINE_K,
                                  tree_budget=ENGINE_TREE_BUDGET,
                                  methods=("plain", "sa", "sa_tree"))
        results = harness.compare(model, tokenizer, prompts, cfg, progress=False)
        plain, sa, tree = (results["methods"][m] for m in ("plain", "sa", "sa_tree"))
        section["batches"].append(dict(
            batch=batch, prompts=len(prompts), max_new_tokens=sizes.max_new_tokens,
            plain_tokens_per_s=plain["tokens_per_s"], sa_tokens_per_s=sa["tokens_per_s"],
            speedup=sa["speedup"], mean_acceptance_length=sa.get("mean_acceptance_length"),
            plain_step_ms=plain.get("mean_step_time_ms"), sa_step_ms=sa.get("mean_step_time_ms"),
            tree_tokens_per_s=tree["tokens_per_s"], tree_speedup=tree["speedup"],
            tree_mean_acceptance_length=tree.get("mean_acceptance_length"),
            tree_step_ms=tree.get("mean_step_time_ms"), mismatches=results["mismatches"]))
        run.log(f"  batch {batch}: plain {plain['tokens_per_s']:.1f} tok/s, SA "
                f"{sa['tokens_per_s']:.1f} tok/s ({sa['speedup']:.2f}x), SA tree "
                f"{tree['tokens_per_s']:.1f} tok/s ({tree['speedup']:.2f}x)")
        run.save()


def divergence(run, section: dict):
    """Teacher-forced plain against verify logits (`benchmarks.teacher_forced`), exact and fast
    numerics, float32 and bfloat16: on the GGUF model's code-editing prompts; without a GGUF,
    SmolLM2's shapes with random weights on random prompts (the tiny model on CPU)."""
    from benchmarks import teacher_forced

    sizes = run.sizes
    if run.gguf:
        model, _, prompts = _gguf_workload(run.gguf, sizes.engine_prompts, sizes.max_new_tokens)
        prompts = prompts[:sizes.divergence_prompts]
        name = "SmolLM2-135M (GGUF), code editing prompts"
    else:
        model = _model(sizes.model)
        prompts = teacher_forced.random_prompts(
            model.vocab_size, [48 + 16 * i for i in range(sizes.divergence_prompts)])
        name = f"{sizes.model} (random weights), random prompts"
    short = "smollm2" if run.gguf else sizes.model
    section.update(model=name, model_name=short, k=sizes.divergence_k,
                   max_new_tokens=sizes.divergence_tokens, reports=[], skipped=[])
    for numerics in sizes.divergence_numerics:
        for dtype in ("float32", "bfloat16"):
            if run.left() <= 0:
                section["skipped"].append(f"{numerics} {dtype}")
                continue
            report = teacher_forced.teacher_forced(
                precision.cast(model, dtype), prompts, k=sizes.divergence_k,
                max_new_tokens=sizes.divergence_tokens, numerics=numerics)
            for row in report["prompts"]:
                row.pop("tokens", None)
            section["reports"].append(report)
            totals = report["totals"]
            run.log(f"  {numerics} {dtype}: {totals['not_bitwise_equal']} of "
                    f"{totals['positions']} positions not bitwise equal, max |diff| "
                    f"{totals['max_abs_diff']:.3g}, {totals['argmax_flips']} argmax flips")
            run.save()
    if any(r["numerics"] == "exact" and r["totals"]["not_bitwise_equal"]
           for r in section["reports"]):
        raise RuntimeError("exact numerics: a verify row differs from its plain row")


def hf(run, section: dict):
    """HF transformers greedy and prompt lookup (K = `HF_PLD_K`), float32, batch 1, on the
    engine section's model and prompts: torch on `cuda`, or on the CPU with `--cpu` (the tiny
    model's weights in transformers' Llama when there is no GGUF). One timed pass of each after
    a short warm-up, prompt lookup first (jaxspec SA's peer, kept should the budget end); whether
    prompt lookup's output equals greedy's, prompt by prompt."""
    sizes = run.sizes
    reason = "no time left in the budget" if run.left() <= 0 else hf_baseline.unavailable_reason()
    if reason is None and not run.cpu:
        import torch

        reason = (NO_GGUF if not run.gguf else None if torch.cuda.is_available()
                  else f"HF baseline skipped: torch {torch.__version__} sees no CUDA device")
    if reason:
        section.update(status="skipped", reason=reason)
        return
    device = "cpu" if run.cpu else "cuda"
    if run.gguf:
        _, tokenizer, prompts = _gguf_workload(run.gguf, sizes.engine_prompts,
                                               sizes.max_new_tokens)
        model = hf_baseline.HFModel.load(run.gguf, device=device)
        section.update(model=run.gguf, workload="code_editing")
    else:
        tiny_model = _model("tiny")
        tokenizer, prompts = None, _synthetic_prompts(sizes.engine_prompts, tiny_model.vocab_size)
        model = hf_baseline.HFModel.from_llama(tiny_model, device=device)
        section.update(model="tiny (random weights)", workload="synthetic repeats")
    # On the CPU torch is imported only now, after HFModel set the OpenMP wait policy it reads.
    import torch

    stops = runs.stop_ids(tokenizer)
    section.update(runtime=model.threads_note, dtype="float32",
                   matmul_precision=torch.get_float32_matmul_precision(), k=HF_PLD_K,
                   prompts=len(prompts), max_new_tokens=sizes.max_new_tokens, methods={},
                   skipped=[])
    outputs = {}
    for method, k in (("prompt_lookup", HF_PLD_K), ("greedy", None)):
        if run.left() <= 0:
            section["skipped"].append(f"HF {method}")
            continue
        model.generate(prompts[0][-harness.HF_WARMUP_TOKENS:], max_new_tokens=2, stop_ids=stops,
                       prompt_lookup_num_tokens=k)
        timed = runs.run_hf(model, prompts, max_new_tokens=sizes.max_new_tokens, stops=stops,
                            prompt_lookup_num_tokens=k)
        outputs[method] = timed.outputs
        section["methods"][method] = dict(tokens=timed.generated, seconds=timed.wall_s,
                                          tokens_per_s=timed.tokens_per_s)
        run.log(f"  HF {method}: {timed.tokens_per_s:.1f} tok/s ({timed.generated} tokens)")
        run.save()
    if len(outputs) == 2:
        pairs = list(zip(outputs["greedy"], outputs["prompt_lookup"], strict=True))
        section["mismatches"] = [dict(prompt=i, position=runs.first_mismatch(g, p))
                                 for i, (g, p) in enumerate(pairs) if g != p]
        section["lookup_equals_greedy"] = len(pairs) - len(section["mismatches"])


def mesh(run, section: dict):
    """The engine without a mesh and with a 1 x 1 mesh on this one device (the mesh code path:
    shardings, shard_map), plain and SA on synthetic prompts: the same tokens, and the step
    time of each (issue 14: the single-device path no slower)."""
    from benchmarks import mesh as mesh_bench

    if run.left() <= 0:
        section.update(status="skipped", reason="no time left in the budget")
        return
    model = _model(run.sizes.model)
    if not run.cpu:
        model = precision.cast(model, "bfloat16")
    rows = mesh_bench.measure([None, (1, 1)], n=2, max_new_tokens=run.sizes.max_new_tokens,
                              repeats=run.sizes.engine_repeats, model=model,
                              prompts=_synthetic_prompts(2, model.vocab_size))
    section.update(model=run.sizes.model, rows=[dict(r, mesh=r["mesh"] and list(r["mesh"]))
                                                for r in rows])
    if not all(r["identical"] for r in rows):
        raise RuntimeError("the mesh code path changed the tokens")


SECTIONS = dict(profile=profile_steps, engine=engine, divergence=divergence, hf=hf, step=step,
                kernels=kernels, attention=attention, sa_timing=sa_timing, mesh=mesh)
