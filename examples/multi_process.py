"""One engine across processes with `jax.distributed`: every process runs the same host control
plane on the same prompts (SPMD), the mesh spans every process's devices, and each process reads
the replicated outputs from its own shard.

    python examples/multi_process.py --processes 2 --devices 2 --mesh data=2,model=2 --tiny

launches the processes on this machine (CPU devices, gloo collectives) and prints the tokens
process 0 generated. On a cluster, run `worker(...)` in every process instead, with the real
coordinator address and each process's id.
"""

import argparse
import json
import os
import socket
import subprocess
import sys

from jaxspec.cli import parse_mesh


def worker(coordinator: str, num_processes: int, process_id: int, mesh_shape: tuple[int, int],
           tiny: bool, max_new_tokens: int) -> list[list[int]]:
    """Joins the cluster, builds the global mesh and generates; every process returns the same
    tokens."""
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                               process_id=process_id)
    import jaxspec as js

    mesh = jax.make_mesh(mesh_shape, ("data", "model"))
    if tiny:
        from jaxspec.models import tiny as tiny_lib

        engine = js.Engine(tiny_lib.tiny_model(seed=0), spec="sa", mesh=mesh,
                           scheduler=js.SchedulerConfig(max_batch_size=4, max_seq_len=128))
        prompts = [[1, 2, 3, 1, 2, 3, 1, 2], [5, 6, 7, 5, 6, 7], [9, 10, 9, 10, 9], [3, 3, 4]]
    else:
        engine = js.Engine.load(spec="sa", mesh=mesh,
                                scheduler=js.SchedulerConfig(max_batch_size=4, max_seq_len=512))
        prompts = ["Name three primary colors.", "Write a haiku about JAX."]
    result = engine.generate_batch(prompts, max_new_tokens=max_new_tokens)
    jax.distributed.shutdown()
    return [g.token_ids for g in result.generations]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def launch(processes: int, devices: int, mesh_shape: tuple[int, int], tiny: bool,
           max_new_tokens: int) -> list[list[list[int]]]:
    """Runs `worker` in `processes` local processes of `devices` CPU devices each; returns each
    process's tokens."""
    coordinator = f"localhost:{_free_port()}"
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
           "JAX_PLATFORMS": "cpu"}
    procs = [subprocess.Popen(
        [sys.executable, __file__, "--worker", coordinator, str(processes), str(i),
         f"data={mesh_shape[0]},model={mesh_shape[1]}", str(int(tiny)), str(max_new_tokens)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for i in range(processes)]
    outputs = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        if p.returncode:
            raise RuntimeError(f"worker failed ({p.returncode}):\n{err[-4000:]}")
        outputs.append(json.loads(out.strip().splitlines()[-1]))
    return outputs


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        coordinator, n, i, mesh, tiny, new = argv[1:]
        tokens = worker(coordinator, int(n), int(i), parse_mesh(mesh), bool(int(tiny)), int(new))
        print(json.dumps(tokens))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--devices", type=int, default=2, help="CPU devices per process")
    parser.add_argument("--mesh", default="data=2,model=2")
    parser.add_argument("--tiny", action="store_true", help="the tiny random test model")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    args = parser.parse_args(argv)
    outputs = launch(args.processes, args.devices, parse_mesh(args.mesh), args.tiny,
                     args.max_new_tokens)
    if any(o != outputs[0] for o in outputs):
        raise RuntimeError(f"processes disagree: {outputs}")
    print(json.dumps(outputs[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
