"""Loads a Llama checkpoint in Hugging Face layout: config.json, *.safetensors, tokenizer.json.

Accepted: `LlamaForCausalLM` and `MistralForCausalLM`-style configs with SiLU, no biases, default
RoPE and no sliding window, in float32, float16 or bfloat16 (upcast to float32). Shards are listed
by `model.safetensors.index.json` when present, else every `*.safetensors` file is read.

Safetensors is read by a small reader over numpy (`read_safetensors`): an 8-byte little-endian
header length, a JSON header of {name: {dtype, shape, data_offsets}}, then the raw little-endian
bytes, which are memory-mapped rather than read.
"""

import json
import os
import pathlib

import ml_dtypes
import numpy as np
import tokenizers

from jaxspec.models import checkpoint
from jaxspec.models import llama
from jaxspec.models import precision
from jaxspec.models import tokenizer as tokenizer_lib

SUPPORTED_MODEL_TYPES = ("llama", "mistral")
SAFETENSORS_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"),
                      "BF16": np.dtype(ml_dtypes.bfloat16)}
# A header larger than this is a corrupt file, not a checkpoint (the format caps it at 100 MB).
_MAX_HEADER_BYTES = 100 * 1024 * 1024

_REQUIRED_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                  "num_attention_heads")
# The only values of these config fields that `models/llama.py` implements.
_SUPPORTED_VALUES = {"hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
                     "sliding_window": None, "partial_rotary_factor": 1.0, "rope_type": "default"}

# HF per-layer tensor name (after `model.layers.<i>.`) -> its canonical path (`checkpoint.py`).
_LAYER_TENSORS = {
    "self_attn.q_proj.weight": "layers.q_proj.kernel",
    "self_attn.k_proj.weight": "layers.k_proj.kernel",
    "self_attn.v_proj.weight": "layers.v_proj.kernel",
    "self_attn.o_proj.weight": "layers.o_proj.kernel",
    "mlp.gate_proj.weight": "layers.gate_proj.kernel",
    "mlp.up_proj.weight": "layers.up_proj.kernel",
    "mlp.down_proj.weight": "layers.down_proj.kernel",
    "input_layernorm.weight": "layers.input_norm.weight",
    "post_attention_layernorm.weight": "layers.post_norm.weight",
}


def read_safetensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every tensor of one safetensors file, memory-mapped, in its stored dtype.

    Raises:
      ValueError: the file is malformed or holds a dtype other than F32/F16/BF16.
    """
    path = pathlib.Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        if not 0 < n <= min(_MAX_HEADER_BYTES, size - 8):
            raise ValueError(f"{str(path)!r} is not a safetensors file (header length {n})")
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    data_start = 8 + n
    data = (np.memmap(path, np.uint8, mode="r", offset=data_start) if size > data_start
            else np.zeros(0, np.uint8))
    out = {}
    for name, info in header.items():
        if info["dtype"] not in SAFETENSORS_DTYPES:
            raise ValueError(f"{str(path)!r}: tensor {name!r} has dtype {info['dtype']!r}; "
                             f"supported: {sorted(SAFETENSORS_DTYPES)}")
        dtype = SAFETENSORS_DTYPES[info["dtype"]]
        start, end = info["data_offsets"]
        shape = tuple(info["shape"])
        nbytes = dtype.itemsize * int(np.prod(shape))
        if not 0 <= start <= end <= data.size or end - start != nbytes:
            raise ValueError(f"{str(path)!r}: tensor {name!r} has data_offsets {[start, end]} "
                             f"that do not fit shape {shape} of {info['dtype']}")
        out[name] = data[start:end].view(dtype).reshape(shape)
    return out


def config_from_hf(config: dict, path: pathlib.Path) -> llama.LlamaConfig:
    """The architecture from an HF `config.json`; ValueError for what the model cannot run."""
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"{str(path)!r}: unsupported model_type {model_type!r}; jaxspec loads "
                         f"{', '.join(SUPPORTED_MODEL_TYPES)}")
    # transformers 4 writes `rope_theta` + `rope_scaling`; transformers 5 writes `rope_parameters`.
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    values = {
        "hidden_act": config.get("hidden_act", "silu"),
        "attention_bias": bool(config.get("attention_bias", False)),
        "mlp_bias": bool(config.get("mlp_bias", False)),
        "sliding_window": config.get("sliding_window"),
        "partial_rotary_factor": config.get("partial_rotary_factor", 1.0),
        "rope_type": rope.get("rope_type", rope.get("type", "default")),
    }
    bad = {k: v for k, v in values.items() if v != _SUPPORTED_VALUES[k]}
    if bad:
        raise ValueError(f"{str(path)!r}: unsupported config values {bad}; jaxspec implements "
                         f"{ {k: _SUPPORTED_VALUES[k] for k in bad} }")
    missing = [k for k in _REQUIRED_KEYS if k not in config]
    if missing:
        raise ValueError(f"{str(path)!r}: config.json lacks {missing}")
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    return llama.LlamaConfig(
        vocab_size=config["vocab_size"],
        hidden_size=config["hidden_size"],
        intermediate_size=config["intermediate_size"],
        num_layers=config["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=config.get("num_key_value_heads") or heads,
        head_dim=None if head_dim * heads == config["hidden_size"] else head_dim,
        rope_theta=float(config.get("rope_theta") or rope.get("rope_theta") or 10000.0),
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(config.get("tie_word_embeddings", False)),
        max_position_embeddings=config.get("max_position_embeddings"),
    )


def params_from_hf(tensors: dict[str, np.ndarray], cfg: llama.LlamaConfig, path: pathlib.Path
                   ) -> dict[str, np.ndarray]:
    """HF tensors ([out, in] linears) -> float32 parameters in the canonical layout."""
    used = set()

    def get(name: str) -> np.ndarray:
        if name not in tensors:
            raise ValueError(f"{str(path)!r}: checkpoint has no tensor {name!r}")
        used.add(name)
        return np.asarray(tensors[name], np.float32)

    params = {"embed.embedding": get("model.embed_tokens.weight"),
              "norm.weight": get("model.norm.weight")}
    if cfg.tie_embeddings:
        used.add("lm_head.weight")   # some checkpoints store the tied copy too
    else:
        params["lm_head.kernel"] = get("lm_head.weight").T
    for suffix, name in _LAYER_TENSORS.items():
        layers = [get(f"model.layers.{i}.{suffix}") for i in range(cfg.num_layers)]
        params[name] = np.stack([w.T if w.ndim == 2 else w for w in layers])
    unused = sorted(n for n in tensors.keys() - used if not n.endswith("rotary_emb.inv_freq"))
    if unused:
        raise ValueError(f"{str(path)!r}: checkpoint tensors the model has no place for: "
                         f"{unused[:8]}")
    return params


def tokenizer_from_hf(directory: pathlib.Path, config: dict) -> tokenizer_lib.Tokenizer:
    """`tokenizer.json`, with special tokens and chat template from the side files."""
    tok_file = directory / "tokenizer.json"
    if not tok_file.is_file():
        raise FileNotFoundError(f"{str(directory)!r} has no tokenizer.json")
    backend = tokenizers.Tokenizer.from_file(str(tok_file))
    tok_config = _read_json(directory / "tokenizer_config.json")
    gen_config = _read_json(directory / "generation_config.json")

    def token_id(token) -> int | None:
        text = token.get("content") if isinstance(token, dict) else token
        return None if text is None else backend.token_to_id(text)

    bos = token_id(tok_config.get("bos_token"))
    bos = config.get("bos_token_id") if bos is None else bos
    eos_ids = []
    for value in (gen_config.get("eos_token_id"), token_id(tok_config.get("eos_token")),
                  config.get("eos_token_id")):
        for i in value if isinstance(value, list) else [value]:
            if i is not None and i not in eos_ids:
                eos_ids.append(i)
    if "add_bos_token" in tok_config:
        add_bos = bool(tok_config["add_bos_token"])
    else:   # e.g. Llama 3: BOS comes from the tokenizer.json post-processor
        add_bos = bos is not None and backend.encode("a", add_special_tokens=True).ids[:1] == [bos]
    template = tok_config.get("chat_template")
    if isinstance(template, list):   # named templates: [{"name": "default", "template": ...}, ...]
        template = {t["name"]: t["template"] for t in template}.get("default")
    if (directory / "chat_template.jinja").is_file():   # transformers 5 saves it separately
        template = (directory / "chat_template.jinja").read_text()
    return tokenizer_lib.Tokenizer(backend=backend, bos_token_id=bos, add_bos=add_bos,
                                   eos_token_ids=tuple(eos_ids), chat_template=template)


def load_hf(directory: str | os.PathLike, dtype=None
            ) -> tuple[llama.LlamaForCausalLM, tokenizer_lib.Tokenizer]:
    """Loads a Llama checkpoint directory in Hugging Face layout.

    Args:
      directory: `config.json`, `*.safetensors` and `tokenizer.json`.
      dtype: the weights' dtype, "float32" or "bfloat16" (None: `precision.resolve`'s default
        for this backend).

    Returns:
      (model, tokenizer), the model's weights on the default device.

    Raises:
      FileNotFoundError: the directory, its config.json, tokenizer.json or weights are missing.
      ValueError: an unsupported architecture or config value, or weights that do not fit it.
    """
    directory = pathlib.Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"no model directory at {str(directory)!r}")
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(f"{str(directory)!r} has no config.json")
    config = _read_json(directory / "config.json")
    cfg = config_from_hf(config, directory)
    tok = tokenizer_from_hf(directory, config)
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        files = sorted({directory / f for f in _read_json(index)["weight_map"].values()})
    else:
        files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{str(directory)!r} has no *.safetensors weights")
    tensors = {}
    for f in files:
        tensors.update(read_safetensors(f))
    return checkpoint.build_model(cfg, params_from_hf(tensors, cfg, directory),
                                  precision.resolve(dtype)), tok


def _read_json(path: pathlib.Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}
