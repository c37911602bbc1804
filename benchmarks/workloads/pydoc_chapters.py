"""Long-document QA: questions whose answers quote a 4k-8k-token document.

Each document is a chapter of the Python Language Reference put together from consecutive
`pydoc_data.topics` sections (the text `help("try")` shows, shipped with every interpreter), so
the prompt is 4,000 to 8,000 tokens of real text, the long-context end of retrieval-augmented
chat. The question names one section in the middle of the chapter and asks for its opening
verbatim, or for an answer backed by quotes from it: the reply repeats long spans of a context far
from the question, what prompt lookup and the suffix automaton are built for.

A chapter takes its sections in order while its estimated length stays under MAX_TOKENS; one that
ends below MIN_TOKENS (sections this Python lacks) is left out. Lengths are estimated at
CHARS_PER_TOKEN characters per token, SmolLM2's rate on this text, with room to spare at both
ends.
"""

from pydoc_data import topics as pydoc_topics

from benchmarks.workloads.base import Conversation
from benchmarks.workloads.base import check_count

# SmolLM2's tokenizer gives 4.1 characters per token on pydoc_data.topics (Python 3.11).
CHARS_PER_TOKEN = 4.1
MIN_TOKENS = 4500  # estimated document tokens; the prompt adds ~60 (template and question)
MAX_TOKENS = 7600  # prompt + reply stay within SmolLM2's 8,192-token context
# (chapter name, its sections in reading order). The section asked about is the longest one between
# the chapter's first and last, so the answer sits mid-document, far from the question.
CHAPTERS = (
    ("simple statements", ("assert", "pass", "del", "return", "yield", "raise", "break",
                           "continue", "import", "global", "nonlocal", "assignment")),
    ("compound statements", ("if", "while", "for", "try", "with", "context-managers", "function",
                             "class", "async")),
    ("expressions", ("atom-identifiers", "atom-literals", "attribute-references",
                     "subscriptions", "slicings", "calls", "await", "power", "unary", "binary",
                     "shifting", "bitwise", "comparisons", "booleans", "lambda", "exprlists")),
    ("sequence types", ("truth", "typesseq", "typesseq-mutable")),
    ("execution model", ("execmodel", "naming", "identifiers", "dynamic-features", "exceptions",
                         "id-classes", "objects")),
    ("mappings and other built-in types", ("typesmapping", "dict", "typesfunctions",
                                           "typesmethods", "typesmodules", "bltin-code-objects",
                                           "bltin-type-objects", "bltin-null-object",
                                           "bltin-ellipsis-object", "specialattrs",
                                           "numeric-types")),
)
KINDS = ("quote", "answer")


def estimated_tokens(text: str) -> int:
    return round(len(text) / CHARS_PER_TOKEN)


def chapter_sections(keys: tuple[str, ...]) -> list[str]:
    """The sections of a chapter that this Python has and that fit MAX_TOKENS, in order."""
    taken, chars = [], 0
    for key in keys:
        text = pydoc_topics.topics.get(key)
        if text is None:
            continue
        if (chars + len(text)) / CHARS_PER_TOKEN > MAX_TOKENS:
            break
        taken.append(key)
        chars += len(text)
    return taken


def title(key: str) -> str:
    """A section's title: the first line of its text, e.g. 'The "try" statement'."""
    return pydoc_topics.topics[key].strip().splitlines()[0].strip()


def _question(kind: str, section: str) -> str:
    if kind == "quote":
        return (f"Quote the first two paragraphs of the section {section!r} from the document "
                "above, word for word, then explain them in one sentence.")
    return (f"Using only the document above, explain what the section {section!r} says. Support "
            "every point with a sentence copied exactly from that section.")


def long_document_qa(n: int | None = None) -> list[Conversation]:
    """One question per chapter, quoting or answering with quotes (see the module docstring)."""
    n = check_count(n)
    conversations = []
    for name, keys in CHAPTERS:
        if n is not None and len(conversations) == n:
            break
        sections = chapter_sections(keys)
        document = "\n\n".join(pydoc_topics.topics[key].strip() for key in sections)
        if estimated_tokens(document) < MIN_TOKENS:
            continue
        kind = KINDS[len(conversations) % len(KINDS)]
        target = max(sections[1:-1] or sections, key=lambda key: len(pydoc_topics.topics[key]))
        prompt = (f"The Python Language Reference, {name}:\n\n{document}\n\n"
                  f"{_question(kind, title(target))}")
        conversations.append(Conversation(turns=(prompt,),
                                          name=f"long_document_qa/{target}:{kind}"))
    return conversations
