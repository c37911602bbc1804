"""Translation: the help paragraphs of GNU coreutils, from the system's German gettext catalog.

Debian ships `coreutils.mo` with the essential coreutils package; each entry pairs an English
`--help` paragraph (the msgid) with its German translation by the coreutils translators. The model
translates the English into German; option names, column layout and examples carry over verbatim,
which is what a drafter can copy.
"""

import gettext
import pathlib
import sys

from benchmarks.workloads.base import Conversation
from benchmarks.workloads.base import WorkloadUnavailable
from benchmarks.workloads.base import check_count

DOMAIN = "coreutils"
LANGUAGE = "de"
# Debian's system prefix first; then the prefix of the interpreter running this (a non-venv one).
LOCALE_DIRS = ("/usr/share/locale", str(pathlib.Path(sys.base_prefix, "share", "locale")))
MIN_WORDS = 30  # the option-list and description paragraphs; shorter entries are single messages


def catalog_path(domain: str = DOMAIN, language: str = LANGUAGE,
                 locale_dirs: tuple[str, ...] = LOCALE_DIRS) -> pathlib.Path:
    """The compiled catalog (`.mo`) of `domain` in `language`.

    Raises:
        WorkloadUnavailable: no locale directory has it.
    """
    for locale_dir in locale_dirs:
        found = gettext.find(domain, locale_dir, languages=[language])
        if found:
            return pathlib.Path(found)
    raise WorkloadUnavailable(
        f"no {language!r} catalog for {domain!r} under {', '.join(locale_dirs)}: install the "
        f"distribution's {domain} translations (on Debian they come with the {domain} package, "
        f"unless the image excludes /usr/share/locale)")


def translation_pairs(n: int | None = None) -> list[tuple[str, str]]:
    """(English, German) paragraphs of at least MIN_WORDS words, sorted by the English text."""
    n = check_count(n)
    with catalog_path().open("rb") as f:
        # `_catalog` is the only way to list a catalog's entries; plural entries have tuple keys.
        catalog = gettext.GNUTranslations(f)._catalog
    pairs = sorted((msgid, msgstr) for msgid, msgstr in catalog.items()
                   if isinstance(msgid, str) and len(msgid.split()) >= MIN_WORDS
                   and msgstr and msgstr != msgid)
    return pairs[:n]


def _prompt(english: str) -> str:
    paragraph = english.strip("\n")  # msgids start with blank lines that only separate paragraphs
    return ("Translate this help text of a command-line program from English into German. Keep "
            "the option names, the line breaks and the column layout unchanged.\n\n"
            f"```\n{paragraph}\n```")


def translation(n: int | None = None) -> list[Conversation]:
    """English-to-German prompts for coreutils help paragraphs.

    Raises:
        WorkloadUnavailable: the German coreutils catalog is not on this system.
    """
    return [Conversation(turns=(_prompt(english),), name=f"translation/{LANGUAGE}/{i:03d}")
            for i, (english, _) in enumerate(translation_pairs(n))]
