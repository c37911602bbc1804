"""Loads a Llama-family GGUF file (llama.cpp's format) as a `LlamaForCausalLM` and its tokenizer.

Conversion, done once per file:
  1. read the hyperparameters from the `llama.*` metadata and reject what the model cannot run
     (other architectures, partial rotary, RoPE scaling);
  2. dequantize every tensor to float32 with `gguf`;
  3. undo llama.cpp's q/k row permutation: its converter reorders each head's rows so that the
     interleaved RoPE pairs (2i, 2i+1) act like Hugging Face's rotate-half pairs (i, i + hd/2);
     `models/llama.py` implements rotate-half, so it needs the original order back;
  4. transpose [out, in] -> [in, out] and stack the layers (see `checkpoint.py` for the layout);
  5. build the byte-level BPE tokenizer from the `tokenizer.ggml.*` metadata.

Opening the GGUF and dequantizing take seconds (2.3 s just to parse SmolLM2's 98k vocabulary
strings), so the result is cached on disk, keyed by the file's name, size and mtime:

    $JAXSPEC_CACHE (default ~/.cache/jaxspec)/
      SmolLM2-135M-Instruct.Q4_1-98362432-<mtime_ns>-v1/
        config.json  tokenizer.json  tokenizer_meta.json  <param path>.npy ...

An entry is written to a temporary directory and renamed into place, so a directory that exists is
complete. A warm load memory-maps the `.npy` files and never opens the GGUF.
"""

import dataclasses
import json
import os
import pathlib
import shutil
import tempfile

from gguf import GGUFReader
from gguf.constants import TokenType
from gguf.quants import dequantize
import numpy as np
import tokenizers
from tokenizers import decoders
from tokenizers import pre_tokenizers

from jaxspec.models import checkpoint
from jaxspec.models import llama
from jaxspec.models import precision
from jaxspec.models import tokenizer as tokenizer_lib

GGUF_MAGIC = b"GGUF"
SUPPORTED_ARCHITECTURES = ("llama",)
CACHE_ENV = "JAXSPEC_CACHE"
# Bump when the cached layout or the conversion changes, so stale entries are never read.
_CACHE_VERSION = 2

# llama.cpp's pre-tokenizer types we reproduce exactly. 'smollm' (like 'starcoder') splits every
# digit on its own before the GPT-2 regex; see llama-vocab.cpp.
def _digits_then_gpt2() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                             use_regex=True)])


_PRE_TOKENIZERS = {"smollm": _digits_then_gpt2, "starcoder": _digits_then_gpt2}
# Control tokens that end a turn in common chat formats; like llama.cpp, generation stops on any
# of them that the vocabulary has, not only on the declared EOS.
_END_OF_GENERATION = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>",
                      "<end_of_turn>", "<|end|>")

# Per-layer GGUF tensor name -> its module in the canonical stacked layout (`checkpoint.py`).
_LAYER_LINEARS = {
    "attn_q": "q_proj", "attn_k": "k_proj", "attn_v": "v_proj", "attn_output": "o_proj",
    "ffn_gate": "gate_proj", "ffn_up": "up_proj", "ffn_down": "down_proj",
}
_LAYER_NORMS = {"attn_norm": "input_norm", "ffn_norm": "post_norm"}


def cache_root() -> pathlib.Path:
    """Where converted GGUF files are cached: `$JAXSPEC_CACHE`, else ~/.cache/jaxspec."""
    return pathlib.Path(os.environ.get(CACHE_ENV) or pathlib.Path.home() / ".cache" / "jaxspec")


def cache_entry(path: str | os.PathLike) -> pathlib.Path:
    """The cache directory for the GGUF file at `path` (it may not exist yet)."""
    path = pathlib.Path(path)
    st = path.stat()
    return cache_root() / f"{path.stem}-{st.st_size}-{st.st_mtime_ns}-v{_CACHE_VERSION}"


def load_gguf(path: str | os.PathLike, dtype=None
              ) -> tuple[llama.LlamaForCausalLM, tokenizer_lib.Tokenizer]:
    """Loads a Llama-family GGUF file, converting and caching it on first use.

    Args:
      path: the .gguf file.
      dtype: the weights' dtype, "float32" or "bfloat16" (None: `precision.resolve`'s default
        for this backend); the cache holds float32, converted once at load.

    Returns:
      (model, tokenizer), the model's weights on the default device.

    Raises:
      FileNotFoundError: `path` does not exist.
      ValueError: the file is not GGUF, or holds an architecture, tokenizer or RoPE variant that
        jaxspec does not implement (the message names it).
    """
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no GGUF file at {str(path)!r}")
    with open(path, "rb") as f:
        magic = f.read(len(GGUF_MAGIC))
    if magic != GGUF_MAGIC:
        raise ValueError(f"{str(path)!r} is not a GGUF file (starts with {magic!r}, expected "
                         f"{GGUF_MAGIC!r})")
    entry = cache_entry(path)
    if not entry.is_dir():
        _convert(path, entry)
    return _load_entry(entry, precision.resolve(dtype))


def _convert(path: pathlib.Path, entry: pathlib.Path) -> None:
    reader = GGUFReader(path)
    cfg = config_from_gguf(reader, path)
    tok = tokenizer_from_gguf(reader, path)
    if tok.vocab_size > cfg.vocab_size:
        raise ValueError(f"{str(path)!r}: tokenizer has {tok.vocab_size} tokens but the embedding "
                         f"only {cfg.vocab_size} rows")
    params = params_from_gguf(reader, cfg, path)
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=entry.parent))
    try:
        for name, value in params.items():
            np.save(tmp / f"{name}.npy", value)
        (tmp / "config.json").write_text(json.dumps(dataclasses.asdict(cfg)))
        tok.backend.save(str(tmp / "tokenizer.json"))
        (tmp / "tokenizer_meta.json").write_text(json.dumps(dict(
            bos_token_id=tok.bos_token_id, add_bos=tok.add_bos,
            eos_token_ids=list(tok.eos_token_ids), chat_template=tok.chat_template)))
        os.rename(tmp, entry)
    except OSError:
        # Another process renamed its copy into place first; theirs is as good as ours.
        if not entry.is_dir():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _load_entry(entry: pathlib.Path, dtype
                ) -> tuple[llama.LlamaForCausalLM, tokenizer_lib.Tokenizer]:
    cfg = llama.LlamaConfig(**json.loads((entry / "config.json").read_text()))
    params = {f.stem: np.load(f, mmap_mode="r") for f in entry.glob("*.npy")}
    meta = json.loads((entry / "tokenizer_meta.json").read_text())
    tok = tokenizer_lib.Tokenizer(
        backend=tokenizers.Tokenizer.from_file(str(entry / "tokenizer.json")),
        bos_token_id=meta["bos_token_id"], add_bos=meta["add_bos"],
        eos_token_ids=tuple(meta["eos_token_ids"]), chat_template=meta["chat_template"])
    return checkpoint.build_model(cfg, params, dtype), tok


_REQUIRED = object()


def _field(reader: GGUFReader, key: str, default=_REQUIRED, *, path: pathlib.Path):
    field = reader.fields.get(key)
    if field is None:
        if default is _REQUIRED:
            raise ValueError(f"{str(path)!r}: GGUF metadata lacks {key!r}")
        return default
    return field.contents()


def config_from_gguf(reader: GGUFReader, path: pathlib.Path) -> llama.LlamaConfig:
    """The architecture from the GGUF metadata; ValueError for what the model cannot run."""
    arch = _field(reader, "general.architecture", path=path)
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"{str(path)!r}: unsupported GGUF architecture {arch!r}; jaxspec loads "
                         f"{', '.join(SUPPORTED_ARCHITECTURES)}")
    get = lambda key, default=_REQUIRED: _field(reader, f"{arch}.{key}", default, path=path)  # noqa: E731
    hidden, heads = int(get("embedding_length")), int(get("attention.head_count"))
    head_dim = int(get("attention.key_length", hidden // heads))
    rope_dim = int(get("rope.dimension_count", head_dim))
    if rope_dim != head_dim:
        raise ValueError(f"{str(path)!r}: partial rotary embedding (rope.dimension_count="
                         f"{rope_dim}, head_dim={head_dim}) is not supported")
    scaling = get("rope.scaling.type", "none")
    if scaling != "none" or "rope_freqs.weight" in {t.name for t in reader.tensors}:
        raise ValueError(f"{str(path)!r}: RoPE scaling ({scaling!r} or rope_freqs.weight) is not "
                         f"supported")
    tensors = {t.name: t for t in reader.tensors}
    if "token_embd.weight" not in tensors:
        raise ValueError(f"{str(path)!r}: GGUF has no tensor 'token_embd.weight'")
    return llama.LlamaConfig(
        vocab_size=int(tensors["token_embd.weight"].shape[1]),
        hidden_size=hidden,
        intermediate_size=int(get("feed_forward_length")),
        num_layers=int(get("block_count")),
        num_heads=heads,
        num_kv_heads=int(get("attention.head_count_kv", heads)),
        head_dim=None if head_dim * heads == hidden else head_dim,
        rope_theta=float(get("rope.freq_base", 10000.0)),
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon")),
        tie_embeddings="output.weight" not in tensors,
        max_position_embeddings=_optional_int(get("context_length", None)),
    )


def _optional_int(value) -> int | None:
    return None if value is None else int(value)


def unpermute_rope_rows(w: np.ndarray, num_heads: int) -> np.ndarray:
    """Undoes llama.cpp's q/k permutation of the rows of an [out, in] weight.

    Within each head, llama.cpp stores row j of the first half at 2j and row j of the second half
    at 2j + 1; this puts them back at j and j + hd/2.
    """
    out, inp = w.shape
    return w.reshape(num_heads, out // num_heads // 2, 2, inp).swapaxes(1, 2).reshape(out, inp)


def params_from_gguf(reader: GGUFReader, cfg: llama.LlamaConfig, path: pathlib.Path
                     ) -> dict[str, np.ndarray]:
    """Dequantized float32 parameters in the canonical layout (see `checkpoint.py`)."""
    tensors = {t.name: t for t in reader.tensors}

    def get(name: str) -> np.ndarray:
        if name not in tensors:
            raise ValueError(f"{str(path)!r}: GGUF has no tensor {name!r}")
        t = tensors[name]
        w = np.asarray(dequantize(t.data, t.tensor_type), np.float32)
        return w.reshape(tuple(int(n) for n in reversed(t.shape)))    # ne order is reversed

    params = {"embed.embedding": get("token_embd.weight"), "norm.weight": get("output_norm.weight")}
    if not cfg.tie_embeddings:
        params["lm_head.kernel"] = np.ascontiguousarray(get("output.weight").T)
    for gguf_name, name in _LAYER_NORMS.items():
        params[f"layers.{name}.weight"] = np.stack(
            [get(f"blk.{i}.{gguf_name}.weight") for i in range(cfg.num_layers)])
    permuted_heads = {"attn_q": cfg.num_heads, "attn_k": cfg.num_kv_heads}
    for gguf_name, name in _LAYER_LINEARS.items():
        stacked = None
        for i in range(cfg.num_layers):
            w = get(f"blk.{i}.{gguf_name}.weight")
            if gguf_name in permuted_heads:
                w = unpermute_rope_rows(w, permuted_heads[gguf_name])
            if stacked is None:
                stacked = np.empty((cfg.num_layers,) + w.T.shape, np.float32)
            stacked[i] = w.T
        params[f"layers.{name}.kernel"] = stacked
    return params


def tokenizer_from_gguf(reader: GGUFReader, path: pathlib.Path) -> tokenizer_lib.Tokenizer:
    """The exact byte-level BPE tokenizer described by the `tokenizer.ggml.*` metadata."""
    get = lambda key, default=_REQUIRED: _field(reader, key, default, path=path)  # noqa: E731
    kind = get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"{str(path)!r}: unsupported tokenizer model {kind!r}; jaxspec builds "
                         f"byte-level BPE ('gpt2') tokenizers")
    pre = get("tokenizer.ggml.pre", "default")
    if pre not in _PRE_TOKENIZERS:
        raise ValueError(f"{str(path)!r}: unsupported pre-tokenizer {pre!r}; jaxspec reproduces "
                         f"{sorted(_PRE_TOKENIZERS)}")
    tokens = get("tokenizer.ggml.tokens")
    merges = get("tokenizer.ggml.merges")
    types = get("tokenizer.ggml.token_type", [TokenType.NORMAL] * len(tokens))
    backend = tokenizers.Tokenizer(tokenizers.models.BPE(
        vocab={t: i for i, t in enumerate(tokens)},
        merges=[tuple(m.split(" ", 1)) for m in merges], fuse_unk=False, byte_fallback=False))
    backend.pre_tokenizer = _PRE_TOKENIZERS[pre]()
    backend.decoder = decoders.ByteLevel()
    # Control tokens are matched whole in text (and are special); user-defined tokens are matched
    # whole too but are ordinary text. Both bypass BPE, as in llama.cpp.
    typed = list(zip(tokens, types, strict=True))
    backend.add_tokens([tokenizers.AddedToken(t, special=False, normalized=False)
                        for t, ty in typed if ty == TokenType.USER_DEFINED])
    backend.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False)
                                for t, ty in typed if ty == TokenType.CONTROL])
    eos = get("tokenizer.ggml.eos_token_id", None)
    control = {t: i for i, (t, ty) in enumerate(typed) if ty == TokenType.CONTROL}
    eos_ids = [] if eos is None else [int(eos)]
    eos_ids += [control[t] for t in _END_OF_GENERATION
                if t in control and control[t] not in eos_ids]
    bos = get("tokenizer.ggml.bos_token_id", None)
    return tokenizer_lib.Tokenizer(
        backend=backend, bos_token_id=None if bos is None else int(bos),
        add_bos=bool(get("tokenizer.ggml.add_bos_token", False)), eos_token_ids=tuple(eos_ids),
        chat_template=get("tokenizer.chat_template", None))
