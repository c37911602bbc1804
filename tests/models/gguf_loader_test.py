"""GGUF loading: the real SmolLM2 against independent references, toy files, errors and caching.

The reference forward below is written from scratch in numpy (float32) straight from the raw GGUF
tensors, using llama.cpp's interleaved RoPE on the still-permuted q/k weights. The Flax model uses
un-permuted weights with rotate-half RoPE, so agreement also proves the un-permute.
"""

import dataclasses
import inspect
import textwrap

import gguf
from gguf.quants import dequantize
import numpy as np
import pytest

from jaxspec.models import checkpoint
from jaxspec.models import gguf_loader
from jaxspec.models import registry
from jaxspec.models import tiny

LOGIT_ATOL = 1e-3
PROMPT_TOKENS = 96
CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
          "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|im_start|>assistant\\n' }}{% endif %}")


def _rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _interleaved_rope(x, theta):
    """x [T, H, D]: rotates pairs (2i, 2i+1) by position * theta^(-2i/D) (llama.cpp's layout)."""
    t, _, d = x.shape
    angles = np.arange(t)[:, None] * theta ** (-np.arange(0, d, 2) / d)       # f64 [T, D/2]
    cos = np.cos(angles).astype(np.float32)[:, None, :]
    sin = np.sin(angles).astype(np.float32)[:, None, :]
    even, odd = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = even * sin + odd * cos
    return out


def numpy_llama_logits(path, ids) -> np.ndarray:
    """f32[T, V] logits of a llama GGUF on one prompt, causal attention, no cache."""
    reader = gguf.GGUFReader(path)
    meta = lambda k: reader.fields[f"llama.{k}"].contents()  # noqa: E731
    w = {t.name: dequantize(t.data, t.tensor_type) for t in reader.tensors}
    n_layers, n_heads = meta("block_count"), meta("attention.head_count")
    n_kv, theta = meta("attention.head_count_kv"), meta("rope.freq_base")
    eps = meta("attention.layer_norm_rms_epsilon")
    t = len(ids)
    x = w["token_embd.weight"][ids]
    hd = x.shape[1] // n_heads
    causal = np.tril(np.ones((t, t), bool))
    for i in range(n_layers):
        p = lambda name, i=i: w[f"blk.{i}.{name}.weight"]  # noqa: E731
        h = _rms_norm(x, p("attn_norm"), eps)
        q = _interleaved_rope((h @ p("attn_q").T).reshape(t, n_heads, hd), theta)
        k = _interleaved_rope((h @ p("attn_k").T).reshape(t, n_kv, hd), theta)
        v = (h @ p("attn_v").T).reshape(t, n_kv, hd)
        k, v = np.repeat(k, n_heads // n_kv, axis=1), np.repeat(v, n_heads // n_kv, axis=1)
        scores = np.einsum("thd,shd->hts", q, k, optimize=True) * hd ** -0.5
        scores = np.where(causal, scores, -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        attn = np.einsum("hts,shd->thd", probs, v, optimize=True).reshape(t, -1)
        x = x + attn @ p("attn_output").T
        h = _rms_norm(x, p("ffn_norm"), eps)
        gate = h @ p("ffn_gate").T
        x = x + (gate / (1 + np.exp(-gate)) * (h @ p("ffn_up").T)) @ p("ffn_down").T
    x = _rms_norm(x, w["output_norm.weight"], eps)
    head = w.get("output.weight", w["token_embd.weight"])
    return x @ head.T


@pytest.fixture(scope="module")
def prompt_ids(smollm2):
    _, tok = smollm2
    source = textwrap.dedent(inspect.getsource(textwrap.TextWrapper._wrap_chunks))
    ids = tok.encode(source)[:PROMPT_TOKENS]
    assert len(ids) == PROMPT_TOKENS, f"source too short: {len(ids)} tokens"
    return ids


@pytest.fixture(scope="module")
def flax_logits(smollm2, prompt_ids, forward):
    model, _ = smollm2
    return forward(model, np.asarray([prompt_ids]))[0]


def _assert_matches(logits, reference):
    np.testing.assert_allclose(logits, reference, rtol=0, atol=LOGIT_ATOL)
    np.testing.assert_array_equal(logits.argmax(-1), reference.argmax(-1))


@pytest.mark.slow
def test_real_model_matches_numpy_reference(flax_logits, prompt_ids):
    reference = numpy_llama_logits(registry.default_gguf_path(), prompt_ids)
    _assert_matches(flax_logits, reference)


@pytest.mark.slow
def test_real_model_matches_transformers(flax_logits, prompt_ids, monkeypatch):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")      # transformers needs it to load GGUF
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = registry.default_gguf_path()
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    with torch.no_grad():
        reference = hf(torch.tensor([prompt_ids])).logits[0].numpy()
    _assert_matches(flax_logits, reference)


# ---- toy GGUF files written here, in llama.cpp's conventions ----

@dataclasses.dataclass(frozen=True, kw_only=True)
class GGUFMeta:
    """What `write_tiny_gguf` writes besides the weights; tests vary one field at a time."""

    arch: str = "llama"
    tokenizer_model: str = "gpt2"
    pre: str = "smollm"
    rope_scaling: str | None = None


def permute_rope_rows(w, num_heads):
    """llama.cpp's convert_hf_to_gguf permutation of q/k rows (the inverse of the loader's)."""
    out, inp = w.shape
    return w.reshape(num_heads, 2, out // num_heads // 2, inp).swapaxes(1, 2).reshape(out, inp)


def write_tiny_gguf(path, model, vocab, meta=GGUFMeta()):
    cfg, p = model.cfg, checkpoint.flat_params(model)
    tokens, merges, types = vocab
    w = gguf.GGUFWriter(str(path), arch=meta.arch)
    w.add_block_count(cfg.num_layers)
    w.add_context_length(256)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_heads)
    w.add_head_count_kv(cfg.num_kv_heads)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    if meta.rope_scaling is not None:
        w.add_rope_scaling_type(gguf.RopeScalingType(meta.rope_scaling))
    w.add_tokenizer_model(meta.tokenizer_model)
    w.add_tokenizer_pre(meta.pre)
    w.add_token_list(tokens)
    w.add_token_merges(merges)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML)
    w.add_tensor("token_embd.weight", p["embed.embedding"])
    w.add_tensor("output_norm.weight", p["norm.weight"])
    if not cfg.tie_embeddings:
        w.add_tensor("output.weight", np.ascontiguousarray(p["lm_head.kernel"].T))
    heads = {"q_proj": cfg.num_heads, "k_proj": cfg.num_kv_heads}
    names = dict(q_proj="attn_q", k_proj="attn_k", v_proj="attn_v", o_proj="attn_output",
                 gate_proj="ffn_gate", up_proj="ffn_up", down_proj="ffn_down")
    for i in range(cfg.num_layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", p["layers.input_norm.weight"][i])
        w.add_tensor(f"blk.{i}.ffn_norm.weight", p["layers.post_norm.weight"][i])
        for name, gguf_name in names.items():
            weight = p[f"layers.{name}.kernel"][i].T                             # [out, in]
            if name in heads:
                weight = permute_rope_rows(weight, heads[name])
            w.add_tensor(f"blk.{i}.{gguf_name}.weight", np.ascontiguousarray(weight))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv(gguf_loader.CACHE_ENV, str(root))
    return root


@pytest.mark.parametrize("tie", [True, False])
def test_tiny_gguf_loads_the_written_model(tmp_path, cache, byte_vocab, forward, tie):
    original = tiny.tiny_model(3, vocab_size=len(byte_vocab[0]), tie_embeddings=tie)
    path = write_tiny_gguf(tmp_path / "tiny.gguf", original, byte_vocab)
    model, tok = gguf_loader.load_gguf(path)
    # GGUF stores epsilon as float32; the writer records a context length of 256.
    assert model.cfg == dataclasses.replace(original.cfg, rms_norm_eps=model.cfg.rms_norm_eps,
                                            max_position_embeddings=256)
    np.testing.assert_allclose(model.cfg.rms_norm_eps, original.cfg.rms_norm_eps, rtol=1e-6)
    tokens = np.random.default_rng(0).integers(0, original.cfg.vocab_size, (2, 21))
    np.testing.assert_allclose(forward(model, tokens), forward(original, tokens), atol=1e-5)
    assert tok.eos_token_ids == (2, 0)      # <|im_end|>, then <|endoftext|>
    assert (tok.bos_token_id, tok.add_bos, tok.chat_template) == (1, False, CHATML)
    assert tok.encode("in the<|im_end|>") == [tok.token_to_id("in"), tok.token_to_id("Ġthe"), 2]
    tool = len(byte_vocab[0]) - 1     # user-defined: matched whole, decoded as text
    assert tok.encode("a<tool>b") == [tok.token_to_id("a"), tool, tok.token_to_id("b")]
    assert tok.decode([tool]) == "<tool>"


def test_second_load_reads_only_the_cache(tmp_path, cache, byte_vocab, forward, monkeypatch):
    original = tiny.tiny_model(4, vocab_size=len(byte_vocab[0]))
    path = write_tiny_gguf(tmp_path / "tiny.gguf", original, byte_vocab)
    gguf_loader.load_gguf(path)
    entry = gguf_loader.cache_entry(path)
    assert entry.parent == cache
    files = {f.name for f in entry.iterdir()}
    assert {"config.json", "tokenizer.json", "tokenizer_meta.json", "layers.q_proj.kernel.npy",
            "embed.embedding.npy"} <= files
    assert [f.name for f in cache.iterdir()] == [entry.name]      # no temporary directory left

    def no_gguf(*args):
        raise AssertionError("the GGUF file was opened although the cache is warm")

    monkeypatch.setattr(gguf_loader, "GGUFReader", no_gguf)
    model, tok = gguf_loader.load_gguf(path)
    tokens = np.arange(12)[None, :]
    np.testing.assert_allclose(forward(model, tokens), forward(original, tokens), atol=1e-5)
    assert tok.eos_token_ids == (2, 0)


@pytest.mark.slow
def test_default_model_loads_from_cache(smollm2, monkeypatch):
    entry = gguf_loader.cache_entry(registry.default_gguf_path())
    assert (entry / "config.json").is_file() and (entry / "tokenizer.json").is_file()
    assert len(list(entry.glob("*.npy"))) == len(checkpoint.param_shapes(smollm2[0].cfg))

    def no_gguf(*args):
        raise AssertionError("the GGUF file was opened although the cache is warm")

    monkeypatch.setattr(gguf_loader, "GGUFReader", no_gguf)
    model, tok = registry.load(None)
    assert model.cfg == smollm2[0].cfg and tok.eos_token_ids == smollm2[1].eos_token_ids
    np.testing.assert_array_equal(np.asarray(model.norm.weight[...]),
                                  np.asarray(smollm2[0].norm.weight[...]))


def test_missing_file_is_file_not_found(tmp_path):
    missing = tmp_path / "nope.gguf"
    with pytest.raises(FileNotFoundError, match="nope.gguf"):
        gguf_loader.load_gguf(missing)


def test_non_gguf_file_is_value_error(tmp_path, cache):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"PK\x03\x04 not a gguf file")
    with pytest.raises(ValueError, match="not a GGUF file"):
        gguf_loader.load_gguf(path)
    assert not cache.exists()


@pytest.mark.parametrize("meta, message", [
    (GGUFMeta(arch="gemma3"), "unsupported GGUF architecture 'gemma3'"),
    (GGUFMeta(tokenizer_model="llama"), "unsupported tokenizer model 'llama'"),
    (GGUFMeta(pre="qwen2"), "unsupported pre-tokenizer 'qwen2'"),
    (GGUFMeta(rope_scaling="yarn"), "RoPE scaling \\('yarn'"),
])
def test_unsupported_gguf_is_value_error_and_caches_nothing(tmp_path, cache, byte_vocab, meta,
                                                           message):
    model = tiny.tiny_model(0, vocab_size=len(byte_vocab[0]))
    path = write_tiny_gguf(tmp_path / "bad.gguf", model, byte_vocab, meta)
    with pytest.raises(ValueError, match=message):
        gguf_loader.load_gguf(path)
    assert not cache.exists()
