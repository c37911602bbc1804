"""The compile ledger: programs compiled in the background or at once, and the persistent cache."""

import gc
import subprocess
import sys
import threading
import time

import pytest

from jaxspec.host import compiles


class Gate:
    """A build that blocks until released, and counts its calls."""

    def __init__(self, value="program"):
        self.value, self.calls = value, 0
        self.release = threading.Event()

    def __call__(self):
        self.calls += 1
        assert self.release.wait(10)
        return self.value


def test_a_requested_program_compiles_in_the_background_and_becomes_ready():
    ledger, build = compiles.CompileLedger(), Gate()
    ledger.request("k4", build)
    assert not ledger.ready("k4") and ledger.pending("k4")
    ledger.request("k4", build)                      # asked twice: compiled once
    build.release.set()
    ledger.wait()
    assert ledger.ready("k4") and not ledger.pending("k4") and build.calls == 1
    assert ledger.get("k4", build) == "program" and build.calls == 1
    assert ledger.compiled_in_background == 1


def test_get_compiles_at_once_or_waits_for_the_compile_under_way():
    ledger = compiles.CompileLedger()
    assert ledger.get("k0", lambda: "plain") == "plain"
    assert ledger.ready("k0")
    build = Gate("k8 program")
    ledger.request("k8", build)
    threading.Timer(0.2, build.release.set).start()
    assert ledger.get("k8", lambda: pytest.fail("compiled twice")) == "k8 program"


def test_eager_compiles_what_is_asked_for_at_once_and_nests():
    ledger = compiles.CompileLedger()
    assert not ledger.is_eager
    with ledger.eager():
        with ledger.eager():
            ledger.request("k4", lambda: "k4")
            assert ledger.ready("k4")
        assert ledger.is_eager
    assert not ledger.is_eager
    ledger.request("k8", lambda: "k8")
    ledger.wait()
    assert ledger.ready("k8")


def test_a_failed_background_compile_raises_where_the_program_is_collected():
    ledger = compiles.CompileLedger()

    def broken():
        raise RuntimeError("no such program")

    ledger.request("bad", broken)
    ledger.wait()
    with pytest.raises(RuntimeError, match="no such program"):
        ledger.ready("bad")


def test_compile_times_are_measured_and_a_delay_slows_every_compile():
    ledger = compiles.CompileLedger(delay=0.2)
    assert ledger.compile_seconds() == 0.0
    start = time.perf_counter()
    ledger.get("a", lambda: "a")
    assert time.perf_counter() - start >= 0.2
    assert ledger.compile_seconds() >= 0.2


def test_first_call_is_true_once_per_program_until_forgotten():
    ledger = compiles.CompileLedger()
    ledger.get("k4", lambda: "k4")
    assert ledger.first_call("k4") and not ledger.first_call("k4")
    ledger.forget_programs()
    assert not ledger.ready("k4") and ledger.first_call("k4")


def test_forgetting_drops_queued_compiles_and_waits_for_the_one_under_way():
    ledger, under_way, queued = compiles.CompileLedger(), Gate("k4"), Gate("k8")
    ledger.request("k4", under_way)
    ledger.request("k8", queued)
    while not under_way.calls:          # the worker has taken k4
        time.sleep(0.01)
    threading.Timer(0.2, under_way.release.set).start()
    ledger.forget_programs()
    assert under_way.calls == 1 and queued.calls == 0
    assert not ledger.pending("k8") and not ledger.ready("k4") and not ledger.ready("k8")


def _cache_dir_after(code: str, env: dict) -> str:
    script = ("import jax\nfrom jaxspec.host import compiles\n" + code
              + "\nprint(jax.config.jax_compilation_cache_dir)")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, check=True)
    return out.stdout.strip().splitlines()[-1]


def test_the_persistent_cache_is_on_by_default_and_a_user_setting_wins(tmp_path, monkeypatch):
    import os

    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    env["JAXSPEC_CACHE"] = str(tmp_path / "home")
    on = _cache_dir_after("compiles.enable_persistent_cache(compiles.default_cache_dir())", env)
    assert on == str(tmp_path / "home" / "xla") and (tmp_path / "home" / "xla").is_dir()
    off = _cache_dir_after("compiles.enable_persistent_cache('')", env)
    assert off in ("", "None")
    mine = _cache_dir_after("compiles.enable_persistent_cache(compiles.default_cache_dir())",
                            {**env, "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "mine")})
    assert mine == str(tmp_path / "mine")


def test_a_compile_moves_what_the_process_holds_out_of_the_collectors_walks():
    ledger, kept = compiles.CompileLedger(), []

    def build():                                 # a trace leaves objects in jit's caches
        kept.extend([i] for i in range(1000))
        return "k2"

    gc.unfreeze()
    try:
        assert ledger.get("k2", build) == "k2"
        assert gc.get_freeze_count() >= 1000
    finally:
        gc.unfreeze()


def test_a_background_compile_switches_threads_often_and_restores_the_interval():
    ledger, seen, before = compiles.CompileLedger(), [], sys.getswitchinterval()

    def build():
        seen.append(sys.getswitchinterval())
        return "program"

    ledger.get("k0", build)                       # at once, on the main thread
    ledger.request("k1", build)
    ledger.wait()
    assert seen == [before, pytest.approx(compiles.SWITCH_INTERVAL_S)]
    assert sys.getswitchinterval() == before


def test_get_compiles_a_queued_program_itself_instead_of_waiting_behind_the_queue():
    ledger, blocker, threads = compiles.CompileLedger(), Gate("k1"), []
    ledger.request("k1", blocker)                    # under way: the worker is busy with it
    ledger.request("k2", lambda: threads.append("worker") or "from the queue")
    assert ledger.get("k2", lambda: threads.append("caller") or "k2") == "k2"
    blocker.release.set()
    ledger.wait()
    assert threads == ["caller"] and ledger.ready("k1") and ledger.get("k2", None) == "k2"
