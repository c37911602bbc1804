"""Config validation, normalisation, hashing and AUTO; and the control plane's freedom from jax."""

import dataclasses
import os
import pathlib
import subprocess
import sys

from absl.testing import absltest
from absl.testing import parameterized

import jaxspec
from jaxspec import config

REPO = pathlib.Path(__file__).resolve().parent.parent


class DrafterConfigTest(parameterized.TestCase):

    @parameterized.parameters(config.NGramConfig, config.SAConfig)
    def test_defaults(self, cls):
        cfg = cls(max_draft_len=4)
        self.assertIsNone(cfg.draft_len_schedule)
        self.assertIsNone(cfg.max_concurrency)
        self.assertFalse(cfg.gate_enabled)

    def test_design_defaults(self):
        ngram = config.NGramConfig(max_draft_len=4)
        self.assertEqual((ngram.max_matching_ngram_size, ngram.is_keep_all, ngram.is_use_oldest,
                          ngram.is_public_pool), (2, True, True, True))
        sa = config.SAConfig(max_draft_len=4)
        self.assertEqual((sa.max_matching_ngram_size, sa.enable_global_pool, sa.global_pool_size),
                         (-1, False, None))
        self.assertEqual(config.SAEnhancerConfig(), config.SAEnhancerConfig(
            threshold=4, enable_global_pool=False))

    @parameterized.parameters(config.NGramConfig, config.SAConfig)
    def test_schedule_is_normalised_and_hashable(self, cls):
        cfg = cls(max_draft_len=4, draft_len_schedule={32: 1, 4: 4, 8: 2})
        self.assertEqual(cfg.draft_len_schedule, ((4, 4), (8, 2), (32, 1)))
        same = cls(max_draft_len=4, draft_len_schedule=[(8, 2), (4, 4), (32, 1)])
        self.assertEqual(cfg, same)
        self.assertEqual(hash(cfg), hash(same))
        self.assertLen({cfg, same}, 1)

    @parameterized.parameters(config.NGramConfig, config.SAConfig)
    def test_max_concurrency_becomes_a_schedule(self, cls):
        cfg = cls(max_draft_len=3, max_concurrency=32)
        self.assertEqual(cfg.draft_len_schedule, ((32, 3),))
        self.assertEqual(cfg.max_concurrency, 32)
        # replace() hands the translation back together with max_concurrency: still valid.
        self.assertEqual(dataclasses.replace(cfg, acceptance_rate_window_size=8).draft_len_schedule,
                         ((32, 3),))

    @parameterized.parameters(config.NGramConfig, config.SAConfig)
    def test_max_concurrency_and_schedule_are_exclusive(self, cls):
        with self.assertRaisesRegex(ValueError, "max_concurrency=8.*mutually exclusive"):
            cls(max_draft_len=4, max_concurrency=8, draft_len_schedule={1: 4})

    @parameterized.parameters(config.NGramConfig, config.SAConfig)
    def test_frozen(self, cls):
        cfg = cls(max_draft_len=4)
        with self.assertRaises(dataclasses.FrozenInstanceError):
            cfg.max_draft_len = 5

    @parameterized.parameters(config.NGramConfig, config.SAConfig)
    def test_keyword_only(self, cls):
        with self.assertRaises(TypeError):
            cls(4)

    @parameterized.named_parameters(
        dict(testcase_name="both", window=8, threshold=0.5, enabled=True),
        dict(testcase_name="zero_window", window=0, threshold=0.5, enabled=False),
        dict(testcase_name="no_window", window=None, threshold=0.5, enabled=False),
        dict(testcase_name="no_threshold", window=8, threshold=None, enabled=False),
        dict(testcase_name="zero_threshold", window=8, threshold=0, enabled=True),
    )
    def test_gate_enabled(self, window, threshold, enabled):
        cfg = config.SAConfig(max_draft_len=4, acceptance_rate_window_size=window,
                              acceptance_rate_threshold=threshold)
        self.assertEqual(cfg.gate_enabled, enabled)

    def test_threshold_is_stored_as_float(self):
        cfg = config.NGramConfig(max_draft_len=4, acceptance_rate_window_size=2,
                                 acceptance_rate_threshold=1)
        self.assertIsInstance(cfg.acceptance_rate_threshold, float)

    @parameterized.named_parameters(
        dict(testcase_name="draft_len_zero", kw=dict(max_draft_len=0), match="max_draft_len.*0"),
        dict(testcase_name="draft_len_float", kw=dict(max_draft_len=2.0),
             match="max_draft_len.*2.0"),
        dict(testcase_name="draft_len_bool", kw=dict(max_draft_len=True),
             match="max_draft_len.*True"),
        dict(testcase_name="ngram_zero", kw=dict(max_draft_len=4, max_matching_ngram_size=0),
             match="max_matching_ngram_size.*0"),
        dict(testcase_name="ngram_minus_one", kw=dict(max_draft_len=4, max_matching_ngram_size=-1),
             match="max_matching_ngram_size.*-1"),
        dict(testcase_name="keep_all_int", kw=dict(max_draft_len=4, is_keep_all=1),
             match="is_keep_all.*1"),
        dict(testcase_name="concurrency_zero", kw=dict(max_draft_len=4, max_concurrency=0),
             match="max_concurrency.*0"),
        dict(testcase_name="schedule_value_above_max",
             kw=dict(max_draft_len=4, draft_len_schedule={1: 4, 8: 6}), match=r"\[8\].*6"),
        dict(testcase_name="schedule_smallest_key",
             kw=dict(max_draft_len=4, draft_len_schedule={2: 2}), match="smallest.*2"),
        dict(testcase_name="schedule_key_zero",
             kw=dict(max_draft_len=4, draft_len_schedule={0: 4}), match="key 0"),
        dict(testcase_name="window_negative",
             kw=dict(max_draft_len=4, acceptance_rate_window_size=-1),
             match="acceptance_rate_window_size.*-1"),
        dict(testcase_name="threshold_above_one",
             kw=dict(max_draft_len=4, acceptance_rate_threshold=1.5),
             match="acceptance_rate_threshold.*1.5"),
        dict(testcase_name="threshold_negative",
             kw=dict(max_draft_len=4, acceptance_rate_threshold=-0.1),
             match="acceptance_rate_threshold.*-0.1"),
        dict(testcase_name="threshold_nan",
             kw=dict(max_draft_len=4, acceptance_rate_threshold=float("nan")),
             match="acceptance_rate_threshold.*nan"),
        dict(testcase_name="threshold_string",
             kw=dict(max_draft_len=4, acceptance_rate_threshold="high"),
             match="acceptance_rate_threshold.*high"),
    )
    def test_invalid_ngram_config(self, kw, match):
        with self.assertRaisesRegex(ValueError, match):
            config.NGramConfig(**kw)

    @parameterized.named_parameters(
        dict(testcase_name="ngram_zero", kw=dict(max_matching_ngram_size=0),
             match="max_matching_ngram_size.*got 0"),
        dict(testcase_name="ngram_minus_two", kw=dict(max_matching_ngram_size=-2),
             match="max_matching_ngram_size.*-2"),
        dict(testcase_name="pool_zero", kw=dict(global_pool_size=0), match="global_pool_size.*0"),
        dict(testcase_name="global_pool_str", kw=dict(enable_global_pool="yes"),
             match="enable_global_pool.*yes"),
        dict(testcase_name="selection_unknown", kw=dict(selection="best"),
             match="selection.*'best'"),
        dict(testcase_name="tree_budget_negative", kw=dict(tree_budget=-1),
             match="tree_budget.*-1"),
        dict(testcase_name="tree_of_first_occurrences", kw=dict(tree_budget=8),
             match="tree_budget=8.*selection='frequent'.*'first'"),
        dict(testcase_name="tree_shallower_than_the_depth",
             kw=dict(tree_budget=3, selection="frequent"),
             match=r"tree_budget \(3\).*max_draft_len \(4\)"),
    )
    def test_invalid_sa_config(self, kw, match):
        with self.assertRaisesRegex(ValueError, match):
            config.SAConfig(max_draft_len=4, **kw)

    def test_tree_budget_sets_the_width_and_max_draft_len_the_depth(self):
        from jaxspec.host import frequent
        from jaxspec.host import policy

        cfg = config.SAConfig(max_draft_len=4, selection="frequent", tree_budget=16,
                              draft_len_schedule={1: 4, 8: 2})
        resolved = policy.resolve(cfg, max_batch_size=8)
        self.assertTrue(resolved.tree)
        self.assertEqual(resolved.max_draft_len, 16)
        self.assertEqual(resolved.draft_len_schedule, ((1, 16), (8, 2)))
        self.assertFalse(policy.resolve(config.SAConfig(max_draft_len=4, selection="frequent"),
                                        max_batch_size=8).tree)
        self.assertIsInstance(resolved.drafter, frequent.FrequentDrafter)

    def test_valid_sa_ngram_sizes(self):
        self.assertEqual(config.SAConfig(max_draft_len=4).max_matching_ngram_size, -1)
        self.assertEqual(config.SAConfig(max_draft_len=4, max_matching_ngram_size=1)
                         .max_matching_ngram_size, 1)
        self.assertEqual(config.SAConfig(max_draft_len=4, global_pool_size=1).global_pool_size, 1)

    @parameterized.named_parameters(
        dict(testcase_name="threshold_zero", kw=dict(threshold=0), match="threshold.*0"),
        dict(testcase_name="global_pool_int", kw=dict(enable_global_pool=0),
             match="enable_global_pool.*0"),
    )
    def test_invalid_enhancer_config(self, kw, match):
        with self.assertRaisesRegex(ValueError, match):
            config.SAEnhancerConfig(**kw)


class AutoTest(parameterized.TestCase):

    @parameterized.named_parameters(
        dict(testcase_name="one", max_batch_size=1, draft_len=5, ngram=3),
        dict(testcase_name="four", max_batch_size=4, draft_len=5, ngram=3),
        dict(testcase_name="five", max_batch_size=5, draft_len=3, ngram=5),
        dict(testcase_name="large", max_batch_size=256, draft_len=3, ngram=5),
    )
    def test_suggest_spec_config(self, max_batch_size, draft_len, ngram):
        expected = config.SAConfig(max_draft_len=draft_len, max_matching_ngram_size=ngram,
                                   max_concurrency=32, enable_global_pool=True)
        self.assertEqual(config.suggest_spec_config(max_batch_size), expected)
        self.assertEqual(expected.draft_len_schedule, ((32, draft_len),))
        # AUTO: the same automaton and concurrency limit, made adaptive (longest match, every
        # match admitted, the planner choosing up to ADAPTIVE_MAX_DRAFT_LEN).
        auto = config.AutoConfig().resolve(max_batch_size)
        k = config.ADAPTIVE_MAX_DRAFT_LEN
        self.assertEqual(auto, dataclasses.replace(
            expected, adaptive=True, max_matching_ngram_size=-1, min_match_len=1,
            max_draft_len=k, draft_len_schedule=None))
        self.assertEqual(auto.draft_len_schedule, ((32, k),))

    def test_invalid_batch_size(self):
        with self.assertRaisesRegex(ValueError, "max_batch_size.*got 0"):
            config.suggest_spec_config(0)

    def test_auto_config_is_hashable(self):
        self.assertEqual(hash(config.AutoConfig()), hash(config.AutoConfig()))


class PackageTest(absltest.TestCase):

    def test_exports(self):
        for name in ("NGramConfig", "SAConfig", "SAEnhancerConfig", "AutoConfig",
                     "suggest_spec_config", "draft_len_for_batch_size", "SpeculationGate",
                     "Drafter", "NGramPool", "NGramDrafter"):
            self.assertTrue(hasattr(jaxspec, name), name)

    def test_control_plane_does_not_import_jax(self):
        # The package __init__ may re-export device code; load the control-plane modules under bare
        # package shells so only their own imports count.
        script = f"""
import sys, types
for name, path in (("jaxspec", {str(REPO / "jaxspec")!r}),
                   ("jaxspec.host", {str(REPO / "jaxspec" / "host")!r})):
    package = types.ModuleType(name)
    package.__path__ = [path]
    sys.modules[name] = package
import jaxspec.config, jaxspec.schedule, jaxspec.host.drafter, jaxspec.host.ngram
import jaxspec.host.gate
leaked = sorted(m for m in sys.modules if m == "jax" or m.startswith(("jax.", "jaxlib")))
assert not leaked, leaked
"""
        env = dict(os.environ, PYTHONPATH=str(REPO))
        result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                                env=env, check=False)
        self.assertEqual(result.returncode, 0, result.stderr)


class SAMinMatchLenTest(parameterized.TestCase):

    def test_default_and_override(self):
        self.assertEqual(config.SAConfig(max_draft_len=3).min_match_len, 2)
        self.assertEqual(config.SAConfig(max_draft_len=3, min_match_len=1).min_match_len, 1)

    def test_zero_is_an_error(self):
        with self.assertRaisesRegex(ValueError, "min_match_len.*0"):
            config.SAConfig(max_draft_len=3, min_match_len=0)


if __name__ == "__main__":
    absltest.main()
