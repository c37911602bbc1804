"""Many devices: the engine over meshes of 8 virtual CPU devices (in a subprocess, so the rest of
the suite keeps one device) gives the single device's tokens, compiles no more, and holds about
1/model of the weights and KV cache per device; two processes under jax.distributed give the
tokens of one."""

import functools
import json
import os
import pathlib
import runpy
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@functools.lru_cache(maxsize=None)
def _cases(which: str) -> dict:
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
           "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-m", "tests.e2e.mesh_cases", which], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _check(case):
    label = f"{case['spec']} on mesh {case['mesh']}"
    assert case["identical"], label
    data, model = case["mesh"]
    # Batch buckets round up to multiples of `data`, so data > 1 may merge buckets: never more.
    if data == 1:
        assert case["traces"] == case["single_traces"], label
    else:
        pairs = zip(case["traces"], case["single_traces"], strict=True)
        assert all(m <= s for m, s in pairs), label
    for part in ("kv", "weights"):
        share = case["bytes"][part] / case["single_bytes"][part]
        # Repeated KV heads (model > KV heads) keep 1/KV-heads of the cache per device.
        assert share <= 1 / model + 0.05 or (part == "kv" and model == 4 and share <= 0.55), (
            label, part, share)


@pytest.mark.slow
def test_tiny_model_meshes():
    out = _cases("tiny")
    assert len(out["cases"]) == 4 * 2            # specs x meshes
    for case in out["cases"]:
        _check(case)


def test_meshes_that_do_not_fit_are_value_errors():
    messages = _cases("errors")["errors"]
    assert len(messages) == 3
    assert "model=3 does not divide the model's 4 attention heads" in messages[0]
    assert "data=4 must divide max_batch_size=2" in messages[1]
    assert "model=8 does not divide the model's 4 attention heads" in messages[2]


@pytest.mark.extended      # the tiny model's meshes cover every path but SmolLM2's 3 KV heads
def test_smollm2_meshes():
    out = _cases("smollm2")
    assert len(out["cases"]) == 2
    for case in out["cases"]:
        _check(case)


@pytest.mark.extended
def test_two_processes_give_the_tokens_of_one():
    example = runpy.run_path(str(ROOT / "examples" / "multi_process.py"))
    (two_processes,) = {json.dumps(o) for o in example["launch"](2, 2, (2, 2), True, 12)}
    (one_process,) = {json.dumps(o) for o in example["launch"](1, 4, (2, 2), True, 12)}
    assert two_processes == one_process
