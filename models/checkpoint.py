"""Builds a `LlamaForCausalLM` from host arrays, without paying for random initialization.

Both loaders reduce a checkpoint to one dict keyed by the model's own parameter paths, in its own
layout (linear kernels [in, out], decoder weights stacked on a leading layer axis):

    embed.embedding            [V, D]
    layers.q_proj.kernel       [L, D, Hq * hd]      (likewise k_proj, v_proj, o_proj,
    layers.input_norm.weight   [L, D]                gate_proj, up_proj, down_proj, post_norm)
    norm.weight                [D]
    lm_head.kernel             [D, V]               (only when embeddings are untied)
"""

import jax
import numpy as np
from flax import nnx

from jaxspec.models import llama


def param_shapes(cfg: llama.LlamaConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter path of the model for `cfg`, with its shape (computed abstractly)."""
    abstract = nnx.eval_shape(lambda: llama.LlamaForCausalLM(cfg, rngs=nnx.Rngs(0)))
    return {".".join(map(str, path)): tuple(v.shape)
            for path, v in nnx.to_flat_state(nnx.state(abstract, nnx.Param))}


def build_model(cfg: llama.LlamaConfig, params: dict[str, np.ndarray]) -> llama.LlamaForCausalLM:
    """The model for `cfg` holding `params` (float32 copies on the default device, so a
    memory-mapped cache file is read once, here).

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
    flat = [(path, var.replace(jax.device_put(np.asarray(params[".".join(map(str, path))],
                                                         np.float32))))
            for path, var in nnx.to_flat_state(state)]
    return nnx.merge(graphdef, nnx.from_flat_state(flat))


def flat_params(model: llama.LlamaForCausalLM) -> dict[str, np.ndarray]:
    """The model's parameters as host arrays keyed by path: the inverse of `build_model`."""
    return {".".join(map(str, path)): np.asarray(var[...])
            for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param))}
