"""Agentic editing: a coding agent's session over one stdlib function, three edits in a row.

Where suffix drafting pays most: an agent loop hands the model a file, then asks for edit after edit
of what the model itself last wrote, and every reply rewrites the whole function. The measured reply
(the third) can copy the function from three places: the file as the tool read it and the agent's
two rewrites, which differ from the file and from each other where the edits applied, so the first
occurrence of a match is often not the one to follow.

Each conversation takes one function of `stdlib_code.FUNCTIONS`, from the end of the list
(code_editing starts at the front), exactly as this Python ships it (`inspect.getsource`): 10 to
`MAX_LINES` lines, so that a rewrite fits a 192-token reply more often, with two names to rename
(`stdlib_code.rename_candidates`) and no `verbose` yet. The turns, each a tool result and the next
instruction, as an agent framework writes them:

1. `read_file` returns the function; rename its most used name to `<name>_value`.
2. the tests pass; add a keyword-only `verbose=False` that prints the arguments, to the latest
   version.
3. the linter flags the second most used name; rename it as well, keeping both earlier edits.
"""

import inspect
import textwrap

from benchmarks.workloads import stdlib_code
from benchmarks.workloads.base import Conversation
from benchmarks.workloads.base import check_count

MAX_LINES = 40
SYSTEM = ("You are a coding agent working in a Python repository. Answer every request with the "
          "whole edited function in one Python code block.")


def _turns(function: str, source: str, first_line: int, renames: list[str]) -> tuple[str, ...]:
    module, qualname = function.split(":")
    what = "method" if "." in qualname else "function"
    path = module.replace(".", "/") + ".py"
    last_line = first_line + len(source.splitlines()) - 1
    (a, b), new = renames[:2], [name + stdlib_code.RENAME_SUFFIX for name in renames[:2]]
    verbose = stdlib_code.NEW_PARAMETER
    return (
        f"Tool result (read_file {path}, lines {first_line}-{last_line}):\n\n"
        f"```python\n{source.rstrip()}\n```\n\n"
        f"Rename the variable `{a}` to `{new[0]}` in `{qualname}`. Change nothing else, and "
        f"output the whole {what}.",
        f"Tool result (run_tests): all tests passed.\n\n"
        f"Now add a keyword-only parameter `{verbose}=False` to your latest version of "
        f"`{qualname}`. When `{verbose}` is true, print the {what}'s arguments on entry. Keep "
        f"the rename, change nothing else, and output the whole {what}.",
        f"Tool result (lint {path}): the name `{b}` is unclear.\n\n"
        f"Rename the variable `{b}` to `{new[1]}` in your latest version of `{qualname}`, "
        f"keeping both earlier edits. Change nothing else, and output the whole {what}.",
    )


def agentic(n: int | None = None) -> list[Conversation]:
    """Three-turn agent sessions over stdlib functions (see the module docstring)."""
    n = check_count(n)
    conversations = []
    for function in reversed(stdlib_code.FUNCTIONS):
        if n is not None and len(conversations) == n:
            break
        obj = stdlib_code.resolve(function)
        if obj is None:
            continue
        lines, first_line = inspect.getsourcelines(obj)
        source = textwrap.dedent("".join(lines))
        if not stdlib_code.MIN_LINES <= len(lines) <= MAX_LINES:
            continue
        node = stdlib_code.parse_function(source)
        renames = stdlib_code.rename_candidates(node)
        if len(renames) < 2 or stdlib_code.NEW_PARAMETER in stdlib_code.identifiers(node):
            continue
        conversations.append(Conversation(turns=_turns(function, source, first_line, renames),
                                          system=SYSTEM, name=f"agentic/{function}"))
    return conversations
