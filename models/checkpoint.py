"""Builds a `LlamaForCausalLM` from host arrays, without paying for random initialization.

Both loaders reduce a checkpoint to one dict in a canonical layout (linear kernels [in, out],
decoder weights stacked on a leading layer axis, which is also how the GGUF weight cache stores
them); `build_model` splits the stacks into the model's per-layer parameters
(`layers.<i>.q_proj.kernel`, ...) and `flat_params` stacks them back:

    embed.embedding            [V, D]
    layers.q_proj.kernel       [L, D, Hq * hd]      (likewise k_proj, v_proj, o_proj,
    layers.input_norm.weight   [L, D]                gate_proj, up_proj, down_proj, post_norm)
    norm.weight                [D]
    lm_head.kernel             [D, V]               (only when embeddings are untied)
"""

from flax import nnx
import jax
import numpy as np

from jaxspec.models import llama


def _model_shapes(cfg: llama.LlamaConfig) -> dict[str, tuple[int, ...]]:
    """The model's own parameter paths (per layer) with their shapes, computed abstractly."""
    abstract = nnx.eval_shape(lambda: llama.LlamaForCausalLM(cfg, rngs=nnx.Rngs(0)))
    return {".".join(map(str, path)): tuple(v.shape)
            for path, v in nnx.to_flat_state(nnx.state(abstract, nnx.Param))}


def _canonical_name(path: str) -> tuple[str, int | None]:
    """`layers.3.q_proj.kernel` -> (`layers.q_proj.kernel`, 3); other paths -> (path, None)."""
    parts = path.split(".")
    if parts[0] == "layers":
        return ".".join([parts[0]] + parts[2:]), int(parts[1])
    return path, None


def param_shapes(cfg: llama.LlamaConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter of the canonical (stacked) layout for `cfg`, with its shape."""
    shapes = {}
    for path, shape in _model_shapes(cfg).items():
        name, layer = _canonical_name(path)
        shapes[name] = shape if layer is None else (cfg.num_layers,) + shape
    return shapes


def build_model(cfg: llama.LlamaConfig, params: dict[str, np.ndarray],
                dtype=np.float32) -> llama.LlamaForCausalLM:
    """The model for `cfg` holding `params` (canonical layout), as `dtype` copies on the default
    device, so a memory-mapped cache file is read and converted once, here.

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

    def value(path):
        name, layer = _canonical_name(".".join(map(str, path)))
        array = params[name] if layer is None else params[name][layer]
        return jax.device_put(np.asarray(array, np.float32).astype(dtype))

    flat = [(path, var.replace(value(path))) for path, var in nnx.to_flat_state(state)]
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
        out[name] = np.stack([layers[i] for i in range(len(layers))])
    return out
