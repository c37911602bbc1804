"""`make bench`'s plan: every benchmark, each writing its section, with a time estimate."""

import pytest

from benchmarks import run_all


def test_default_plan(capsys):
    assert run_all.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    steps = run_all.plan_from([])
    names = [s.name for s in steps]
    assert names == ["host_overhead", "sa_overhead", "step_floor", "census", "draft_quality",
                     "plain_vs_hf",
                     "as_user", *(f"harness:{w}" for w in run_all.WORKLOADS), "sweep",
                     "context_sweep", "equivalence:code_editing", "equivalence:mtbench", "mesh"]
    assert all(("--write" in s.argv) != ("overhead" in s.name) for s in steps)
    for s in steps[2:]:
        assert s.name in out
    for workload, n in [("code_editing", "2"), ("humaneval", "2"), ("document_qa", "1"),
                        ("long_document_qa", "1")]:
        step = steps[names.index(f"harness:{workload}")]
        assert step.argv[step.argv.index("--n") + 1] == n
    qa = steps[names.index("harness:long_document_qa")]
    assert qa.argv[qa.argv.index("--methods") + 1] == "plain,sa,ngram,auto,hf_greedy,hf_pld"
    editing = steps[names.index("harness:code_editing")].argv
    assert "--methods" not in editing and "--adaptive" in editing
    # Issue 13's settings come after the common ones, so they win.
    assert editing[len(editing) - 1 - editing[::-1].index("--max-new-tokens") + 1] == "192"
    assert editing[editing.index("--pld-draft-len") + 1] == "10"
    sampled = steps[names.index("harness:raw_text_sampled")].argv
    assert sampled[sampled.index("--workload") + 1] == "raw_text"
    assert sampled[sampled.index("--temperature") + 1] == "0.8"
    assert sampled[sampled.index("--methods") + 1] == "plain,sa,ngram,auto"
    context = steps[names.index("context_sweep")]
    assert context.argv[context.argv.index("--contexts") + 1] == "128,512,1024,2048,4096,8000"
    assert context.argv[context.argv.index("--repeats") + 1] == "2"
    assert "--write" in context.argv and "--plots" in context.argv
    # The long-context steps cost more than any other; the whole plan fits in three hours (two
    # before the sweep timed at least 512 tokens per cell, two and a
    # half before the agentic workload, two and three-quarters before the drafters' tokens per
    # step).
    assert qa.estimate_s > 10 * 60 and context.estimate_s > 20 * 60
    total = sum(s.estimate_s for s in steps)
    assert 0 < total < 3 * 60 * 60
    assert f"estimated {total / 60:.1f} min" in out


def test_long_contexts_cost_more_per_token():
    assert run_all._context_cost(500) == run_all._context_cost(1024) == 1.0
    assert run_all._context_cost(4096) == pytest.approx(2.02, abs=0.01)
    assert run_all._context_cost(8000) == pytest.approx(3.33, abs=0.01)
    short, long = (run_all.context_sweep_estimate([c], 64, 2) - run_all.LOAD_S
                   for c in (1024, 8000))
    assert long > 5 * short
    # Fewer rounds, fewer passes; the oracle left out of the harness costs its passes.
    assert (run_all.context_sweep_estimate([8000], 64, 1)
            < run_all.context_sweep_estimate([8000], 64, 2))
    everything = run_all.harness_estimate("long_document_qa", 1, 64, 3)
    without_oracle = run_all.harness_estimate("long_document_qa", 1, 64, 3,
                                              run_all.METHOD_OVERRIDES["long_document_qa"])
    assert without_oracle < everything


def test_no_write():
    steps = run_all.plan_from(["--no-write"])
    assert all("--write" not in s.argv for s in steps)
    assert [s.name for s in steps if "--no-write" in s.argv] == ["host_overhead", "sa_overhead"]


def test_skip_and_overrides():
    steps = run_all.plan_from(["--skip", "sa_overhead,harness:mtbench", "--n", "3",
                               "--workloads", "mtbench,humaneval"])
    assert [s.name for s in steps] == ["host_overhead", "step_floor", "census", "draft_quality",
                                       "plain_vs_hf", "as_user", "harness:humaneval", "sweep",
                                       "context_sweep", "equivalence:code_editing",
                                       "equivalence:mtbench", "mesh"]
    assert steps[6].argv[steps[6].argv.index("--n") + 1] == "3"
    with pytest.raises(SystemExit):
        run_all.plan_from(["--skip", "nonsense"])
    steps = run_all.plan_from(["--contexts", "128,1024", "--context-repeats", "1",
                               "--skip", "context_sweep"])
    assert "context_sweep" not in [s.name for s in steps]
    context = [s for s in run_all.plan_from(["--contexts", "128,1024", "--context-repeats", "1"])
               if s.name == "context_sweep"][0]
    assert context.argv[context.argv.index("--contexts") + 1] == "128,1024"
    assert context.argv[context.argv.index("--repeats") + 1] == "1"
