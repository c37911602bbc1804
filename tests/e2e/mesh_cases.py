"""Runs the engine over meshes of virtual CPU devices and reports, as JSON on stdout, what
tests/e2e/mesh_test.py checks: tokens against one device, trace counts, per-device bytes.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m tests.e2e.mesh_cases tiny

`tiny` and `smollm2` run the engine over meshes; `errors` only builds the meshes that cannot fit.

Run in its own process: the device count is fixed when jax starts.
"""

import json
import sys

import jax

import jaxspec as js
from jaxspec.device import sharding
from jaxspec.device import step as step_lib
from jaxspec.host import compiles
from jaxspec.host import requests as requests_lib
from tests.helpers import random_prompts

ENTRY_POINTS = ("prefill", "step", "prime_drafts")
SPECS = {"none": None, "sa": js.SAConfig(max_draft_len=3, min_match_len=1),
         "ngram": js.NGramConfig(max_draft_len=3, max_matching_ngram_size=2),
         # Token trees: their mask travels through attention's shard_map by rows.
         "sa_tree": js.SAConfig(max_draft_len=3, min_match_len=1, selection="frequent",
                                tree_budget=6)}


def _run(model, spec, prompts, lengths, *, mesh=None, max_batch_size=8, max_seq_len=128):
    """Every prompt with its own output length (so the batch shrinks 8 -> 1 as they finish):
    (outputs, traces per entry point, the executor). Two row buckets, 1 and max_batch_size: the
    batch still crosses from one to the other, and a mesh with data=2 still rounds 1 up to 2,
    with half the compiles of the default powers of two."""
    engine = js.Engine(model, spec=spec, mesh=mesh, scheduler=js.SchedulerConfig(
        max_batch_size=max_batch_size, max_seq_len=max_seq_len,
        batch_buckets=(1, max_batch_size)))
    executor = engine.executor
    before = [step_lib.trace_count(n) for n in ENTRY_POINTS]
    ids = [executor.add_request(p, requests_lib.SamplingParams(max_new_tokens=n), frozenset())
           for p, n in zip(prompts, lengths, strict=True)]
    done = executor.run()
    traces = [step_lib.trace_count(n) - b for n, b in zip(ENTRY_POINTS, before, strict=True)]
    return [done[i].output for i in ids], traces, executor


def _bytes(executor) -> dict:
    kv = sharding.device_bytes(executor.state.kv)
    weights = sharding.device_bytes(executor.params)
    return {"kv": max(kv.values()), "weights": max(weights.values())}


def cases(model, meshes, prompts, lengths, specs=tuple(SPECS), **kwargs) -> list[dict]:
    results = []
    for name in specs:
        spec = SPECS[name]
        for step_lib_fn in (step_lib.step, step_lib.prefill, step_lib.prime_drafts):
            step_lib_fn.clear_cache()
        # Nor programs an earlier spec compiled ahead of time (its plain step may be this one's).
        compiles.LEDGER.forget_programs()
        want, traces, single = _run(model, spec, prompts, lengths, **kwargs)
        base = _bytes(single)
        for shape in meshes:
            for fn in (step_lib.step, step_lib.prefill, step_lib.prime_drafts):
                fn.clear_cache()
            mesh = jax.make_mesh(tuple(shape), ("data", "model"))   # explicit axes: the default
            got, mesh_traces, executor = _run(model, spec, prompts, lengths, mesh=mesh, **kwargs)
            results.append({"spec": name, "mesh": list(shape), "identical": got == want,
                            "traces": mesh_traces, "single_traces": traces,
                            "bytes": _bytes(executor), "single_bytes": base})
    return results


def errors(model) -> list[str]:
    """The messages of meshes that cannot fit."""
    found = []
    for shape, batch in (((1, 3), 8), ((4, 1), 2), ((1, 8), 8)):
        try:
            js.Engine(model, spec="none", mesh=jax.make_mesh(shape, ("data", "model")),
                      scheduler=js.SchedulerConfig(max_batch_size=batch, max_seq_len=64))
        except ValueError as e:
            found.append(str(e))
    return found


def main(argv):
    which = argv[0]
    if which == "errors":
        from jaxspec.models import tiny

        out = {"errors": errors(tiny.tiny_model(seed=0))}
    elif which == "tiny":
        from jaxspec.models import tiny

        model = tiny.tiny_model(seed=0)
        prompts = random_prompts(3, [5, 9, 12, 7, 16, 4, 10, 6], alphabet_size=3)
        lengths = [4, 20, 9, 14, 6, 24, 11, 17]
        # Both axes, and a model axis past the 2 KV heads (repeated heads); a 1 x 2 mesh runs
        # no path that these two do not.
        out = {"cases": cases(model, [(2, 2), (1, 4)], prompts, lengths)}
    else:
        from jaxspec.models import registry

        model, tok = registry.load(None)
        prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": text}],
                                                      add_generation_prompt=True))
                   for text in ("Repeat this list: red, green, blue, red, green, blue.",
                                "Write a Python function that adds two numbers.")]
        # One mesh over both axes (model=3: SmolLM2's 3 KV heads); the tiny model covers the rest.
        out = {"cases": cases(model, [(2, 3)], prompts, [12, 20], specs=("none", "sa"),
                              max_batch_size=2, max_seq_len=160)}
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
