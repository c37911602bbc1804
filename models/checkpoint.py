"""Builds a `LlamaForCausalLM` from host arrays, without paying for random initialization.

Both loaders reduce a checkpoint to one dict in a canonical layout: every projection on its own,
as checkpoints store them, linear kernels [in, out], decoder weights stacked on a leading layer
axis (which is also how the GGUF weight cache stores them):

    embed.embedding            [V, D]
    layers.q_proj.kernel       [L, D, Hq * hd]      (k_proj and v_proj [L, D, Hkv * hd]; likewise
    layers.input_norm.weight   [L, D]                o_proj, gate_proj, up_proj, down_proj,
    norm.weight                [D]                   post_norm)
    lm_head.kernel             [D, V]               (only when embeddings are untied)

`build_model` splits the stacks into the model's per-layer parameters and fuses q, k, v into
`qkv_proj` and gate, up into `gate_up_proj` (`llama.DecoderLayer` gives the layout);
`flat_params` is its inverse.
"""

import functools

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.models import llama
from jaxspec.models import precision

# The model's fused projections and the canonical ones each is made of, in order.
_FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def _fuse(module: str, parts: list[np.ndarray], cfg: llama.LlamaConfig) -> np.ndarray:
    """`_FUSED[module]`'s kernels [..., D, out] -> the model's fused kernel."""
    if module == "gate_up_proj":
        return np.stack(parts, axis=-2)                                   # [..., D, 2, I]
    # q [..., D, Hq * hd] -> [..., D, Hkv, G, hd] (query head j = kv * G + g), k and v
    # [..., D, Hkv * hd] -> [..., D, Hkv, 1, hd], side by side on the third axis from the end.
    shape = (cfg.num_kv_heads, -1, cfg.resolved_head_dim)
    return np.concatenate([p.reshape(p.shape[:-1] + shape) for p in parts], axis=-2)


def _split(module: str, fused, cfg: llama.LlamaConfig) -> list:
    """The inverse of `_fuse` (on numpy arrays, or abstractly under `jax.eval_shape`)."""
    if module == "gate_up_proj":
        return [fused[..., 0, :], fused[..., 1, :]]
    groups = cfg.num_heads // cfg.num_kv_heads
    lead = fused.shape[:-3]
    return [p.reshape(lead + (-1,)) for p in (fused[..., :groups, :],
                                              fused[..., groups:groups + 1, :],
                                              fused[..., groups + 1:, :])]


def _model_shapes(cfg: llama.LlamaConfig) -> dict[str, tuple[int, ...]]:
    """The model's own parameter paths (per layer) with their shapes, computed abstractly."""
    abstract = nnx.eval_shape(lambda: llama.LlamaForCausalLM(cfg, rngs=nnx.Rngs(0)))
    return {".".join(map(str, path)): tuple(v.shape)
            for path, v in nnx.to_flat_state(nnx.state(abstract, nnx.Param))}


def _canonical_name(path: str) -> tuple[str, int | None]:
    """`layers.3.o_proj.kernel` -> (`layers.o_proj.kernel`, 3); other paths -> (path, None)."""
    parts = path.split(".")
    if parts[0] == "layers":
        return ".".join([parts[0]] + parts[2:]), int(parts[1])
    return path, None


def _fused_module(name: str) -> str | None:
    """`layers.qkv_proj.kernel` -> `qkv_proj`; None for a parameter that is not fused."""
    module = name.split(".")[-2] if name.startswith("layers.") else None
    return module if module in _FUSED else None


def param_shapes(cfg: llama.LlamaConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter of the canonical (stacked) layout for `cfg`, with its shape."""
    shapes = {}
    for path, shape in _model_shapes(cfg).items():
        name, layer = _canonical_name(path)
        shape = shape if layer is None else (cfg.num_layers,) + shape
        module = _fused_module(name)
        if module is None:
            shapes[name] = shape
            continue
        parts = jax.eval_shape(functools.partial(_split, module, cfg=cfg),
                               jax.ShapeDtypeStruct(shape, jnp.float32))
        for part, value in zip(_FUSED[module], parts, strict=True):
            shapes[f"layers.{part}.kernel"] = value.shape
    return shapes


def build_model(cfg: llama.LlamaConfig, params: dict[str, np.ndarray],
                dtype=np.float32) -> llama.LlamaForCausalLM:
    """The model for `cfg` holding `params` (canonical layout), as `dtype` copies on the default
    device (the norms' scales stay float32: `precision.param_dtype`), so a memory-mapped cache
    file is read and converted once, here.

    Raises:
      ValueError: a parameter is missing, unexpected, or has the wrong shape.
    """
    expected = param_shapes(cfg)
    missing = sorted(expected.keys() - params.keys())
    extra = sorted(params.keys() - expected.keys())
    if missing or extra:
        raise ValueError(f"checkpoint does not match the config: missing {missing}, "
                         f"unexpected {extra}")
    for name, shape in expected.items():
        if tuple(params[name].shape) != shape:
            raise ValueError(f"parameter {name} has shape {tuple(params[name].shape)}, "
                             f"expected {shape}")
    abstract = nnx.eval_shape(lambda: llama.LlamaForCausalLM(cfg, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)

    def value(path, var):
        name, layer = _canonical_name(".".join(map(str, path)))
        module = _fused_module(name)
        if module is not None:
            array = _fuse(module, [params[f"layers.{part}.kernel"][layer]
                                   for part in _FUSED[module]], cfg)
        else:
            array = params[name] if layer is None else params[name][layer]
        return jax.device_put(np.asarray(array, np.float32).astype(
            precision.param_dtype(var, dtype)))

    flat = [(path, var.replace(value(path, var))) for path, var in nnx.to_flat_state(state)]
    return nnx.merge(graphdef, nnx.from_flat_state(flat))


def flat_params(model: llama.LlamaForCausalLM) -> dict[str, np.ndarray]:
    """The model's parameters as host arrays in the canonical layout: the inverse of
    `build_model`."""
    per_layer: dict[str, dict[int, np.ndarray]] = {}
    out = {}
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        name, layer = _canonical_name(".".join(map(str, path)))
        if layer is None:
            out[name] = np.asarray(var[...])
        else:
            per_layer.setdefault(name, {})[layer] = np.asarray(var[...])
    for name, layers in per_layer.items():
        stacked = np.stack([layers[i] for i in range(len(layers))])
        module = _fused_module(name)
        if module is None:
            out[name] = stacked
        else:
            parts = _split(module, stacked, model.cfg)
            out.update({f"layers.{part}.kernel": np.ascontiguousarray(value)
                        for part, value in zip(_FUSED[module], parts, strict=True)})
    return out
