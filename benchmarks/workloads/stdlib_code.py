"""Code editing: rewrite a real CPython stdlib function with one small change.

This is the workload model-free drafting is best at: the answer copies the function from the prompt
except where the edit applies. The functions come from the running interpreter's own stdlib through
`inspect.getsource`, so the text is exactly what ships with this Python; a function that this Python
version lacks, or that has grown outside 10..60 lines, is skipped.

Two kinds of edit alternate down the list (each falls back to the other where it cannot apply):
- rename: the most frequent local name (parameter or assigned variable, not `self`/`cls`) found by
  `ast`, renamed to `<name>_value`;
- add_parameter: a keyword-only `verbose=False` that prints the arguments on entry.
"""

import ast
import collections
import dataclasses
import inspect
import pkgutil
import textwrap

from benchmarks.workloads.base import Conversation
from benchmarks.workloads.base import check_count

# `module:qualname`, in the order the workload returns them. The first is the demo prompt: its
# rename touches 14 lines, the case where prompt lookup shines.
FUNCTIONS = (
    "textwrap:dedent",
    "textwrap:TextWrapper._handle_long_word",
    "shlex:shlex.get_token",
    "json.encoder:py_encode_basestring_ascii",
    "json.decoder:JSONArray",
    "string:Template.safe_substitute",
    "string:Formatter._vformat",
    "difflib:SequenceMatcher.get_opcodes",
    "difflib:get_close_matches",
    "fnmatch:filter",
    "glob:iglob",
    "base64:b64decode",
    "base64:a85encode",
    "calendar:TextCalendar.formatyear",
    "heapq:_siftup",
    "heapq:nsmallest",
    "html:_replace_charref",
    "urllib.parse:urlparse",
    "urllib.parse:parse_qs",
    "email.utils:formataddr",
    "email.utils:decode_params",
    "configparser:BasicInterpolation._interpolate_some",
    "tokenize:Untokenizer.untokenize",
    "copy:deepcopy",
    "functools:update_wrapper",
    "functools:_c3_merge",
    "statistics:median",
    "fractions:Fraction.limit_denominator",
    "ipaddress:collapse_addresses",
    "gettext:_expand_lang",
    "pprint:PrettyPrinter._pprint_str",
    "argparse:HelpFormatter._format_action",
    "colorsys:rgb_to_hls",
    "quopri:decode",
)
MIN_LINES, MAX_LINES = 10, 60  # long enough to be worth copying, short enough for a CPU run
MIN_USES = 3  # a rename of a name used once or twice barely changes the function
RENAME_SUFFIX = "_value"
NEW_PARAMETER = "verbose"


@dataclasses.dataclass(frozen=True, kw_only=True)
class CodeEdit:
    """One edit request on one function.

    Attributes:
        function: `module:qualname` of the stdlib function.
        source: its source, dedented.
        rename: `(old, new)` for a rename, where `old` is a name the function binds; None asks for
            a new `verbose=False` parameter instead.
    """

    function: str
    source: str
    rename: tuple[str, str] | None

    def __post_init__(self):
        if ":" not in self.function:
            raise ValueError(f"function must be 'module:qualname', got {self.function!r}")
        node = parse_function(self.source)
        names = identifiers(node)
        if self.rename is None:
            if NEW_PARAMETER in names:
                raise ValueError(f"{self.function} already uses the name {NEW_PARAMETER!r}")
            return
        old, new = self.rename
        if old not in _uses(node):
            raise ValueError(f"{self.function} binds no name {old!r} to rename")
        if not new.isidentifier() or new in names:
            raise ValueError(f"{new!r} is not a fresh identifier in {self.function}")

    @property
    def kind(self) -> str:
        return "add_parameter" if self.rename is None else "rename"

    @property
    def prompt(self) -> str:
        what = "method" if "." in self.function.split(":", 1)[1] else "function"
        if self.rename is None:
            request = (f"Add a keyword-only parameter `{NEW_PARAMETER}=False` to this Python "
                       f"{what}. When `{NEW_PARAMETER}` is true, print the {what}'s arguments on "
                       "entry.")
        else:
            old, new = self.rename
            request = f"Rewrite this Python {what} with the variable `{old}` renamed to `{new}`."
        return (f"{request} Change nothing else, and output the whole {what}.\n\n"
                f"```python\n{self.source.rstrip()}\n```")


def parse_function(source: str) -> ast.FunctionDef:
    node = ast.parse(source).body[0]
    if not isinstance(node, ast.FunctionDef):
        raise ValueError(f"expected the source of one function, got {type(node).__name__}")
    return node


def _parameters(node: ast.FunctionDef) -> list[str]:
    args = node.args
    every = [*args.posonlyargs, *args.args, args.vararg, *args.kwonlyargs, args.kwarg]
    return [a.arg for a in every if a is not None]


def identifiers(node: ast.FunctionDef) -> set[str]:
    """Every name the function's text mentions, so an added or renamed name can be checked fresh."""
    names = {node.name, *_parameters(node)}
    for child in ast.walk(node):
        if isinstance(child, ast.Name):
            names.add(child.id)
        elif isinstance(child, ast.arg):
            names.add(child.arg)
        elif isinstance(child, ast.Attribute):
            names.add(child.attr)
        elif isinstance(child, (ast.FunctionDef, ast.ClassDef)):
            names.add(child.name)
    return names


def _uses(node: ast.FunctionDef) -> collections.Counter[str]:
    """How often each name the function binds itself (parameters, assigned variables) occurs."""
    bound = set(_parameters(node))
    bound.update(child.id for child in ast.walk(node)
                 if isinstance(child, ast.Name) and isinstance(child.ctx, ast.Store))
    uses = collections.Counter(_parameters(node))
    uses.update(child.id for child in ast.walk(node)
                if isinstance(child, ast.Name) and child.id in bound)
    return uses


def rename_candidates(node: ast.FunctionDef) -> list[str]:
    """The names the function binds that are used MIN_USES times, with a renamed form that is
    still free, never `self`/`cls`: the most used first (ties: alphabetical)."""
    uses, taken = _uses(node), identifiers(node)
    candidates = [name for name in sorted(uses)
                  if name not in ("self", "cls") and uses[name] >= MIN_USES
                  and name + RENAME_SUFFIX not in taken]
    return sorted(candidates, key=lambda name: -uses[name])


def _rename_target(node: ast.FunctionDef) -> str | None:
    """The most used rename candidate, or None."""
    return next(iter(rename_candidates(node)), None)


def resolve(function: str):
    """The object `module:qualname` names, or None if this Python version lacks it."""
    try:
        return pkgutil.resolve_name(function)
    except (ImportError, AttributeError):
        return None


def code_edits(n: int | None = None) -> list[CodeEdit]:
    """The edit requests behind `code_editing`, in FUNCTIONS order (at most `n`)."""
    n = check_count(n)
    edits = []
    for i, function in enumerate(FUNCTIONS):
        if n is not None and len(edits) == n:
            break
        obj = resolve(function)
        if obj is None:
            continue
        source = textwrap.dedent(inspect.getsource(obj))
        if not MIN_LINES <= len(source.splitlines()) <= MAX_LINES:
            continue
        node = parse_function(source)
        target = _rename_target(node)
        renames = [] if target is None else [(target, target + RENAME_SUFFIX)]
        new_parameters = [] if NEW_PARAMETER in identifiers(node) else [None]
        options = renames + new_parameters if i % 2 == 0 else new_parameters + renames
        if options:
            edits.append(CodeEdit(function=function, source=source, rename=options[0]))
    return edits


def code_editing(n: int | None = None) -> list[Conversation]:
    """Rewrite-this-function prompts over real stdlib functions (see the module docstring)."""
    return [Conversation(turns=(edit.prompt,), name=f"code_editing/{edit.function}:{edit.kind}")
            for edit in code_edits(n)]
