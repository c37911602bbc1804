"""The jaxspec-vs-HF section, with and without the HF side."""

from benchmarks import plain_vs_hf

JAX = dict(load_cold_s=8.0, load_warm_s=0.4, load_in_process_s=0.5, first_call_s=9.0, compiles=8,
           compile_s=3.0, memory_mib=700.0, tokens_per_s=5.0, tokens_per_s_runs=[5.0] * 3,
           decode_tokens_per_s=11.0, generated_tokens=64)
HF = dict(load_s=20.0, first_call_s=6.0, threads="2 threads, OMP_WAIT_POLICY=PASSIVE",
          memory_mib=1100.0, prefill_s=1.0, tokens_per_s=4.0, tokens_per_s_runs=[4.0] * 3,
          decode_tokens_per_s=9.0, generated_tokens=64)


def test_markdown_with_hf():
    results = dict(prompt_tokens=460, max_new_tokens=64, repeats=3, jaxspec=JAX, hf=HF,
                   skipped=None, same_tokens_as_warmup=True, ratio=1.25, first_mismatch_vs_hf=7)
    text = plain_vs_hf.markdown(results)
    assert "| tokens/s (prefill included) | 5.00 | 4.00 |" in text
    assert "cold 8.0 s, warm 0.4 s | 20.0 s" in text
    assert "**1.250x** (goal >= 1.0: met)" in text
    assert "MISMATCH" in text and "token 7" in text


def test_markdown_without_hf():
    results = dict(prompt_tokens=460, max_new_tokens=64, repeats=3, jaxspec=JAX, hf=None,
                   skipped="HF baseline skipped: --no-hf", same_tokens_as_warmup=True)
    text = plain_vs_hf.markdown(results)
    assert "| tokens/s (prefill included) | 5.00 | – |" in text
    assert text.endswith("HF baseline skipped: --no-hf.")
    results["same_tokens_as_warmup"] = False
    assert plain_vs_hf.markdown(results).endswith("changed from one pass to the next.")


def test_added_memory():
    assert plain_vs_hf._added(100.0, 150.0, 400.0) == 300.0
    assert plain_vs_hf._added(None, 150.0) is None
    assert plain_vs_hf._added(100.0, None, 400.0) is None
