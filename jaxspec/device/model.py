"""The protocol a causal LM implements to be driven by jaxspec.

The engine depends on this protocol only (`device/` never imports `models/`). A model is a Flax NNX
module; the engine splits it with `nnx.split` outside `jax.jit` and merges it inside, so weights are
traced arguments rather than constants baked into the HLO.
"""

import dataclasses
from typing import Any
from typing import Protocol

import jax
import jax.numpy as jnp

from jaxspec.device import kv_cache


@dataclasses.dataclass(frozen=True, kw_only=True)
class CacheSpec:
    """What the engine needs to size a paged KV cache for a model."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    max_context_len: int | None = None   # positions the model was trained for; None: unknown
    num_heads: int | None = None         # query heads (a mesh's model axis must divide them)
    dtype: Any = jnp.float32             # the activations' dtype: the KV cache's default


class CausalLM(Protocol):
    """A decoder-only LM that reads and writes a paged KV cache.

    `__call__` runs T new tokens per row at positions `view.positions(T)` (`lengths[b] + t`,
    or in a token tree `lengths[b] + depth`) and returns hidden states, its attention reading
    the new keys causally or through `view.tree` (`ops.paged_attention` does both); `logits`
    maps hidden states to float32 vocabulary logits. They are separate so a caller can compute
    logits only where it needs them (the last prompt position in prefill).
    With `view.numerics == "exact"` every row must be computed the same way whatever the number
    of rows in the call (`jaxspec.device.linear`, `jaxspec.device.causal_attention`); the caller
    passes the same view to `logits`, so the hidden states in between may be the model's own
    (llama's are the last layer's output, before its final norm).

    To run over a device mesh (`jaxspec.device.sharding`) a model also has
    `param_specs(axis, size)`: the PartitionSpec of every parameter for a model axis of `size`
    devices; and, to run on a model axis larger than its KV heads, `with_kv_heads(n)`: the same
    model with each KV head repeated up to n heads. `jaxspec.models.llama` implements both.
    """

    vocab_size: int
    cache_spec: CacheSpec

    def __call__(self, tokens: jax.Array, kv: kv_cache.KVPages, view: kv_cache.CacheView
                 ) -> tuple[jax.Array, kv_cache.KVPages]:
        """tokens i32[B, T] -> (hidden f32[B, T, D], kv with the valid new tokens written)."""
        ...

    def logits(self, hidden: jax.Array, view: kv_cache.CacheView | None = None) -> jax.Array:
        """[..., D] -> f32[..., vocab_size]; `view` as given to `__call__` (its numerics)."""
        ...
