"""A Llama-family causal LM in Flax NNX: GQA, RoPE (HF rotate-half layout), RMSNorm, SwiGLU.

Implements `jaxspec.device.model.CausalLM` over the paged KV cache. Each decoder layer owns its
weights and the forward is an unrolled Python loop. A `lax.scan` over stacked weights compiles
faster, but XLA's CPU backend materialises every layer's dynamic weight slice before the matmul,
which multiplies the memory traffic of a decode step that is bound by it.

In the fast path the activations are float32 whatever the weights' dtype: each projection reads
its input in the weights' dtype and returns float32 (`project`), so a bfloat16 model converts
once per matmul input and nowhere else (norms, RoPE and attention run on float32 as they would
anyway), where bfloat16 activations cost a conversion in and out of every float32 computation.
"""

import dataclasses
import math

from flax import nnx
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from jaxspec.device import kv_cache
from jaxspec.device import linear
from jaxspec.device import model as model_lib
from jaxspec.device import ops
from jaxspec.models import precision

FEW_POSITIONS = 64           # logits of up to this many positions take the table-first matmul


@dataclasses.dataclass(frozen=True, kw_only=True)
class LlamaConfig:
    """Architecture hyperparameters (names follow Hugging Face's LlamaConfig)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int | None = None          # None: hidden_size // num_heads
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    tie_embeddings: bool = True          # SmolLM2 reuses the embedding as the LM head
    max_position_embeddings: int | None = None   # the trained context length; None: unknown

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                             f"({self.num_kv_heads})")
        if self.head_dim is None and self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) is not divisible by num_heads "
                             f"({self.num_heads}); give head_dim explicitly")
        if self.resolved_head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.resolved_head_dim}")
        if self.rope_theta <= 0:
            raise ValueError(f"rope_theta must be > 0, got {self.rope_theta}")
        if self.max_position_embeddings is not None and self.max_position_embeddings < 1:
            raise ValueError(f"max_position_embeddings must be >= 1 or None, got "
                             f"{self.max_position_embeddings}")

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim if self.head_dim is not None else self.hidden_size // self.num_heads


class RMSNorm(nnx.Module):
    """Root-mean-square norm, computed in float32 whatever the activations' dtype."""

    def __init__(self, dim: int, eps: float):
        self.weight = precision.Float32Param(jnp.ones((dim,), jnp.float32))
        self.eps = eps

    def __call__(self, x):
        return linear.rms_scale(x, self.weight[...], self.eps)


def rope(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
    """Rotary embedding, Hugging Face "rotate half" pairing (i, i + D/2).

    Args:
      x: f32[B, T, H, D].
      positions: i32[B, T].
    """
    d = x.shape[-1]
    inv_freq = 1.0 / (theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))      # [D/2]
    angles = positions.astype(jnp.float32)[..., None] * inv_freq[None, None, :]   # [B, T, D/2]
    cos = jnp.cos(angles)[:, :, None, :]
    sin = jnp.sin(angles)[:, :, None, :]
    x32 = x.astype(jnp.float32)
    x1, x2 = x32[..., : d // 2], x32[..., d // 2:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def project(x: jax.Array, dense: nnx.LinearGeneral | nnx.Linear) -> jax.Array:
    """x [..., in] @ dense's kernel [in, *out] -> f32[..., *out]: x read in the kernel's dtype,
    the products accumulated and returned in float32."""
    w = dense.kernel[...]
    return jax.lax.dot_general(x.astype(w.dtype), w, (((x.ndim - 1,), (0,)), ((), ())),
                               preferred_element_type=jnp.float32)


class DecoderLayer(nnx.Module):
    """Pre-norm attention + SwiGLU MLP. Weights are [in, *out] (`nnx.LinearGeneral` kernels).

    The projections that read the same input are fused, one weight and one matmul each where
    separate ones would be three (q, k, v) and two (gate, up): on a few rows XLA:GPU launches one
    or two kernels per matmul whatever its width, so fusing cuts the launches of a decode step.

        qkv_proj.kernel      [D, Hkv, G + 2, hd]   per KV head: its G = Hq / Hkv query heads,
                                                   then its key, then its value
        gate_up_proj.kernel  [D, 2, I]             gate = [:, 0], up = [:, 1]

    Query head j = kv * G + g sits at [:, kv, g] and reads KV head kv = j // G, as with separate
    q, k and v. Grouping by KV head keeps tensor parallelism a split of one axis: Hkv over the
    model axis gives each device its KV heads with the query heads that read them, the same heads
    that splitting separate q, k and v by output features gives it.
    """

    def __init__(self, cfg: LlamaConfig, *, rngs: nnx.Rngs):
        d, hd = cfg.hidden_size, cfg.resolved_head_dim
        groups = cfg.num_heads // cfg.num_kv_heads
        dense = lambda i, o: nnx.LinearGeneral(i, o, use_bias=False, rngs=rngs)  # noqa: E731
        self.input_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.qkv_proj = dense(d, (cfg.num_kv_heads, groups + 2, hd))
        self.o_proj = dense(cfg.num_heads * hd, d)
        self.post_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.gate_up_proj = dense(d, (2, cfg.intermediate_size))
        self.down_proj = dense(cfg.intermediate_size, d)
        self.cfg = cfg

    def __call__(self, x, positions, kv: kv_cache.KVPages, layer: int, view):
        """x f32[B, T, D] -> (x, k_new f32[B, T, Hkv, hd], v_new); `layer` indexes the cache."""
        cfg = self.cfg
        b, t, _ = x.shape
        hd, groups = cfg.resolved_head_dim, cfg.num_heads // cfg.num_kv_heads
        qkv = project(self.input_norm(x), self.qkv_proj)                # [B, T, Hkv, G + 2, hd]
        q = rope(qkv[:, :, :, :groups].reshape(b, t, cfg.num_heads, hd), positions,
                 cfg.rope_theta)
        k = rope(qkv[:, :, :, groups], positions, cfg.rope_theta)
        v = qkv[:, :, :, groups + 1]
        a = ops.paged_attention(q, k, v, kv, layer, view)
        x = x + project(a.reshape(b, t, cfg.num_heads * hd), self.o_proj)
        gate_up = project(self.post_norm(x), self.gate_up_proj)         # [B, T, 2, I]
        x = x + project(jax.nn.silu(gate_up[:, :, 0]) * gate_up[:, :, 1], self.down_proj)
        return x, k, v

    def exact(self, x, positions, kv: kv_cache.KVPages, layer: int, view):
        """`numerics="exact"`: x [B, T, D] -> (x, kv with this layer's new slots written).

        The same layer, with every reduction row-invariant: the norms inside the row-invariant
        linear layers that follow them (`jaxspec.device.linear`), the residual adds in them, and
        attention over the cache with the new keys written first (`jaxspec.device.
        causal_attention`); what remains is elementwise.
        """
        cfg = self.cfg
        b, t, d = x.shape
        hd, groups = cfg.resolved_head_dim, cfg.num_heads // cfg.num_kv_heads
        impl, eps = view.implementation, cfg.rms_norm_eps
        rows = x.reshape(b * t, d)
        qkv = ops.linear(rows, self.qkv_proj.kernel[...].reshape(d, -1),
                         self.input_norm.weight[...], eps=eps, implementation=impl)
        qkv = qkv.reshape(b, t, cfg.num_kv_heads, groups + 2, hd)
        q = rope(qkv[:, :, :, :groups].reshape(b, t, cfg.num_heads, hd), positions,
                 cfg.rope_theta)
        k = rope(qkv[:, :, :, groups], positions, cfg.rope_theta)
        a, kv = ops.exact_attention(q, k, qkv[:, :, :, groups + 1], kv, layer, view)
        rows = ops.linear(a.reshape(b * t, -1), self.o_proj.kernel[...], residual=rows,
                          implementation=impl)
        gate_up = ops.linear(rows, self.gate_up_proj.kernel[...].reshape(d, -1),
                             self.post_norm.weight[...], eps=eps, implementation=impl)
        gate_up = gate_up.reshape(b * t, 2, -1)
        rows = ops.linear(jax.nn.silu(gate_up[:, 0]) * gate_up[:, 1],
                          self.down_proj.kernel[...], residual=rows, implementation=impl)
        return rows.reshape(b, t, d), kv


class LlamaForCausalLM(nnx.Module):
    """Implements `jaxspec.device.model.CausalLM`."""

    def __init__(self, cfg: LlamaConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.embed = nnx.Embed(cfg.vocab_size, cfg.hidden_size, rngs=rngs)
        self.layers = nnx.List([DecoderLayer(cfg, rngs=rngs) for _ in range(cfg.num_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = (None if cfg.tie_embeddings else
                        nnx.Linear(cfg.hidden_size, cfg.vocab_size, use_bias=False, rngs=rngs))

    @property
    def vocab_size(self) -> int:
        return self.cfg.vocab_size

    @property
    def dtype(self) -> jnp.dtype:
        """The weights' dtype (`jaxspec.models.precision.cast` sets it): the KV cache's
        default."""
        return self.embed.embedding[...].dtype

    @property
    def cache_spec(self) -> model_lib.CacheSpec:
        return model_lib.CacheSpec(num_layers=self.cfg.num_layers,
                                   num_kv_heads=self.cfg.num_kv_heads,
                                   head_dim=self.cfg.resolved_head_dim,
                                   max_context_len=self.cfg.max_position_embeddings,
                                   num_heads=self.cfg.num_heads, dtype=self.dtype)

    def __call__(self, tokens, kv: kv_cache.KVPages, view: kv_cache.CacheView):
        t = tokens.shape[1]
        positions = view.positions(t)
        # Rows gathered in the table's dtype: calling nnx.Embed would cast the whole table to
        # float32 first (it returns float32 whatever the table holds).
        x = jnp.take(self.embed.embedding[...], tokens, axis=0)
        if view.numerics == "exact":
            # Each layer writes its own slots; the final norm runs inside `logits`.
            for i, layer in enumerate(self.layers):
                with jax.named_scope(f"layer{i}"):
                    x, kv = layer.exact(x, positions, kv, i, view)
            return x, kv
        x = x.astype(jnp.float32)
        new_k, new_v = [], []
        for i, layer in enumerate(self.layers):
            with jax.named_scope(f"layer{i}"):     # names each layer's ops (benchmarks.census)
                x, k, v = layer(x, positions, kv, i, view)
            new_k.append(k)
            new_v.append(v)
        x = self.norm(x)
        # Rows whose forward went non-finite write nothing. The check also makes the cache write
        # depend on every layer's read of the cache (through x), which lets XLA update the
        # donated pages in place; without a data dependency it copies the whole cache per step.
        finite = jnp.all(jnp.isfinite(x), axis=(1, 2))
        view = view.replace(num_new=jnp.where(finite, view.num_new, 0))
        return x, kv_cache.write(kv, jnp.stack(new_k), jnp.stack(new_v), view)

    def param_specs(self, axis: str, size: int):
        """PartitionSpecs of `nnx.split(self)[1]`, Megatron-style over mesh axis `axis` of `size`
        devices: the fused qkv projection by KV heads (each with its query heads, see
        `DecoderLayer`), gate/up by FFN hidden units, o and down projections by input features,
        the embedding (the tied LM head) and an untied LM head by vocabulary when `size` divides
        it, norms replicated."""
        split_in = P(axis, None)
        rules = {"qkv_proj": P(None, axis, None, None), "gate_up_proj": P(None, None, axis),
                 "o_proj": split_in, "down_proj": split_in}
        vocab = self.cfg.vocab_size % size == 0
        rules["embed"] = split_in if vocab else P()
        rules["lm_head"] = P(None, axis) if vocab else P()
        state = nnx.state(self)
        return nnx.from_flat_state([(path, rules.get(path[-2], P()))
                                    for path, _ in nnx.to_flat_state(state)])

    def with_kv_heads(self, num_kv_heads: int) -> "LlamaForCausalLM":
        """A copy whose every KV head is repeated `num_kv_heads / self.cfg.num_kv_heads` times:
        the same function, with as many KV heads as a model axis of that size needs (vLLM's KV
        head replication). Query head j keeps reading a copy of its head, j // G.

        Raises:
          ValueError: `num_kv_heads` is not a multiple of the KV heads, or does not divide the
            query heads.
        """
        cfg = self.cfg
        if num_kv_heads % cfg.num_kv_heads or cfg.num_heads % num_kv_heads:
            raise ValueError(f"cannot repeat {cfg.num_kv_heads} KV heads into {num_kv_heads} "
                             f"for {cfg.num_heads} query heads")
        copies = num_kv_heads // cfg.num_kv_heads
        new_cfg = dataclasses.replace(cfg, num_kv_heads=num_kv_heads)
        groups = cfg.num_heads // cfg.num_kv_heads
        graphdef, abstract = nnx.split(nnx.eval_shape(
            lambda: LlamaForCausalLM(new_cfg, rngs=nnx.Rngs(0))))
        old = dict(nnx.to_flat_state(nnx.state(self)))

        def value(path):
            x = old[path].get_value()
            if path[-2] == "qkv_proj":
                # Query heads [kv, c * G' + g] move to [kv * copies + c, g]: j // G' is their
                # new KV head, a copy of kv's key and value.
                d, _, _, hd = x.shape
                q = x[:, :, :groups].reshape(d, num_kv_heads, groups // copies, hd)
                x = jnp.concatenate([q, jnp.repeat(x[:, :, groups:], copies, axis=1)], axis=2)
            return x
        flat = [(path, var.replace(value(path))) for path, var in nnx.to_flat_state(abstract)]
        return nnx.merge(graphdef, nnx.from_flat_state(flat))

    def logits(self, hidden, view: kv_cache.CacheView | None = None):
        """float32 logits, whatever the weights' dtype (accumulated in float32). With an exact
        view, `hidden` is the last layer's output before the final norm, which runs here, in the
        row-invariant linear layer of the LM head."""
        if view is not None and view.numerics == "exact":
            rows = hidden.reshape(-1, hidden.shape[-1])
            tied = self.lm_head is None
            w = self.embed.embedding[...] if tied else self.lm_head.kernel[...]
            out = ops.linear(rows, w, self.norm.weight[...], eps=self.cfg.rms_norm_eps,
                             transpose_w=tied, out_dtype=jnp.float32,
                             implementation=view.implementation)
            return out.reshape(*hidden.shape[:-1], -1)
        if self.lm_head is not None:
            return project(hidden, self.lm_head)
        table = self.embed.embedding[...]                                        # [V, D]
        hidden = hidden.astype(table.dtype)
        if 2 <= math.prod(hidden.shape[:-1]) <= FEW_POSITIONS:
            # The tied table as the left operand (out [V, ...]): XLA's CPU matmul of a few rows
            # reads it once, where `hidden @ table.T` packs it first. SmolLM2 on 2 cores: 2-3
            # positions 12 -> 8 ms, 8 rows of 4 27 -> 17 ms; one position and hundreds are
            # faster the other way.
            out = jax.lax.dot_general(table, hidden, (((1,), (hidden.ndim - 1,)), ((), ())),
                                      preferred_element_type=jnp.float32)
            return jnp.moveaxis(out, 0, -1)
        return jnp.dot(hidden, table.T, preferred_element_type=jnp.float32)


def param_count(model: nnx.Module) -> int:
    return sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
