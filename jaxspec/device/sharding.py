"""Where the engine's arrays live on a device mesh with axes `data` and `model`.

    weights     Megatron-style over `model` (each model says how: `param_specs`): the q, k, v, gate
                and up projections split by output features (KV heads with their query heads, FFN
                hidden), the o and down projections by input features, the embedding (and tied LM
                head) by vocabulary rows where the vocabulary divides, norms replicated.
    KV pages    [L, N, S, Hkv, D]: KV heads over `model`. When `model` exceeds the KV heads, the
                engine first repeats each KV head (`model / Hkv` copies, as vLLM does), so every
                model shard holds whole heads.
    batch rows  every per-row input (tokens, drafts, page tables, lengths, sampling) over `data`;
                activations follow.
    automata, draft buffer, the pages' N axis, step outputs
                replicated. Pages and automaton slots are indexed by ids the host picks for each
                request, with no tie to a data shard (a request's row can change from one step to
                the next), so each data shard holds them all: per-device KV memory is 1/model of
                the whole. The automata's work is a few hundred scalar operations per row, so
                every device runs it for every row (`shard_map` with everything replicated).

XLA's SPMD partitioner places everything else (`jit` with sharded arguments); the Pallas kernels,
which it cannot partition, run under `shard_map` (`jaxspec.device.ops`). A user's mesh may use
explicit axis types (`jax.make_mesh`'s default): the engine works on the same devices with
automatic axes (`auto_mesh`).

One controller per process: with `jax.distributed`, every process runs the same host control
plane on the same inputs (SPMD); inputs are placed from each process's identical copy and the
replicated outputs are read from local shards (`to_host`).
"""

from flax import nnx
import jax
from jax.sharding import AxisType
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np

DATA, MODEL = "data", "model"
KV_SPEC = P(None, None, None, MODEL, None)       # [L, N, S, Hkv, D]


def auto_mesh(mesh: Mesh) -> Mesh:
    """The same devices and axes with automatic axis types.

    Raises:
      ValueError: the mesh's axes are not `data` and `model`.
    """
    if set(mesh.axis_names) != {DATA, MODEL}:
        raise ValueError(f"the mesh's axes must be {DATA!r} and {MODEL!r}, got "
                         f"{tuple(mesh.axis_names)}")
    return Mesh(mesh.devices, mesh.axis_names, axis_types=(AxisType.Auto,) * len(mesh.axis_names))


def make_mesh(data: int, model: int) -> Mesh:
    """A `data` x `model` mesh over the first data * model devices.

    Raises:
      ValueError: fewer devices than data * model.
    """
    devices = jax.devices()
    if data < 1 or model < 1 or data * model > len(devices):
        raise ValueError(f"a mesh of data={data} x model={model} needs {data * model} devices, "
                         f"{len(devices)} are available")
    grid = np.asarray(devices[:data * model]).reshape(data, model)
    return Mesh(grid, (DATA, MODEL), axis_types=(AxisType.Auto, AxisType.Auto))


def sizes(mesh: Mesh) -> tuple[int, int]:
    """(data, model) sizes."""
    return mesh.shape[DATA], mesh.shape[MODEL]


def check(mesh: Mesh, *, num_heads: int | None, num_kv_heads: int, max_batch_size: int) -> None:
    """Raises ValueError when the model or the batch cannot be split over `mesh`.

    Args:
      num_heads, num_kv_heads: the model's query and KV heads.
      max_batch_size: the engine's batch rows.
    """
    data, model = sizes(mesh)
    if num_heads is not None and num_heads % model:
        raise ValueError(f"model={model} does not divide the model's {num_heads} attention heads")
    if num_kv_heads % model and model % num_kv_heads:
        raise ValueError(f"model={model} neither divides the model's {num_kv_heads} KV heads nor "
                         f"is a multiple of them (to repeat each head)")
    if max_batch_size < data or max_batch_size % data:
        raise ValueError(f"data={data} must divide max_batch_size={max_batch_size} (every data "
                         f"shard decodes max_batch_size / data rows)")


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def rows(mesh: Mesh, ndim: int) -> NamedSharding:
    """Leading (row) axis over `data`."""
    return NamedSharding(mesh, P(DATA, *([None] * (ndim - 1))))


def _put(x, target: NamedSharding):
    """`x` on `target`. An array of this process's own devices goes through the host: placing
    it directly would first check, with a collective per array, that every process holds the
    same value (they do: the control plane is SPMD)."""
    if isinstance(x, jax.Array):
        if x.sharding == target:
            return x
        if x.is_fully_addressable and not target.is_fully_addressable:
            x = np.asarray(x)
    return jax.device_put(x, target)


def place_rows(mesh: Mesh, tree):
    """Every array of `tree` (host or device) with its leading axis over `data`."""
    return jax.tree.map(lambda x: _put(x, rows(mesh, np.ndim(x))), tree)


def place(tree, shardings):
    """`tree`'s arrays on `shardings` (a matching tree of shardings)."""
    return jax.tree.map(_put, tree, shardings)


def state_shardings(mesh: Mesh, state):
    """A matching tree of shardings for a `jaxspec.device.step.DeviceState`: KV heads over
    `model`, the rest replicated."""
    rep = replicated(mesh)
    return jax.tree.map(lambda _: rep, state).replace(
        kv=jax.tree.map(lambda _: NamedSharding(mesh, KV_SPEC), state.kv))


def place_params(mesh: Mesh, params, specs):
    """A model's NNX state with every parameter on its PartitionSpec (`specs`, the model's
    `param_specs(MODEL, size)`: the same paths)."""
    spec_of = dict(nnx.to_flat_state(specs))
    return nnx.from_flat_state([
        (path, var.replace(_put(var.get_value(), NamedSharding(mesh, spec_of[path]))))
        for path, var in nnx.to_flat_state(params)])


def to_host(tree):
    """numpy copies of replicated arrays, also when the mesh spans other processes' devices
    (each process reads its own shard). One `jax.device_get` for the whole tree: it starts
    every leaf's copy before waiting for any (a step's outputs are six arrays)."""
    def local(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return x.addressable_data(0)
        return x
    return jax.device_get(jax.tree.map(local, tree))


def device_bytes(tree) -> dict:
    """Bytes of `tree`'s arrays held by each device: {device id: bytes}."""
    held: dict = {}
    for x in jax.tree.leaves(tree):
        for shard in x.addressable_shards:
            held[shard.device.id] = held.get(shard.device.id, 0) + shard.data.nbytes
    return held
