"""`make bench`'s plan: every benchmark, each writing its section, with a time estimate."""

import pytest

from benchmarks import run_all


def test_default_plan(capsys):
    assert run_all.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    steps = run_all.plan_from([])
    names = [s.name for s in steps]
    assert names == ["host_overhead", "sa_overhead", "plain_vs_hf",
                     *(f"harness:{w}" for w in run_all.WORKLOADS), "sweep"]
    assert all(("--write" in s.argv) != ("overhead" in s.name) for s in steps)
    for s in steps[2:]:
        assert s.name in out
    for workload, n in [("code_editing", "2"), ("humaneval", "2"), ("document_qa", "1")]:
        step = steps[names.index(f"harness:{workload}")]
        assert step.argv[step.argv.index("--n") + 1] == n
    total = sum(s.estimate_s for s in steps)
    assert 0 < total < 60 * 60  # the default plan fits in an hour
    assert f"estimated {total / 60:.1f} min" in out


def test_no_write():
    steps = run_all.plan_from(["--no-write"])
    assert all("--write" not in s.argv for s in steps)
    assert [s.name for s in steps if "--no-write" in s.argv] == ["host_overhead", "sa_overhead"]


def test_skip_and_overrides():
    steps = run_all.plan_from(["--skip", "sa_overhead,harness:mtbench", "--n", "3",
                               "--workloads", "mtbench,humaneval"])
    assert [s.name for s in steps] == ["host_overhead", "plain_vs_hf", "harness:humaneval",
                                       "sweep"]
    assert steps[2].argv[steps[2].argv.index("--n") + 1] == "3"
    with pytest.raises(SystemExit):
        run_all.plan_from(["--skip", "nonsense"])
