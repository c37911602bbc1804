"""The GPU check at CPU sizes (`--cpu`), so the script a lent GPU runs cannot rot: every section
end to end in a subprocess, a planted kernel bug caught and named, refusals, and the recording of
a GPU result."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from benchmarks import gpu_check
from benchmarks import hf_baseline
from benchmarks import kernel_check
from jaxspec.pallas_kernels import sa_extend

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_cpu_run_covers_every_section(tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--cpu", "--out",
                           str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=480)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((out / gpu_check.RESULT_JSON).read_text())
    assert results["status"] == "ok" and results["meta"]["backend"] == "cpu"
    sections = results["sections"]
    assert list(sections) == list(gpu_check.SECTIONS)
    hf_reason = hf_baseline.unavailable_reason()       # CI installs no torch: hf says so
    expected = {n: "skipped" if n == "hf" and hf_reason else "ok" for n in gpu_check.SECTIONS}
    assert {n: s["status"] for n, s in sections.items()} == expected, sections
    sizes = gpu_check.CPU_SIZES
    assert len(sections["kernels"]["cases"]) == len(sizes.modes) * len(sizes.batches)
    assert sum(c["drafted_rows"] for c in sections["kernels"]["cases"]) > 0
    assert len(sections["attention"]["cases"]) == len(sizes.attention)
    assert len(sections["sa_timing"]["rows"]) == 3 * len(sizes.histories) * len(sizes.batches)
    assert {(k["dtype"], k["batch"], k["k"]) for k in sections["step"]["keys"]} == {
        (d, b, k) for d, _, b, k in sizes.step_grid}
    engine = sections["engine"]["batches"][0]
    assert engine["mismatches"] == []
    assert engine["tree_tokens_per_s"] > 0 and engine["tree_mean_acceptance_length"] >= 1
    assert [(r["numerics"], r["dtype"]) for r in sections["profile"]["rows"]] == [
        (n, d) for n, d, _, _ in sizes.profile_keys]
    reports = sections["divergence"]["reports"]
    assert [(r["numerics"], r["totals"]["positions"]) for r in reports] == [
        (n, sizes.divergence_prompts * sizes.divergence_tokens)
        for n in ("exact", "exact", "fast", "fast")]
    assert all(r["totals"]["not_bitwise_equal"] == 0 for r in reports if r["numerics"] == "exact")
    assert [(r["mesh"], r["spec"], r["identical"]) for r in sections["mesh"]["rows"]] == [
        (None, "none", True), (None, "sa", True), ([1, 1], "none", True), ([1, 1], "sa", True)]
    table = (out / gpu_check.RESULT_MD).read_text()
    assert table.startswith("## GPU check") and "CPU smoke run" in table
    for heading in gpu_check.SECTIONS:
        assert f"### {heading}: {expected[heading]}" in table
    if hf_reason:
        assert sections["hf"]["reason"] == hf_reason
    else:                                  # the tiny model's weights in transformers' Llama
        hf = sections["hf"]
        assert set(hf["methods"]) == {"greedy", "prompt_lookup"} and hf["mismatches"] == []
        assert hf["lookup_equals_greedy"] == sizes.engine_prompts
        assert "| HF prompt lookup K=10 |" in table
    assert "| automaton global-fixed-2, batch 3 |" in table
    assert "| float32 | xla | 1 | 512 |" in table
    assert "| 1x1 | sa |" in table
    assert table.strip() in proc.stdout                     # the table is printed too


def test_a_wrong_kernel_fails_loudly_naming_the_case(tmp_path, monkeypatch, capsys):
    real = sa_extend.sa_extend_and_lookup

    def off_by_one(*args, **kwargs):
        state, match_len, drafts, lens = real(*args, **kwargs)
        return state, match_len, drafts.at[:, 0].add(1), lens

    monkeypatch.setattr(sa_extend, "sa_extend_and_lookup", off_by_one)
    code = gpu_check.main(["--cpu", "--out", str(tmp_path), "--sections", "kernels,attention",
                           "--modes", "longest", "--batches", "2"])
    assert code == 1
    printed = capsys.readouterr().out
    assert ("MISMATCH in section kernels: automaton longest, batch 2, step 0: draft_tokens "
            "differs first at row 0") in printed
    results = json.loads((tmp_path / gpu_check.RESULT_JSON).read_text())
    assert results["status"] == "failed: kernels"
    assert results["sections"]["kernels"]["status"] == "mismatch"
    assert results["sections"]["attention"]["status"] == "ok"    # the other sections still run
    assert "**MISMATCH**: automaton longest, batch 2" in (
        tmp_path / gpu_check.RESULT_MD).read_text()


def test_a_diverged_slot_is_named():
    states = {impl: kernel_check.sa_layout.init_state(2, 8) for impl in ("xla", "pallas")}
    states["pallas"] = states["pallas"].replace(text=states["pallas"].text.at[1, 3].set(7))
    try:
        kernel_check._compare_states("case x", states, [[], []], 8)
    except kernel_check.Mismatch as e:
        assert str(e) == "case x, after the last step: SAState.text differs in slot 1"
    else:
        raise AssertionError("no mismatch raised")


def test_without_a_gpu_it_refuses_unless_cpu(capsys):
    assert gpu_check.main(["--out", "/nonexistent"]) == 2
    assert "no GPU here" in capsys.readouterr().err
    assert gpu_check.main(["--cpu", "--sections", "kernels,bogus"]) == 2


def test_sizes_from_the_command_line():
    args = gpu_check._parser().parse_args(["--batches", "1,2", "--step-ks", "0,3",
                                           "--dtypes", "float32"])
    sizes = gpu_check.sizes_from(args)
    assert sizes.batches == (1, 2) and sizes.histories == gpu_check.GPU_SIZES.histories
    assert sizes.step_grid == tuple(("float32", impl, b, k) for impl in ("pallas", "xla")
                                    for b in (1, 64, 8) for k in (0, 3))
    assert sizes.capacity == 32768 + 19 * 6
    default = gpu_check.GPU_SIZES.step_grid
    assert len(default) == len(set(default)) == 24 and default[0] == ("bfloat16", "pallas", 1, 0)


def _gpu_result(tmp_path) -> pathlib.Path:
    results = dict(status="ok", meta=dict(
        backend="gpu", gpu="NVIDIA H200", driver="580.1", devices=["NVIDIA H200"],
        python="3.12.3", date="2026-12-02 10:00 UTC", argv=["--out", "/out"],
        packages=dict(jax="0.11.2", jaxlib="0.11.2")), sections=dict(
        step=dict(status="partial", seconds=100.0, model="smollm2", repeats=5,
                  skipped=["float32 pallas batch 64 K=4"],
                  rows=[dict(dtype="bfloat16", implementation="pallas", batch=1, k=k,
                             context=512, ms=ms) for k, ms in ((0, 2.0), (4, 2.5))],
                  keys=[dict(compile_s=9.0, seconds=12.0)] * 2)))
    path = tmp_path / "result.json"
    path.write_text(json.dumps(results))
    return path


def test_record_writes_a_gpu_result_with_its_machine_and_date(tmp_path):
    md = tmp_path / "BENCHMARKS.md"
    assert gpu_check.record(_gpu_result(tmp_path), md) == 0
    text = md.read_text()
    assert "<!-- begin:gpu_check -->" in text and "| bfloat16 | pallas | 1 | 512 | 2.00 | " \
        "2.50 (1.25x) |" in text
    assert "Skipped for time (1): float32 pallas batch 64 K=4." in text
    assert ("Command: `python -m benchmarks.gpu_check --out $OUT` — 2026-12-02 10:00 UTC, "
            "NVIDIA H200, driver 580.1, JAX 0.11.2 on gpu, Python 3.12.3.") in text


def test_record_refuses_numbers_not_measured_on_a_gpu(tmp_path, capsys):
    path = _gpu_result(tmp_path)
    results = json.loads(path.read_text())
    results["meta"]["backend"] = "cpu"
    path.write_text(json.dumps(results))
    md = tmp_path / "BENCHMARKS.md"
    assert gpu_check.record(path, md) == 2
    assert not md.exists() and "not a GPU: not recorded" in capsys.readouterr().err


def test_record_merges_the_two_calls_of_gpu_ship(tmp_path):
    first = _gpu_result(tmp_path)
    results = json.loads(first.read_text())
    results["meta"]["packages"].update(torch="2.11.0", transformers="5.17.0")
    first.write_text(json.dumps(results))
    batch = dict(batch=1, prompts=8, max_new_tokens=128, plain_tokens_per_s=150.0,
                 sa_tokens_per_s=350.0, speedup=2.33, mean_acceptance_length=3.3,
                 plain_step_ms=6.4, sa_step_ms=9.1, mismatches=[])
    hf = dict(status="ok", seconds=40.0, model="/tmp/model/m.gguf", workload="code_editing",
              runtime="cuda: NVIDIA H200", dtype="float32", matmul_precision="highest", k=10,
              prompts=8, max_new_tokens=128, skipped=[],
              methods=dict(prompt_lookup=dict(tokens=1000, seconds=5.0, tokens_per_s=200.0),
                           greedy=dict(tokens=1000, seconds=20.0, tokens_per_s=50.0)),
              mismatches=[dict(prompt=3, position=85)], lookup_equals_greedy=7)
    results["meta"].update(argv=["--out", "/root/out", "--gguf", "/tmp/model/m.gguf"])
    results["sections"] = dict(hf=hf, engine=dict(status="ok", seconds=70.0, batches=[batch],
                                                   model="/tmp/model/m.gguf",
                                                   workload="code_editing"))
    second = tmp_path / "second.json"
    second.write_text(json.dumps(results))
    md = tmp_path / "BENCHMARKS.md"
    assert gpu_check.record([first, second], md) == 0
    text = md.read_text()
    assert text.index("### engine: ok") < text.index("### hf: ok") < text.index("### step: ")
    assert "transformers 5.17.0 / torch 2.11.0 on cuda: NVIDIA H200" in text
    assert "| HF prompt lookup K=10 | 200.0 | 1000 | 5.0 |" in text
    assert "equals HF greedy on 7 of 8 prompts (differs: prompt 3 from token 85)." in text
    assert "jaxspec plain / HF greedy 3.00x, jaxspec SA / HF prompt lookup 1.75x." in text
    # The device's paths are recorded as anyone would type them: no machine's folders.
    assert ("Command: `python -m benchmarks.gpu_check --out $OUT ; python -m "
            "benchmarks.gpu_check --out $OUT --gguf m.gguf`") in text
    assert "/tmp/" not in text and "/root/" not in text
