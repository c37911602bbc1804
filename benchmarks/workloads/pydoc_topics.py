"""Document QA, summarization and raw text continuation over the Python Language Reference
(`pydoc_data.topics`).

Each topic is one section of the reference (the text `help("assert")` shows), which the stdlib
ships with every interpreter. The workload asks, alternately, for a summary and for an answer that
quotes the document: the retrieval-augmented pattern where the reply repeats spans of the context.
Topics between MIN_WORDS and MAX_WORDS words are used, the ones closest to TARGET_WORDS first, so a
small `n` gets mid-sized documents.

`raw_text` is raw text continuation: the first prose paragraph of each topic (not its title, not a
grammar rule or code), fed without a chat template, and the model writes on. The prompt holds little
worth copying; what a drafter finds is what the model repeats of its own continuation, and a small
model's greedy continuation repeats a lot (SmolLM2-135M on the first two: SA accepts 83% of its
drafts), so greedy, this is not the low-repetition case. Sampled (`python -m benchmarks.harness
--workload raw_text --temperature 0.8`, each token keyed by its position, so plain and speculative
output stay identical), the continuation wanders instead: that is the low-repetition case.
"""

from pydoc_data import topics as pydoc_topics

from benchmarks.workloads.base import Conversation
from benchmarks.workloads.base import check_count

MIN_PARAGRAPH_WORDS = 40  # raw text: a paragraph of a few sentences
MIN_WORDS = 150  # shorter topics are a grammar rule and a sentence: little to summarize
MAX_WORDS = 1500  # keeps the prompt near 2k tokens, a CPU-friendly prefill
TARGET_WORDS = 600


def _request(kind: str, title: str) -> str:
    if kind == "summary":
        return "Summarize this section of the Python Language Reference in one paragraph."
    subject = "the" + title[3:] if title.startswith("The ") else title
    return (f"Using only this section of the Python Language Reference, explain what it says "
            f"about {subject}. Quote the sentences you rely on.")


def document_qa(n: int | None = None) -> list[Conversation]:
    """Summarize-or-answer prompts over reference topics (see the module docstring)."""
    n = check_count(n)
    by_size = sorted((abs(len(text.split()) - TARGET_WORDS), key)
                     for key, text in pydoc_topics.topics.items()
                     if MIN_WORDS <= len(text.split()) <= MAX_WORDS)
    conversations = []
    for i, (_, key) in enumerate(by_size[:n]):
        document = pydoc_topics.topics[key].strip()
        kind = ("summary", "question")[i % 2]
        prompt = f"{_request(kind, document.splitlines()[0])}\n\n{document}"
        conversations.append(Conversation(turns=(prompt,), name=f"document_qa/{key}:{kind}"))
    return conversations


def raw_text(n: int | None = None) -> list[Conversation]:
    """First prose paragraphs of reference topics, in topic order, to continue as raw text."""
    n = check_count(n)
    conversations = []
    for key, text in pydoc_topics.topics.items():
        # Indented paragraphs are grammar rules and code; the first paragraph is the title.
        prose = [p for p in text.strip().split("\n\n")[1:]
                 if not p.startswith(" ") and len(p.split()) >= MIN_PARAGRAPH_WORDS]
        if prose:
            conversations.append(Conversation(turns=(" ".join(prose[0].split()),), chat=False,
                                              name=f"raw_text/{key}"))
    return conversations[:n]
