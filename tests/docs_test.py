"""The documentation runs: the README's Python example and the research-loop example."""

import pathlib
import re
import runpy

import pytest

from jaxspec.host import compiles

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture
def fresh_ledger(monkeypatch):
    """The compile ledger of a fresh process, which is where a reader runs the example: nothing
    compiled, and no background compile of an earlier test's programs still running. Its queued
    compiles are dropped at the end: they would run on beside the next test (~40 s of the
    README example's widths)."""
    ledger = compiles.CompileLedger()
    monkeypatch.setattr(compiles, "LEDGER", ledger)
    yield
    ledger.forget_programs()


@pytest.mark.slow
def test_readme_python_example_runs(capsys, fresh_ledger):
    block = re.search(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    namespace = {}
    exec(compile(block, "README.md", "exec"), namespace)
    out = namespace["out"]
    assert out.token_ids and out.stats["generated_tokens"] == len(out.token_ids)
    # AUTO's drafts were verified, and the output is what plain greedy decoding gives.
    assert out.stats["drafted"] > 0
    engine, edit = namespace["engine"], namespace["edit"]
    plain = engine.generate(edit, max_new_tokens=len(out.token_ids), spec="none")
    assert plain.token_ids == out.token_ids
    assert all(g.finish_reason in ("stop", "length") for g in namespace["batch"].generations)
    assert namespace["batch"].stats["drafted"] > 0
    printed = capsys.readouterr().out
    assert printed.strip(), "the README example prints its outputs"


@pytest.mark.extended      # the README's example above runs the same API on the same model
def test_api_example_runs(capsys):
    module = runpy.run_path(str(ROOT / "examples" / "api.py"))
    out, custom, enhanced = module["main"]()
    assert out.token_ids and custom.stats["drafted"] > 0
    # The enhancer's automaton finds the function being copied; a repeat-last drafter alone
    # rarely gets anything accepted there.
    assert enhanced.stats["accepted"] > custom.stats["accepted"]
    assert "enhanced drafter" in capsys.readouterr().out


def test_research_step_example_runs_on_the_tiny_model(capsys):
    module = runpy.run_path(str(ROOT / "examples" / "research_step.py"))
    generated = module["main"](["--tiny", "--steps", "6"])
    assert 6 <= len(generated) <= 6 * 6
    assert "mean acceptance length" in capsys.readouterr().out


@pytest.mark.slow
def test_readme_token_tree_example_runs(fresh_ledger):
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    block = next(b for b in blocks if "tree_budget" in b)
    namespace = {}
    exec(compile(block, "README.md", "exec"), namespace)
    assert namespace["engine"].executor.stats.drafted > 0
