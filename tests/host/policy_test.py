"""What each spec resolves to: the one policy the executor works from."""

import pytest

import jaxspec as js
from jaxspec.host import gate as gate_lib
from jaxspec.host import policy as policy_lib


class EchoDrafter(js.Drafter):
    def prepare_draft_tokens(self, requests):
        return [[] for _ in requests]


def test_none_is_plain_decoding():
    policy = policy_lib.resolve(None, max_batch_size=4)
    assert policy == policy_lib.SpecPolicy()
    assert policy.draft_len_for_batch_size(1) == 0 and not policy.uses_automaton
    assert policy.new_gate() is None


def test_sa_config():
    spec = js.SAConfig(max_draft_len=4, max_matching_ngram_size=3, enable_global_pool=True,
                       min_match_len=3, draft_len_schedule={2: 4, 8: 1},
                       acceptance_rate_window_size=5, acceptance_rate_threshold=0.2)
    policy = policy_lib.resolve(spec, max_batch_size=8)
    assert (policy.source, policy.max_draft_len, policy.max_ngram_size, policy.min_match_len,
            policy.global_pool) == ("sa", 4, 3, 3, True)
    assert policy.uses_automaton and policy.drafter is None
    assert [policy.draft_len_for_batch_size(n) for n in (1, 2, 3, 8, 9)] == [4, 4, 1, 1, 0]
    gate = policy.new_gate()
    assert (gate.window, gate.threshold) == (5, 0.2)


def test_ngram_config_becomes_a_host_drafter():
    policy = policy_lib.resolve(js.NGramConfig(max_draft_len=3, max_concurrency=2),
                                max_batch_size=4)
    assert policy.source == "host" and isinstance(policy.drafter, js.NGramDrafter)
    assert policy.draft_len_schedule == ((2, 3),)
    assert policy.should_use_spec_decode(2, 4, 64, 3)
    assert not policy.should_use_spec_decode(3, 4, 64, 3)


def test_auto_is_the_suggested_automaton_made_adaptive():
    for batch in (1, 16):
        policy = policy_lib.resolve(js.AutoConfig(), max_batch_size=batch)
        suggested = js.suggest_spec_config(batch)
        assert policy.adaptive and policy.source == "sa" and policy.global_pool
        assert (policy.max_ngram_size, policy.min_match_len) == (-1, 1)
        assert policy.max_draft_len == js.config.ADAPTIVE_MAX_DRAFT_LEN
        assert policy.draft_len_schedule == ((suggested.max_concurrency, policy.max_draft_len),)


def test_gate_and_adaptive_flags_reach_the_policy():
    policy = policy_lib.resolve(js.NGramConfig(max_draft_len=4, adaptive=True, gate="reversible",
                                               acceptance_rate_window_size=4,
                                               acceptance_rate_threshold=0.3),
                                max_batch_size=2)
    assert policy.adaptive and policy.gate == "reversible"
    assert isinstance(policy.new_gate(), gate_lib.ReversibleGate)
    drafter = EchoDrafter(max_draft_len=2, gate="reversible")
    assert policy_lib.resolve(drafter, max_batch_size=2).gate == "reversible"
    with pytest.raises(ValueError, match="gate must be one of"):
        js.SAConfig(max_draft_len=2, gate="sometimes")


def test_user_drafter_with_an_enhancer():
    drafter = EchoDrafter(max_draft_len=2)
    policy = policy_lib.resolve(drafter, max_batch_size=4,
                                enhancer=js.SAEnhancerConfig(threshold=5, enable_global_pool=True))
    assert (policy.source, policy.drafter, policy.enhancer_threshold) == ("host", drafter, 5)
    assert policy.uses_automaton and policy.global_pool


@pytest.mark.parametrize("spec", [None, js.SAConfig(max_draft_len=2), js.AutoConfig()])
def test_an_enhancer_needs_a_host_drafter(spec):
    with pytest.raises(TypeError, match="enhances a host drafter"):
        policy_lib.resolve(spec, max_batch_size=4, enhancer=js.SAEnhancerConfig())


def test_unknown_spec():
    with pytest.raises(TypeError, match="spec must be"):
        policy_lib.resolve("sa", max_batch_size=4)
