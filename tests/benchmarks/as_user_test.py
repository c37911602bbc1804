"""Methods timed as users run them: the aggregation on scripted requests, then one real request
on the tiny model."""

from benchmarks import as_user
from jaxspec.models import tiny

METHODS = ["plain", "sa5", "sa16", "auto"]
# tokens/s per method, prompt 0 then prompt 1, each over three rounds.
SPEED = {"plain": [[10, 12, 11], [20, 20, 20]], "sa5": [[30, 30, 30], [18, 19, 17]],
         "sa16": [[40, 10, 45], [15, 15, 15]], "auto": [[38, 39, 40], [19, 21, 25]]}


def scripted(monkeypatch):
    calls = {}

    def serve(model, tokenizer, method, prompt, max_new_tokens):
        i = prompt[0]
        n = calls[method, i] = calls.get((method, i), -1) + 1
        tokens = [1, 2, 3] if not (method == "sa16" and i == 1) else [1, 2, 4]
        return dict(tokens=tokens, tokens_per_s=SPEED[method][i][n % 3],
                    acceptance_length=None if method == "plain" else 2.0, k_mean=1.0,
                    gap_ratio=1.5 if method != "auto" or n else 4.0, max_gap_ms=10.0,
                    first_call_s=0.0)

    monkeypatch.setattr(as_user, "serve", serve)
    return calls


def test_medians_ratios_and_goals(monkeypatch):
    calls = scripted(monkeypatch)
    logged = []
    results = as_user.measure(None, None, {"code_editing": [[0], [1]]}, methods=METHODS,
                              repeats=3, max_new_tokens=8, log=logged.append)
    rows = results["code_editing"]
    # A warm request per method on the first prompt, then 3 rounds per prompt.
    assert calls[("auto", 0)] == 3 and calls[("auto", 1)] == 2
    assert rows[0]["plain"]["tokens_per_s"] == 11 and rows[0]["sa16"]["tokens_per_s"] == 40
    assert rows[0]["auto_vs_best"] == 39 / 40
    assert rows[1]["auto_vs_best"] == 21 / 20 and rows[1]["auto_vs_plain"] == 21 / 20
    assert rows[1]["mismatches"] == ["sa16"] and "sa16 differs" in logged[0]
    lines = as_user.goals(results)
    assert "worst 0.97x (met)" in lines[0] and "worst 1.05x (met)" in lines[1]
    assert "worst 4.0x (NOT met)" in lines[2]      # prompt 1's first auto request
    text = as_user.markdown(results, methods=METHODS, repeats=3, max_new_tokens=8, eager=False)
    assert "| code_editing | 1 MISMATCH |" in text and "as users run it" in text


def test_one_real_request_on_the_tiny_model():
    out = as_user.serve(tiny.tiny_model(seed=0), None, "auto", [5, 6, 7, 5, 6, 7, 5, 6], 12)
    assert len(out["tokens"]) == 12 and out["tokens_per_s"] > 0
    assert set(out) == {"tokens", "tokens_per_s", "acceptance_length", "k_mean", "gap_ratio",
                        "max_gap_ms", "first_call_s"}
