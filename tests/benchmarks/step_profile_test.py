"""The profile section's two readers, on hand-written inputs with hand-counted answers: the
census of a compiled module's HLO text and the summary of a profiler trace; and one real key on
the tiny model."""

import jax
import pytest

from benchmarks import step_profile
from jaxspec.models import tiny

HLO = """\
HloModule jit_step, is_scheduled=true

%fused_computation (param_0: f32[4]) -> f32[4] {
  %param_0 = f32[4]{0} parameter(0)
  ROOT %negate = f32[4]{0} negate(%param_0)
}

%body (p: (s32[], f32[4])) -> (s32[], f32[4]) {
  %p = (s32[], f32[4]{0}) parameter(0)
  %x = f32[4]{0} get-tuple-element(%p), index=1
  %loop_fusion = f32[4]{0} fusion(%x), kind=kLoop, calls=%fused_computation
  %i = s32[] get-tuple-element(%p), index=0
  ROOT %t = (s32[], f32[4]{0}) tuple(%i, %loop_fusion)
}

%cond (p.1: (s32[], f32[4])) -> pred[] {
  %p.1 = (s32[], f32[4]{0}) parameter(0)
  %i.1 = s32[] get-tuple-element(%p.1), index=0
  %c = s32[] constant(3)
  ROOT %lt = pred[] compare(%i.1, %c), direction=LT
}

%command_buffer (a: f32[4]) -> f32[4] {
  %a = f32[4]{0} parameter(0)
  ROOT %gemm = f32[4]{0} custom-call(%a), custom_call_target="__cublas$gemm"
}

ENTRY %main.1 (Arg_0: f32[4], Arg_1: bf16[2,3,16,1,8]) -> f32[4] {
  %Arg_0 = f32[4]{0} parameter(0)
  %Arg_1 = bf16[2,3,16,1,8]{4,3,2,1,0} parameter(1)
  %kv = bf16[2,3,16,1,8]{4,3,2,1,0} copy(%Arg_1)
  %pallas = f32[4]{0} custom-call(%Arg_0), custom_call_target="__gpu$xla.gpu.triton"
  %gemm_fusion = f32[4]{0} fusion(%pallas), kind=kCustom, calls=%fused_computation, \
backend_config={"fusion_backend_config":{"kind":"__triton_nested_gemm_fusion"}}
  %cb = f32[4]{0} call(%gemm_fusion), to_apply=%command_buffer
  %zero = s32[] constant(0)
  %init = (s32[], f32[4]{0}) tuple(%zero, %cb)
  %known = (s32[], f32[4]{0}) while(%init), condition=%cond, body=%body, \
backend_config={"known_trip_count":{"n":"3"}}
  %unknown = (s32[], f32[4]{0}) while(%known), condition=%cond, body=%body
  ROOT %out = f32[4]{0} get-tuple-element(%unknown), index=1
}
"""


def test_census_counts_what_one_call_launches():
    counts = step_profile.census(HLO, kv_shape=(2, 3, 16, 1, 8))
    # copy, triton call, gemm fusion, the graph's gemm; per loop its body's fusion and its
    # condition's compare (the predicate a loop copies to the host each iteration).
    assert counts["kernels"] == 8
    assert counts["by_opcode"] == {"custom-call": 2, "fusion": 3, "compare": 2, "copy": 1}
    assert counts["custom_calls"] == {"__gpu$xla.gpu.triton": 1, "__cublas$gemm": 1}
    assert counts["gemms"] == 2
    assert (counts["copies"], counts["kv_copies"]) == (1, 1)
    assert [(w["name"], w["trip_count"], w["kernels_per_iteration"])
            for w in counts["while_loops"]] == [("known", 3, 2), ("unknown", None, 2)]
    assert (counts["command_buffers"], counts["kernels_in_command_buffers"]) == (1, 1)


def test_census_needs_an_entry():
    with pytest.raises(ValueError, match="ENTRY"):
        step_profile.census(HLO.replace("ENTRY ", ""))


def _event(line, name, start, duration, plane="/device:GPU:0"):
    return step_profile.Event(plane, line, name, start, duration)


def test_trace_summary_per_step():
    stream = "Stream #14(Compute)"
    events = [
        # Two steps of 3 kernels; two overlap, so busy time counts their union once.
        _event(stream, "gemm", 0, 100), _event(stream, "attention", 50, 100),
        _event(stream, "gemm", 400, 100), _event(stream, "attention", 500, 300),
        _event(stream, "norm", 1000, 20), _event(stream, "norm", 1100, 20),
        _event("XLA Ops", "fusion.1", 0, 5000),                 # annotations, not kernels
        _event("python3", "cuGraphLaunch (CudaGraph:2)", 0, 3000, plane="/host:CPU"),
        _event("python3", "cuGraphLaunch (CudaGraph:2)", 5000, 1000, plane="/host:CPU"),
        _event("python3", "command_buffer::update", 0, 2000, plane="/host:CPU"),
        _event("python3", "[0] GpuExecutable::ExecuteThunks", 0, 6000, plane="/host:CPU"),
    ]
    summary = step_profile.summarize_trace(events, steps=2, wall_s=4e-3)
    assert summary["kernels_per_step"] == 3
    assert summary["busy_ms_per_step"] == pytest.approx((150 + 400 + 40) / 2 / 1e6)
    assert summary["wall_ms_per_step"] == pytest.approx(2.0)
    assert [k["name"] for k in summary["top_kernels"]] == ["attention", "gemm", "norm"]
    assert summary["top_kernels"][0]["us_per_step"] == pytest.approx(0.2)
    assert summary["graph_launches_per_step"] == 1
    assert summary["graph_launch_ms_per_step"] == pytest.approx(2e-3)
    assert summary["graph_update_ms_per_step"] == pytest.approx(1e-3)
    assert summary["host_execute_ms_per_step"] == pytest.approx(3e-3)


def test_a_cpu_trace_has_no_kernels():
    summary = step_profile.summarize_trace(
        [_event("python3", "PjitFunction(step)", 0, 10, plane="/host:CPU")], 1, 1e-3)
    assert summary["kernels_per_step"] is None and summary["top_kernels"] == []


def test_one_key_on_the_tiny_model(tmp_path):
    row = step_profile.profile_key(tiny.tiny_model(seed=0), batch=1, k=2, context=40,
                                   repeats=2, dump=tmp_path / "key")
    assert row["census"]["kernels"] > 0
    assert row["synced_ms"] > 0 and row["pipelined_ms"] > 0
    assert row["trace"]["steps"] == step_profile.TRACE_STEPS
    assert (tmp_path / "key.hlo.txt").read_text().startswith("HloModule")
    assert jax.default_backend() != "cpu" or row["trace"]["kernels_per_step"] is None
