"""The HF baseline on a tiny random transformers Llama: prompt lookup is lossless, stops stop; a
jaxspec Llama's weights in transformers' Llama generate what jaxspec generates."""

import pytest

from benchmarks import hf_baseline

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def hf():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, bos_token_id=None, eos_token_id=None)
    return hf_baseline.HFModel(transformers.LlamaForCausalLM(cfg).eval())


PROMPT = [1, 2, 3, 4, 5, 6] * 3


def test_unavailable_reason_names_what_is_missing(monkeypatch):
    real = hf_baseline.importlib.util.find_spec
    monkeypatch.setattr(hf_baseline.importlib.util, "find_spec",
                        lambda name: None if name == "accelerate" else real(name))
    reason = hf_baseline.unavailable_reason()
    assert "accelerate" in reason and "torch" not in reason and hf_baseline.INSTALL in reason


def test_prompt_lookup_matches_greedy(hf):
    greedy = hf.generate(PROMPT, max_new_tokens=20, stop_ids=())
    assert len(greedy) == 20
    assert hf.generate(PROMPT, max_new_tokens=20, stop_ids=(), prompt_lookup_num_tokens=4) == greedy


def test_stop_token_ends_generation_and_is_kept(hf):
    greedy = hf.generate(PROMPT, max_new_tokens=20, stop_ids=())
    stop = greedy[5]
    out = hf.generate(PROMPT, max_new_tokens=20, stop_ids=(stop,))
    assert out == greedy[:greedy.index(stop) + 1]


def test_empty_prompt(hf):
    with pytest.raises(ValueError, match="empty"):
        hf.generate([], max_new_tokens=2, stop_ids=())


def test_threads_note_names_the_wait_policy(hf, monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    assert hf.threads_note == f"{torch.get_num_threads()} threads, OMP_WAIT_POLICY=PASSIVE"


@pytest.mark.parametrize("tie", [True, False])
def test_a_jaxspec_llama_in_transformers_generates_what_jaxspec_does(tie):
    from benchmarks import runs
    from jaxspec.models import tiny

    model = tiny.tiny_model(seed=0, tie_embeddings=tie)
    hf = hf_baseline.HFModel.from_llama(model)
    assert hf.device == "cpu" and hf.model.config.tie_word_embeddings == tie
    prompts = [PROMPT, [7, 3, 9, 3, 9, 3, 9, 11]]
    ours = runs.run_jaxspec(model, None, prompts, spec=None, max_new_tokens=12,
                            scheduler=runs.scheduler_for(prompts, 12, 2)).outputs
    assert [hf.generate(p, max_new_tokens=12, stop_ids=()) for p in prompts] == ours
