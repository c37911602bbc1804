"""The shape every workload returns, and how a workload finds its optional data.

A workload is a list of `Conversation`s: the user turns of a chat, in plain text. The harness
applies the model's chat template, generates the assistant's reply after each turn, and measures the
reply to the last turn, so a two-turn conversation measures a turn that can draft from turn one.
A conversation with `chat=False` is one piece of raw text the model continues, no template.
"""

import dataclasses
import importlib.util
import pathlib


class WorkloadUnavailable(Exception):
    """A workload's optional data is not installed; the message says what to install."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Conversation:
    """The user side of one chat.

    Attributes:
        turns: the user messages, in order; the reply to the last one is measured.
        system: a system prompt, or None for the model's default.
        name: a stable identifier, `workload/item`, unique within its workload.
        chat: False for raw text: the one turn is the whole prompt, continued without a template.
    """

    turns: tuple[str, ...]
    system: str | None = None
    name: str
    chat: bool = True

    def __post_init__(self):
        if not isinstance(self.turns, tuple):
            raise TypeError(f"turns must be a tuple of str, got {type(self.turns).__name__}")
        if not self.turns:
            raise ValueError(f"a conversation needs at least one turn, got turns={self.turns!r}")
        for i, turn in enumerate(self.turns):
            if not isinstance(turn, str) or not turn.strip():
                raise ValueError(f"turn {i} of {self.name!r} must be non-blank text, got {turn!r}")
        if self.system is not None and not (isinstance(self.system, str) and self.system.strip()):
            raise ValueError(f"system must be None or non-blank text, got {self.system!r}")
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"name must be non-blank text, got {self.name!r}")
        if not self.chat and (len(self.turns) != 1 or self.system is not None):
            raise ValueError(f"raw text ({self.name!r}, chat=False) is one turn and no system "
                             f"prompt, got {len(self.turns)} turns and system={self.system!r}")


def check_count(n: int | None) -> int | None:
    """Returns `n` if it is a valid cap on a workload's size (None means everything)."""
    if n is None:
        return None
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"n must be an int or None, got {n!r}")
    if n < 1:
        raise ValueError(f"n must be at least 1 (or None for all), got {n}")
    return n


def package_file(package: str, relative: str, *, install: str) -> pathlib.Path:
    """The path of a data file inside an installed package, without importing the package.

    Data packages are installed with `--no-deps`, so importing them can fail on missing
    dependencies; `find_spec` locates a top-level package without running its `__init__`.

    Raises:
        WorkloadUnavailable: the package or the file is missing; the message names `install`.
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise WorkloadUnavailable(f"the Python package {package!r} is not installed: {install}")
    path = pathlib.Path(spec.submodule_search_locations[0], relative)
    if not path.is_file():
        raise WorkloadUnavailable(f"{path} is missing from {package!r}; reinstall it: {install}")
    return path
