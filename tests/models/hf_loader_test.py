"""Hugging Face layout: the safetensors reader, tiny checkpoints written here (and read back by
transformers when it is installed), side files of the tokenizer, and errors."""

import dataclasses
import json
import struct

import ml_dtypes
import numpy as np
import pytest
import tokenizers

from jaxspec.models import checkpoint
from jaxspec.models import hf_loader
from jaxspec.models import registry
from jaxspec.models import tiny

CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
          "'<|im_end|>\\n' }}{% endfor %}")
_DTYPE_NAMES = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16",
                np.dtype(ml_dtypes.bfloat16): "BF16", np.dtype(np.int64): "I64"}


def write_safetensors(path, tensors):
    """The safetensors format, written by hand: u64 header length, JSON header, raw bytes."""
    header, blobs, offset = {"__metadata__": {"format": "np"}}, [], 0
    for name, value in tensors.items():
        blob = np.ascontiguousarray(value).tobytes()
        header[name] = {"dtype": _DTYPE_NAMES[value.dtype], "shape": list(value.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)          # the format pads the header to 8 bytes
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"".join(blobs))


def hf_tensors(model, dtype=np.float32):
    """The tiny model's weights under Hugging Face names, [out, in] linears."""
    cfg, p = model.cfg, checkpoint.flat_params(model)
    out = {"model.embed_tokens.weight": p["embed.embedding"], "model.norm.weight": p["norm.weight"]}
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = p["lm_head.kernel"].T
    for hf_suffix, name in hf_loader._LAYER_TENSORS.items():
        for i in range(cfg.num_layers):
            w = p[name][i]
            out[f"model.layers.{i}.{hf_suffix}"] = w.T if w.ndim == 2 else w
    return {k: np.ascontiguousarray(v).astype(dtype) for k, v in out.items()}


def hf_config(cfg, **overrides):
    config = dict(
        architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads, rope_theta=cfg.rope_theta,
        rms_norm_eps=cfg.rms_norm_eps, tie_word_embeddings=cfg.tie_embeddings, hidden_act="silu",
        max_position_embeddings=256, bos_token_id=1, eos_token_id=2, torch_dtype="float32")
    config.update(overrides)
    return config


def write_tiny_hf(directory, model, vocab, *, dtype=np.float32, shards=1, config=None,
                  side_files=True):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config or hf_config(model.cfg)))
    tensors = hf_tensors(model, dtype)
    if shards == 1:
        write_safetensors(directory / "model.safetensors", tensors)
    else:
        names, weight_map = sorted(tensors), {}
        for s in range(shards):
            file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            part = names[s::shards]
            write_safetensors(directory / file, {n: tensors[n] for n in part})
            weight_map.update(dict.fromkeys(part, file))
        (directory / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {}, "weight_map": weight_map}))
    tokens, merges, types = vocab
    backend = tokenizers.Tokenizer(tokenizers.models.BPE(
        vocab={t: i for i, t in enumerate(tokens)}, merges=[tuple(m.split()) for m in merges]))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = tokenizers.decoders.ByteLevel()
    backend.add_special_tokens([tokenizers.AddedToken(t, special=True)
                                for t, ty in zip(tokens, types, strict=True) if ty == 3])
    backend.save(str(directory / "tokenizer.json"))
    if side_files:
        (directory / "tokenizer_config.json").write_text(json.dumps(dict(
            bos_token="<|im_start|>", eos_token={"content": "<|im_end|>"}, add_bos_token=False,
            chat_template=CHATML)))
        (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    return directory


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_safetensors_reader_round_trip(tmp_path, dtype):
    rng = np.random.default_rng(0)
    tensors = {"a": rng.normal(size=(3, 5)).astype(dtype),
               "b.c": rng.normal(size=(7,)).astype(dtype), "empty": np.zeros((0, 4), dtype)}
    write_safetensors(tmp_path / "x.safetensors", tensors)
    read = hf_loader.read_safetensors(tmp_path / "x.safetensors")
    assert read.keys() == tensors.keys()
    for name, value in tensors.items():
        assert read[name].dtype == value.dtype
        np.testing.assert_array_equal(read[name], value)


def test_safetensors_reader_agrees_with_the_safetensors_package(tmp_path):
    st_numpy = pytest.importorskip("safetensors.numpy")
    rng = np.random.default_rng(1)
    tensors = {"w": rng.normal(size=(4, 6)).astype(np.float16),
               "v": rng.normal(size=(5,)).astype(np.float32)}
    st_numpy.save_file(tensors, str(tmp_path / "theirs.safetensors"))
    read = hf_loader.read_safetensors(tmp_path / "theirs.safetensors")
    write_safetensors(tmp_path / "ours.safetensors", tensors)
    theirs = st_numpy.load_file(str(tmp_path / "ours.safetensors"))
    for name, value in tensors.items():
        np.testing.assert_array_equal(read[name], value)
        np.testing.assert_array_equal(theirs[name], value)


def test_safetensors_reader_rejects_bad_files(tmp_path):
    write_safetensors(tmp_path / "int.safetensors", {"i": np.arange(4, dtype=np.int64)})
    with pytest.raises(ValueError, match="'i' has dtype 'I64'"):
        hf_loader.read_safetensors(tmp_path / "int.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(ValueError, match="not a safetensors file"):
        hf_loader.read_safetensors(tmp_path / "junk.safetensors")


@pytest.mark.parametrize("tie, shards", [(True, 1), (False, 1), (False, 3)])
def test_load_hf_matches_the_written_model(tmp_path, byte_vocab, forward, tie, shards):
    original = tiny.tiny_model(5, vocab_size=len(byte_vocab[0]), tie_embeddings=tie)
    directory = write_tiny_hf(tmp_path / "ckpt", original, byte_vocab, shards=shards)
    model, tok = registry.load(directory)
    assert model.cfg == dataclasses.replace(original.cfg, max_position_embeddings=256)
    tokens = np.random.default_rng(0).integers(0, original.cfg.vocab_size, (2, 19))
    np.testing.assert_allclose(forward(model, tokens), forward(original, tokens), atol=1e-5)
    assert (tok.bos_token_id, tok.add_bos, tok.eos_token_ids) == (1, False, (2, 0))
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == (
        "<|im_start|>user\nhi<|im_end|>\n")


def test_load_hf_bfloat16_upcasts_exactly(tmp_path, byte_vocab, forward):
    original = tiny.tiny_model(6, vocab_size=len(byte_vocab[0]))
    directory = write_tiny_hf(tmp_path / "ckpt", original, byte_vocab, dtype=ml_dtypes.bfloat16)
    model, _ = hf_loader.load_hf(directory)
    rounded = {k: v.astype(ml_dtypes.bfloat16).astype(np.float32)
               for k, v in checkpoint.flat_params(original).items()}
    for name, value in checkpoint.flat_params(model).items():
        np.testing.assert_array_equal(value, rounded[name])


def test_transformers_reads_the_tiny_checkpoint_the_same(tmp_path, byte_vocab, forward):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    original = tiny.tiny_model(7, vocab_size=len(byte_vocab[0]), tie_embeddings=False)
    directory = write_tiny_hf(tmp_path / "ckpt", original, byte_vocab, shards=2)
    hf = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    model, _ = hf_loader.load_hf(directory)
    tokens = np.random.default_rng(1).integers(0, original.cfg.vocab_size, (1, 23))
    with torch.no_grad():
        reference = hf(torch.tensor(tokens)).logits.numpy()
    np.testing.assert_allclose(forward(model, tokens), reference, atol=1e-5)


def test_tokenizer_defaults_without_side_files(tmp_path, byte_vocab):
    original = tiny.tiny_model(0, vocab_size=len(byte_vocab[0]))
    directory = write_tiny_hf(tmp_path / "ckpt", original, byte_vocab, side_files=False)
    (directory / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    _, tok = hf_loader.load_hf(directory)
    assert (tok.bos_token_id, tok.add_bos, tok.eos_token_ids) == (1, False, (2,))
    assert tok.apply_chat_template([{"role": "user", "content": "x"}]) == "x"


def test_bos_from_the_post_processor_is_detected(tmp_path, byte_vocab):
    original = tiny.tiny_model(0, vocab_size=len(byte_vocab[0]))
    directory = write_tiny_hf(tmp_path / "ckpt", original, byte_vocab, side_files=False)
    backend = tokenizers.Tokenizer.from_file(str(directory / "tokenizer.json"))
    backend.post_processor = tokenizers.processors.TemplateProcessing(
        single="<|im_start|> $A", special_tokens=[("<|im_start|>", 1)])
    backend.save(str(directory / "tokenizer.json"))
    _, tok = hf_loader.load_hf(directory)
    assert tok.add_bos
    assert tok.encode("in") == [1, tok.token_to_id("in")]


@pytest.mark.parametrize("overrides, message", [
    (dict(model_type="gpt2"), "unsupported model_type 'gpt2'"),
    (dict(rope_scaling={"rope_type": "llama3", "factor": 8.0}), "'rope_type': 'llama3'"),
    (dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4}), "'rope_type': 'yarn'"),
    (dict(sliding_window=4096), "'sliding_window': 4096"),
    (dict(attention_bias=True), "'attention_bias': True"),
    (dict(hidden_act="gelu"), "'hidden_act': 'gelu'"),
    (dict(num_hidden_layers=None), "num_hidden_layers"),
])
def test_unsupported_configs_are_value_errors(tmp_path, byte_vocab, overrides, message):
    original = tiny.tiny_model(0, vocab_size=len(byte_vocab[0]))
    config = {k: v for k, v in hf_config(original.cfg, **overrides).items() if v is not None}
    directory = write_tiny_hf(tmp_path / "ckpt", original, byte_vocab, config=config)
    with pytest.raises(ValueError, match=message):
        hf_loader.load_hf(directory)


def test_rope_theta_from_transformers5_rope_parameters(tmp_path, byte_vocab):
    original = tiny.tiny_model(0, vocab_size=len(byte_vocab[0]), rope_theta=5e5)
    config = hf_config(original.cfg, rope_parameters={"rope_type": "default", "rope_theta": 5e5})
    del config["rope_theta"]
    model, _ = hf_loader.load_hf(write_tiny_hf(tmp_path / "ckpt", original, byte_vocab,
                                               config=config))
    assert model.cfg.rope_theta == 5e5


def test_missing_and_extra_tensors_are_value_errors(tmp_path, byte_vocab):
    original = tiny.tiny_model(0, vocab_size=len(byte_vocab[0]))
    directory = write_tiny_hf(tmp_path / "ckpt", original, byte_vocab)
    tensors = hf_tensors(original)
    extra = dict(tensors, **{"model.layers.0.self_attn.q_proj.bias": np.zeros(64, np.float32)})
    write_safetensors(directory / "model.safetensors", extra)
    with pytest.raises(ValueError, match="q_proj.bias"):
        hf_loader.load_hf(directory)
    del tensors["model.layers.1.mlp.up_proj.weight"]
    write_safetensors(directory / "model.safetensors", tensors)
    with pytest.raises(ValueError, match="no tensor 'model.layers.1.mlp.up_proj.weight'"):
        hf_loader.load_hf(directory)


@pytest.mark.parametrize("remove", ["config.json", "tokenizer.json", "model.safetensors"])
def test_missing_files_are_file_not_found(tmp_path, byte_vocab, remove):
    original = tiny.tiny_model(0, vocab_size=len(byte_vocab[0]))
    directory = write_tiny_hf(tmp_path / "ckpt", original, byte_vocab)
    (directory / remove).unlink()
    with pytest.raises(FileNotFoundError, match="config.json|tokenizer.json|safetensors"):
        hf_loader.load_hf(directory)
