"""The persistent compilation cache, on by default for the Python API: a second process loads
what the first compiled."""

import json
import os
import subprocess
import sys

import pytest

SCRIPT = """
import json, jax
from jax import monitoring
import jaxspec as js
from jaxspec.host import compiles
from jaxspec.models import tiny

compiles.MIN_CACHED_COMPILE_SECONDS = 0.0      # the tiny model compiles in well under 0.5 s
hits = []
monitoring.register_event_listener(
    lambda event, **_: hits.append(event) if event == "/jax/compilation_cache/cache_hits" else 0)
engine = js.Engine(tiny.tiny_model(seed=0), spec="sa")
out = engine.generate([5, 6, 7, 5, 6, 7, 5, 6], max_new_tokens=12)
print(json.dumps(dict(dir=jax.config.jax_compilation_cache_dir, hits=len(hits),
                      tokens=out.token_ids)))
"""


def _run(env):
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_second_process_loads_what_the_first_compiled(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    env["JAXSPEC_CACHE"] = str(tmp_path)
    first, second = _run(env), _run(env)
    assert first["dir"] == second["dir"] == str(tmp_path / "xla")
    assert first["hits"] == 0 and second["hits"] > 0
    assert second["tokens"] == first["tokens"]
