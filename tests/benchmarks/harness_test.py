"""The harness: protocol and arithmetic on scripted passes, then the real loop on the tiny model."""

import dataclasses
import json

import numpy as np
import pytest

from benchmarks import harness
from benchmarks import oracle
from benchmarks import runs
from benchmarks import workloads
from jaxspec import config as config_lib
from jaxspec.models import tiny

PROMPTS = [[1, 2, 3], [4, 5]]
TRUTH = [[7] * 10, [8] * 6]
# Wall seconds of the warm-up, then rounds 1-3. Per-round SA/plain ratios are 1, 4, 1 (median 1)
# while the ratio of median tokens/s would be 4: speedups must come from the rounds.
WALLS = {"plain": [9.0, 1.0, 4.0, 4.0], "sa": [9.0, 1.0, 1.0, 4.0],
         "hf_greedy": [2.0, 2.0, 2.0], "hf_pld": [1.0, 1.0, 1.0]}


def method_of(spec) -> str:
    if spec is None:
        return "plain"
    if isinstance(spec, oracle.OracleDrafter):
        return "oracle"
    if isinstance(spec, config_lib.SAConfig) and spec.selection == "frequent":
        return "sa_tree" if spec.tree_budget else "sa_frequent"
    return {config_lib.SAConfig: "sa", config_lib.NGramConfig: "ngram",
            config_lib.AutoConfig: "auto"}[type(spec)]


class Script:
    """Stands in for `runs.run_jaxspec` / `runs.run_hf`: scripted outputs and wall times."""

    def __init__(self, corrupt=(), compiles=None):
        self.calls = {}
        self.corrupt = set(corrupt)        # (method, prompt) pairs whose output is wrong
        self.lookups = []
        self.compiles = compiles or {}     # method -> compilations of its 1st, 2nd, ... pass

    def run(self, method, prefill_s):
        n = self.calls.get(method, 0)
        self.calls[method] = n + 1
        outputs = [list(t) for t in TRUTH]
        for m, i in self.corrupt:
            if m == method:
                outputs[i][3] += 1
        walls = WALLS.get(method, [9.0, 2.0, 2.0, 2.0])
        stats = None
        if method not in harness.HF_METHODS:
            stats = dict(mean_step_time_ms=10.0, drafting_overhead_ms_per_step=0.1,
                         acceptance_rate=0.5, mean_acceptance_length=2.0, k_mean=5.0,
                         acceptance_length_histogram={"1": 2, "3": 2}, decode_steps=4,
                         per_position_acceptance=[0.5])
        compiles = self.compiles.get(method, [])
        return runs.Run(outputs=outputs, wall_s=walls[min(n, len(walls) - 1)],
                        prefill_s=prefill_s, stats=stats,
                        compiles=compiles[n] if n < len(compiles) else 0)

    def jaxspec(self, model, tokenizer, prompts, *, spec, max_new_tokens, scheduler, **sampling):
        assert [list(p) for p in prompts] == PROMPTS
        self.sampling = sampling
        if isinstance(spec, oracle.OracleDrafter):
            assert spec.continuations == {tuple(p): t for p, t in zip(PROMPTS, TRUTH, strict=True)}
        return self.run(method_of(spec), 0.5)

    def hf(self, hf, prompts, *, max_new_tokens, stops, prompt_lookup_num_tokens=None,
           prefill_s=None):
        self.lookups.append(prompt_lookup_num_tokens)
        return self.run("hf_pld" if prompt_lookup_num_tokens else "hf_greedy", prefill_s)


class FakeHF:
    threads_note = "2 threads"

    def __init__(self):
        self.prompt_lengths = []

    def generate(self, prompt, *, max_new_tokens, stop_ids, prompt_lookup_num_tokens=None):
        self.prompt_lengths.append(len(prompt))
        return [0] * min(max_new_tokens, 2)


@pytest.fixture
def scripted(monkeypatch):
    def install(corrupt=(), compiles=None):
        script = Script(corrupt, compiles)
        monkeypatch.setattr(runs, "run_jaxspec", script.jaxspec)
        monkeypatch.setattr(runs, "run_hf", script.hf)
        return script
    return install


def test_config_validation_and_normalisation():
    cfg = harness.BenchConfig(methods=("oracle", "sa"))
    assert cfg.methods == ("plain", "sa", "oracle")           # plain added, METHODS order
    assert cfg.section == "bench_code_editing"
    assert harness.BenchConfig(workload="mtbench", batch_size=4).section == "bench_mtbench_b4"
    for kwargs, match in [(dict(workload="nope"), "unknown workload"),
                          (dict(methods=("sa", "medusa")), "unknown methods"),
                          (dict(n=0), "n must be"), (dict(repeats=True), "repeats must be"),
                          (dict(max_draft_len=1.5), "max_draft_len must be"),
                          (dict(pld_draft_len=0), "pld_draft_len must be"),
                          (dict(temperature=-0.5), "temperature must be"),
                          (dict(temperature=True), "temperature must be")]:
        with pytest.raises(ValueError, match=match):
            harness.BenchConfig(**kwargs)


def test_spec_for_each_method():
    assert harness.spec_for("plain", 5) is None
    assert harness.spec_for("sa", 4) == config_lib.SAConfig(max_draft_len=4)
    assert harness.spec_for("ngram", 4).max_draft_len == 4
    assert harness.spec_for("auto", 4) == config_lib.AutoConfig()
    assert harness.spec_for("sa", 16, adaptive=True) == config_lib.SAConfig(max_draft_len=16,
                                                                             adaptive=True)
    assert harness.spec_for("ngram", 8, adaptive=True).adaptive
    assert harness.spec_for("sa_frequent", 16, adaptive=True) == config_lib.SAConfig(
        max_draft_len=16, adaptive=True, selection="frequent")
    assert harness.spec_for("auto", None, adaptive=True) == config_lib.AutoConfig()
    assert harness.spec_for("sa_tree", 16) == config_lib.SAConfig(
        max_draft_len=16, selection="frequent", tree_budget=32)
    assert harness.spec_for("sa_tree", 8, tree_budget=12).tree_budget == 12


def test_prompt_lookup_draft_length_apart(scripted):
    script = scripted()
    cfg = harness.BenchConfig(methods=("sa", "hf_pld"), repeats=1, max_draft_len=16,
                              adaptive=True, pld_draft_len=10)
    results = harness.compare(None, None, PROMPTS, cfg, hf=FakeHF(), progress=False)
    assert set(script.lookups) == {10}
    assert "K=16 (SA and NGram adaptive, up to K), HF prompt lookup K=10" in harness.markdown(
        results)


def test_protocol_and_arithmetic(scripted):
    script = scripted()
    cfg = harness.BenchConfig(methods=harness.METHODS, repeats=3, max_draft_len=3)
    results = harness.compare(None, None, PROMPTS, cfg, hf=FakeHF(), progress=False)
    # One warm-up per jaxspec method plus the rounds; HF warms up outside the scripted passes.
    assert script.calls == {"plain": 4, "sa": 4, "sa_frequent": 4, "sa_tree": 4, "ngram": 4,
                            "auto": 4, "oracle": 4, "hf_greedy": 3, "hf_pld": 3}
    assert set(script.lookups) == {None, 3}
    m = results["methods"]
    assert list(m) == list(harness.METHODS)
    assert m["plain"]["tokens_per_s_runs"] == [16.0, 4.0, 4.0]
    assert m["sa"]["speedup"] == 1.0                           # median of 1, 4, 1
    assert m["sa"]["tokens_per_s"] == 16.0
    assert m["plain"]["first_pass_s"] == 9.0 and m["hf_pld"]["first_pass_s"] is None
    assert m["plain"]["prefill_s"] == 0.5
    # decode tok/s: (16 - 2 first tokens) / (wall - 0.5 s prefill).
    assert m["plain"]["decode_tokens_per_s"] == pytest.approx(14 / 3.5)
    assert m["sa"]["drafting_overhead_pct"] == pytest.approx(1.0)
    assert harness.ratio(results, "hf_pld", "hf_greedy") == 2.0
    assert harness.ratio(results, "sa", "oracle") == pytest.approx(1.0 / m["oracle"]["speedup"])
    assert harness.ratio(results, "sa", "missing") is None
    # decode tok/s per round: plain 28, 4, 4 and SA 28, 28, 4.
    assert harness.ratio(results, "sa", "plain", decode=True) == pytest.approx(1.0)
    assert results["mismatches"] == []
    # Copied drafts per step at K=3: 7 once seen, then 7 7 7 and the last 2 (1, 3, 2); 8 once
    # seen, then 8 8 (1, 2): 9 over 5 steps, plus each step's bonus token.
    assert results["copy_bound_acceptance_length"] == pytest.approx(1 + 9 / 5)
    json.dumps(results)
    text = harness.markdown(results)
    assert "accepts at most 2.80 tokens per step at K=3" in text
    assert sum(line.startswith("| jaxspec") or line.startswith("| HF") for line in
               text.splitlines()) == len(harness.METHODS)
    assert "token-identical" in text
    goals = harness.goal_lines(results)
    assert any("SA / HF prompt lookup" in g and "decode only: " in g for g in goals)
    assert any("drafting overhead: 1.00%" in g and ": met;" in g for g in goals)


def test_adaptive_methods_warm_up_until_nothing_compiles(scripted):
    script = scripted(compiles={"auto": [5, 2, 1, 0, 0, 0], "sa": [3, 1, 0, 0, 0],
                                "plain": [2, 0, 0, 0]})
    cfg = harness.BenchConfig(methods=("sa", "auto"), repeats=2)
    results = harness.compare(None, None, PROMPTS, cfg, progress=False)
    # sa is not adaptive here: one warm-up; auto warms up MAX_WARMUPS times, still compiling.
    assert script.calls == {"plain": 3, "sa": 3, "auto": harness.MAX_WARMUPS + 2}
    m = results["methods"]
    assert (m["sa"]["compiles_warmup"], m["sa"]["compiles_timed"]) == (3, 1)
    assert (m["auto"]["compiles_warmup"], m["auto"]["compiles_timed"]) == (8, 0)
    script = scripted(compiles={"sa": [3, 0, 1, 0]})
    results = harness.compare(None, None, PROMPTS, dataclasses.replace(cfg, adaptive=True),
                              progress=False)
    assert script.calls["sa"] == 2 + 2                      # stopped once a pass compiled nothing
    sa = results["methods"]["sa"]
    assert (sa["compiles_warmup"], sa["compiles_timed"]) == (3, 1)


def test_mismatches_are_reported_once_against_the_right_reference(scripted, capsys):
    scripted(corrupt=[("ngram", 1), ("hf_pld", 0)])
    cfg = harness.BenchConfig(methods=("ngram", "hf_greedy", "hf_pld"), repeats=2)
    results = harness.compare(None, None, PROMPTS, cfg, hf=FakeHF(), progress=False)
    assert results["mismatches"] == [
        dict(method="ngram", reference="plain", prompt=1, position=3, when="warm-up"),
        dict(method="hf_pld", reference="hf_greedy", prompt=0, position=3, when="round 1")]
    assert capsys.readouterr().err.count("MISMATCH") == 2
    assert "Token mismatches" in harness.markdown(results)


def test_long_document_qa_goals(scripted):
    scripted(corrupt=[("sa", 0)])
    cfg = harness.BenchConfig(workload="long_document_qa", repeats=1,
                              methods=("sa", "hf_greedy", "hf_pld"))
    results = harness.compare(None, None, PROMPTS, cfg, hf=FakeHF(), progress=False)
    goals = harness.goal_lines(results)
    assert goals[0].startswith("- jaxspec SA / jaxspec plain: ") and "goal >= 1.5" in goals[0]
    assert goals[1].startswith("- jaxspec SA / HF prompt lookup: ") and "goal >= 1.3" in goals[1]
    assert goals[2] == "- jaxspec SA token-identical to jaxspec plain: no (goal: not met)"
    assert "Goals (issue 12; AUTO vs plain: issue 13; drafting overhead: issue 6):" in (
        harness.markdown(results))


def test_label_and_a_short_hf_warm_up(scripted, monkeypatch):
    scripted()
    monkeypatch.setattr(harness, "HF_WARMUP_TOKENS", 2)
    hf = FakeHF()
    cfg = harness.BenchConfig(repeats=1, methods=("hf_greedy",))
    results = harness.compare(None, None, PROMPTS, cfg, hf=hf, progress=False, label="ctx 3")
    assert results["workload"] == "ctx 3"
    # Warm-up after the prompt's last 2 tokens; prefill timed on whole prompts (3 samples each).
    assert hf.prompt_lengths == [2] + [3] * 3 + [2] * 3


def test_without_hf_the_hf_methods_are_left_out(scripted):
    scripted()
    results = harness.compare(None, None, PROMPTS, harness.BenchConfig(repeats=1), hf=None,
                              progress=False)
    assert list(results["methods"]) == ["plain", "sa", "sa_frequent", "sa_tree", "ngram", "auto",
                                        "oracle"]


def test_sampled_runs_key_every_method_and_leave_hf_out(scripted):
    script = scripted()
    cfg = harness.BenchConfig(workload="raw_text", methods=("sa", "hf_greedy"), repeats=1,
                              temperature=0.8)
    assert cfg.section == "bench_raw_text_t0.8"
    results = harness.compare(None, None, PROMPTS, cfg, hf=FakeHF(), progress=False)
    assert list(results["methods"]) == ["plain", "sa"] and "hf_greedy" not in script.calls
    assert script.sampling == dict(temperature=0.8, seed=harness.SAMPLING_SEED)
    assert ", sampled at temperature 0.8" in harness.markdown(results).splitlines()[0]
    harness.compare(None, None, PROMPTS, dataclasses.replace(cfg, temperature=0.0),
                    progress=False)
    assert script.sampling == {}


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_real_loop_on_the_tiny_model(temperature):
    model = tiny.tiny_model(seed=0)
    rng = np.random.default_rng(0)
    motif = [int(t) for t in rng.integers(0, 128, 9)]
    prompts = [motif * 3, [int(t) for t in rng.integers(0, 128, 20)]]
    cfg = harness.BenchConfig(methods=("ngram", "oracle"), max_new_tokens=12, repeats=1,
                              temperature=temperature)
    results = harness.compare(model, None, prompts, cfg, progress=False)
    m = results["methods"]
    assert results["mismatches"] == []
    assert m["oracle"]["acceptance_rate"] == 1.0
    assert m["plain"]["acceptance_rate"] is None and m["plain"]["mean_acceptance_length"] == 1.0
    assert m["plain"]["generated_tokens"] == 24
    # The warm-up compiled every shape the timed pass needs.
    assert all(r["compiles_timed"] == 0 for r in m.values())
    assert m["plain"]["compiles_warmup"] > 0


def test_cli_dispatches_and_skips_missing_workloads(monkeypatch, capsys):
    with pytest.raises(SystemExit) as exit_:
        harness.main(["sweep", "--help"])
    assert exit_.value.code == 0
    assert "benchmarks.sweep" in capsys.readouterr().out

    def unavailable(cfg, **_):
        raise workloads.WorkloadUnavailable("pip install it")

    written = []
    monkeypatch.setattr(harness, "bench", unavailable)
    monkeypatch.setattr(harness.report, "write_section",
                        lambda name, text, command: written.append((name, text)))
    assert harness.main(["--workload", "humaneval", "--write"]) == 0
    assert "pip install it" in capsys.readouterr().err
    assert written == [("bench_humaneval", "## Workload `humaneval`\n\nSkipped: pip install it")]
    with pytest.raises(ValueError, match="unknown methods"):
        harness.main(["--methods", "sa,bogus"])
