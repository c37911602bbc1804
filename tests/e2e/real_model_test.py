"""End-to-end checks on the embedded SmolLM2-135M-Instruct with real prompts.

These are the few real-model runs that matter: plain greedy decoding equals an uncached argmax
loop, and speculation (suffix automaton and n-gram pool, batch 1 and 4) is lossless on real code
editing and document QA prompts. One engine per configuration, shared, so each compiled bucket is
reused across the tests.
"""

import json

import pytest

from benchmarks import workloads
from jaxspec import cli
from jaxspec import config
from jaxspec import engine as engine_lib
from jaxspec.host import scheduler as scheduler_lib

pytestmark = pytest.mark.slow
MAX_NEW = 32
SEQ = 640
# One engine per method, batch capacity 4: "batch 1" runs each prompt alone through it, so both
# batch sizes share the compiled buckets. Two row buckets (1, 4) and one chunk width (512): every
# bucket is a SmolLM2 compile of ~10 s on a CPU, and these tests are about the tokens, not about
# padding less (the tiny model's tests cover the buckets).
CONFIG = scheduler_lib.SchedulerConfig(max_batch_size=4, max_seq_len=SEQ, max_num_tokens=1024,
                                       prefill_chunk=512, batch_buckets=(1, 4),
                                       prefill_buckets=(512,))


@pytest.fixture(scope="module")
def real_prompts(smollm2):
    """Six real prompts: the first three stdlib code edits and the first three pydoc QA prompts
    that fit the cache."""
    _, tok = smollm2
    picked = []
    for name in ("code_editing", "document_qa"):
        fits = [c.turns[0] for c in workloads.load(name)
                if len(tok.encode(tok.apply_chat_template(
                    [{"role": "user", "content": c.turns[0]}]))) + MAX_NEW <= 560]
        picked += fits[:3]
    assert len(picked) == 6
    return picked


SPECS = {"none": None, "sa": config.SAConfig(max_draft_len=5),
         "ngram": config.NGramConfig(max_draft_len=5, max_matching_ngram_size=3)}


@pytest.fixture(scope="module")
def engines(smollm2):
    """One engine per method over the session's SmolLM2, created on first use."""
    model, tok = smollm2
    made = {}

    def get(name):
        if name not in made:
            made[name] = engine_lib.Engine(model, tok, spec=SPECS[name], scheduler=CONFIG)
        return made[name]
    return get


@pytest.fixture(scope="module")
def plain_outputs(real_prompts, engines):
    result = engines("none").generate_batch(real_prompts, max_new_tokens=MAX_NEW)
    return [g.token_ids for g in result.generations]


def test_greedy_equals_uncached_argmax_and_is_deterministic(smollm2, engines, uncached_greedy):
    model, tok = smollm2
    engine = engines("none")
    prompt = engine.encode_prompt("Write a Python function that returns the square of a number.")
    first = engine.generate(prompt, max_new_tokens=32).token_ids
    assert engine.generate(prompt, max_new_tokens=32).token_ids == first
    assert first == uncached_greedy(model, prompt, 32, width=96)


# Each prompt alone is `make test-all`'s (CI's 30 minutes); at batch 4, six prompts share four
# rows, joining and leaving as requests finish.
@pytest.mark.parametrize("spec_name, batch", [
    ("sa", 4), ("ngram", 4), pytest.param("sa", 1, marks=pytest.mark.extended),
    pytest.param("ngram", 1, marks=pytest.mark.extended)])
def test_speculation_is_lossless_on_real_prompts(real_prompts, plain_outputs, engines, spec_name,
                                                 batch):
    engine = engines(spec_name)
    if batch == 4:
        results = [engine.generate_batch(real_prompts, max_new_tokens=MAX_NEW)]
    else:
        results = [engine.generate_batch([p], max_new_tokens=MAX_NEW) for p in real_prompts]
    generations = [g for r in results for g in r.generations]
    for got, want in zip(generations, plain_outputs, strict=True):
        assert got.token_ids == want
    # Speculation really happened: real prompts repeat text, so drafts get accepted (pooled over
    # the prompts: the model paraphrases some of the QA answers).
    accepted = sum(g.stats["accepted"] for g in generations)
    steps = sum(g.stats["verify_steps"] for g in generations)
    assert (accepted + steps) / steps > 1.5


def test_cli_json_sa_on_a_code_edit(tmp_path, capsys):
    prompt_file = tmp_path / "edit.txt"
    prompt_file.write_text(workloads.load("code_editing", 1)[0].turns[0])
    outputs = {}
    for spec in ("none", "sa"):
        code = cli.main(["generate", "--spec", spec, "--prompt-file", str(prompt_file), "--json",
                         "--max-new-tokens", "96", "--max-seq-len", str(SEQ),
                         "--max-batch-size", "4", "--compile-cache", ""])
        assert code == 0
        outputs[spec] = json.loads(capsys.readouterr().out)
    assert outputs["sa"]["token_ids"] == outputs["none"]["token_ids"]
    assert outputs["sa"]["text"] == outputs["none"]["text"]
    assert outputs["sa"]["stats"]["mean_acceptance_length"] > 2
    assert outputs["none"]["stats"]["mean_acceptance_length"] == 1
