"""The context sweep: prompts of exact lengths from real text, its table and its goal lines."""

import inspect
import json
import types

import pytest

from benchmarks import context_sweep
from benchmarks import harness


class CharTokenizer:
    """One token per character, so lengths and text are easy to check; `add_bos` optional."""

    bos_token_id = 0

    def __init__(self, add_bos=False):
        self.add_bos = add_bos

    def encode(self, text):
        return [0] * self.add_bos + [ord(c) for c in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ids if i)

    def apply_chat_template(self, messages, add_generation_prompt):
        chat = "".join(f"<{m['role']}>{m['content']}<end>" for m in messages)
        return chat + "<assistant>" * add_generation_prompt


@pytest.mark.parametrize("source", context_sweep.SOURCES)
@pytest.mark.parametrize("length", [300, 1000, 8000])
def test_prompt_has_the_length_and_starts_the_real_text(source, length):
    prompt = context_sweep.context_prompt(CharTokenizer(), length, source=source)
    assert len(prompt) == length
    before, after = context_sweep.FRAMES[source]
    text = CharTokenizer().decode(prompt)
    assert text.startswith(f"<user>{before}")
    assert text.endswith(f"{after}<end><assistant>")
    body = text[len(f"<user>{before}"):-len(f"{after}<end><assistant>")]
    assert len(body) > length - 200
    assert context_sweep.source_text(source).startswith(body)


def test_source_texts_are_the_stdlib_and_the_reference():
    import argparse
    from pydoc_data import topics

    assert context_sweep.source_text("module") == inspect.getsource(argparse)
    assert topics.topics["assert"].strip() in context_sweep.source_text("topics")


def test_bos_only_at_the_start():
    prompt = context_sweep.context_prompt(CharTokenizer(add_bos=True), 300)
    assert len(prompt) == 300
    assert prompt[0] == 0 and 0 not in prompt[1:]


def test_prompt_refusals():
    with pytest.raises(ValueError, match="leaves .* tokens of text"):
        context_sweep.context_prompt(CharTokenizer(), 100)
    with pytest.raises(ValueError, match="source has"):
        context_sweep.context_prompt(CharTokenizer(), 10**7)
    with pytest.raises(ValueError, match="unknown source"):
        context_sweep.context_prompt(CharTokenizer(), 500, source="nope")


@pytest.mark.slow
def test_smollm2_prompts_fit_its_context(smollm2):
    _, tokenizer = smollm2
    for length in context_sweep.CONTEXTS:
        prompt = context_sweep.context_prompt(tokenizer, length)
        assert len(prompt) == length
        assert length + 64 + 1 <= 8192
    assert tokenizer.decode(prompt).count("```") == 2


# Scripted step times (ms) per context: plain grows x1.5 from 128 to 4096; K=5 verify costs 1.2x.
PLAIN_STEP = {128: 40.0, 1024: 48.0, 4096: 60.0}


def fake_compare(model, tokenizer, prompts, cfg, *, hf, progress, label):
    (prompt,) = prompts
    length = len(prompt)
    assert label == f"context {length}" and cfg.methods == context_sweep.METHODS
    plain = PLAIN_STEP[length]

    def method(step_ms=None, tokens_per_s=10.0, decode=12.0, prefill_s=1.0, **extra):
        return dict(tokens_per_s=tokens_per_s, tokens_per_s_runs=[tokens_per_s],
                    decode_tokens_per_s=decode, decode_tokens_per_s_runs=[decode],
                    prefill_s=prefill_s, mean_step_time_ms=step_ms, compiles_warmup=3,
                    compiles_timed=0, **extra)

    hf_decode = 1e3 / (1.7 * plain) if length < 4096 else 1e3 / (1.2 * plain)
    methods = dict(
        plain=method(plain, decode=1e3 / plain, prefill_s=length / 500),
        sa=method(plain * 1.1, tokens_per_s=20.0, mean_acceptance_length=2.2, k_mean=4.0),
        oracle=method(plain * 1.2, tokens_per_s=40.0, mean_acceptance_length=6.0, k_mean=5.0),
        hf_greedy=method(tokens_per_s=8.0, decode=hf_decode, prefill_s=length / 400),
        hf_pld=method(tokens_per_s=16.0, prefill_s=length / 400))
    for name in ("hf_greedy", "hf_pld"):
        methods[name]["compiles_warmup"] = None
        if hf is None:
            del methods[name]
    mismatches = ([dict(method="sa", reference="plain", prompt=0, position=3, when="round 1")]
                  if length == 4096 else [])
    return dict(workload=label, methods=methods, mismatches=mismatches)


class FakeHF:
    threads_note = "2 threads"


def scripted_sweep(monkeypatch, hf):
    monkeypatch.setattr(harness, "compare", fake_compare)
    monkeypatch.setattr(context_sweep, "context_prompt",
                        lambda tokenizer, length, source: [1] * length)
    out = context_sweep.sweep(None, None, hf=hf, contexts=(128, 1024, 4096), repeats=1,
                              progress=False)
    out["load_average"] = [1.0, 1.5]
    return out


@pytest.fixture
def results(monkeypatch):
    return scripted_sweep(monkeypatch, FakeHF())


def test_rows(results):
    json.dumps(results)
    low, mid, high = results["rows"]
    assert mid["prefill_tokens_per_s"] == {"plain": pytest.approx(500.0),
                                           "hf_greedy": pytest.approx(400.0)}
    assert mid["step_ms"]["hf_greedy"] == pytest.approx(1.7 * 48.0)
    assert mid["sa_ms_per_token"] == pytest.approx(48.0 * 1.1 / 2.2)
    assert mid["verify_vs_plain"] == pytest.approx(1.2)
    assert low["plain_vs_hf_decode"] == pytest.approx(1.7)
    assert low["sa_vs_plain"] == 2.0 and low["sa_vs_hf_pld"] == 1.25
    assert low["sa_identical"] and not high["sa_identical"]
    assert high["compiles_timed"] == {"plain": 0, "sa": 0, "oracle": 0}


def test_goal_lines(results):
    goals = context_sweep.goal_lines(results)
    assert goals[0] == ("- jaxspec plain decode step at 4096 / at 128 tokens: 1.50x "
                        "(goal <= 1.4: not met)")
    assert goals[1].startswith("- jaxspec plain / HF greedy decode tok/s, lowest at 4096 tokens: "
                               "1.20x (goal >= 1.5: not met) (128: 1.70x, 1024: 1.70x, ")
    assert goals[2] == "- jaxspec / HF prefill tok/s at 4096 tokens: 1.25x (goal >= 1.2: met)"
    assert goals[3] == "- K=5 verify step / plain step at 1024 tokens: 1.20x (goal <= 1.4: met)"
    assert goals[4] == ("- jaxspec SA token-identical to plain at every context: no (differs at "
                        "4096)")


def test_goals_at_contexts_that_did_not_run(results):
    results["rows"] = results["rows"][:1]
    goals = context_sweep.goal_lines(results)
    assert goals[0].endswith("not measured") and goals[2].endswith("not measured")
    assert goals[3].endswith("not measured")


def test_markdown(results, tmp_path):
    text = context_sweep.markdown(results, plot=tmp_path / "x.png")
    assert text.startswith("## Context sweep: batch 1 from 128 to 4096 tokens of context")
    assert "| 1,024 | 500 | 400 | 48.0 | 52.8 (4.0) | 24.0 | 57.6 | 81.6 | 20.83 |" in text
    assert "| 128 | 10.00 | 20.00 | 40.00 | 8.00 | 16.00 | 2.00x | 1.25x | yes |" in text
    assert "| 4,096 |" in text and "| **no** |" in text
    assert "Goals (issue 12):" in text and "1-minute load average 1.0" in text
    assert "jaxspec SA vs jaxspec plain at 4096 tokens, token 3 (round 1)" in text
    assert "![decode step time vs context length](" in text


def test_plot(results, tmp_path):
    pytest.importorskip("matplotlib")
    path = context_sweep.plot_step_times(results, tmp_path / "steps.png")
    assert path.read_bytes().startswith(b"\x89PNG")


def test_without_hf(monkeypatch):
    text = context_sweep.markdown(scripted_sweep(monkeypatch, None))
    assert "HF left out." in text and "HF greedy |" not in text.split("Tokens/s")[1]
    assert "| 128 | 10.00 | 20.00 | 40.00 | 2.00x | – | yes |" in text
    assert "- jaxspec plain / HF greedy decode tok/s: not measured" in text
    assert "- jaxspec / HF prefill tok/s at 4096 tokens: not measured" in text


def test_refuses_a_context_beyond_the_model_before_running(monkeypatch):
    model = types.SimpleNamespace(cache_spec=types.SimpleNamespace(max_context_len=8192))
    monkeypatch.setattr(harness, "compare", None)  # never reached
    with pytest.raises(ValueError, match="8150-token context \\+ 64 new tokens exceeds"):
        context_sweep.sweep(model, CharTokenizer(), contexts=(1024, 8150), max_new_tokens=64,
                            progress=False)


def test_cli_rejects_bad_contexts(capsys):
    with pytest.raises(SystemExit):
        context_sweep.main(["--contexts", "128,lots"])
    assert "--contexts must be comma-separated ints" in capsys.readouterr().err

