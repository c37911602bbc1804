"""The documentation runs: the README's Python example and the research-loop example."""

import pathlib
import re
import runpy

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_readme_python_example_runs(capsys):
    block = re.search(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    namespace = {}
    exec(compile(block, "README.md", "exec"), namespace)
    out = namespace["out"]
    assert out.token_ids and out.stats["generated_tokens"] == len(out.token_ids)
    assert [g.finish_reason for g in namespace["batch"].generations]


def test_research_step_example_runs_on_the_tiny_model(capsys):
    module = runpy.run_path(str(ROOT / "examples" / "research_step.py"))
    generated = module["main"](["--tiny", "--steps", "6"])
    assert 6 <= len(generated) <= 6 * 6
    assert "mean acceptance length" in capsys.readouterr().out
