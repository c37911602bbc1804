"""Strict numerics for every test, as the house style asks (equinox's conftest), and the fixtures
shared across test folders: the tiny and the real default model (each built once per session),
random prompts, a full uncached forward, and the uncached greedy decoding loop every engine test
compares against.

Tests marked `slow` (the real model, long property tests, many-device and whole-report runs) run
in `make test` and are skipped by `make test-fast`. Tests marked `extended` (real-model and
many-process runs that tests in `make test` partly cover) run in `make test-all` only: CI runs
`make test` on two cores and has 30 minutes.
"""

import functools
import os
import pathlib

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.device import kv_cache
from jaxspec.host import acceptance
from jaxspec.host import compiles
from jaxspec.models import registry
from jaxspec.models import tiny

jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")

# XLA's persistent compilation cache (build/xla-cache, ~25 MB a run, least recently used entries
# evicted past 512 MB): a rerun compiles only what changed, which takes `make test-fast` here from
# ~8.5 minutes on a fresh checkout to ~2.5. JAXSPEC_TEST_XLA_CACHE='' turns it off, the engine's
# default cache (~/.cache/jaxspec/xla) included: every program is then compiled.
ROOT = pathlib.Path(__file__).resolve().parents[1]
_XLA_CACHE = os.environ.get("JAXSPEC_TEST_XLA_CACHE", str(ROOT / "build" / "xla-cache"))
if _XLA_CACHE:
    jax.config.update("jax_compilation_cache_dir", _XLA_CACHE)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_compilation_cache_max_size", 512 * 2**20)
else:
    jax.config.update("jax_enable_compilation_cache", False)

PAGE_SIZE = 16


@pytest.fixture(scope="session", autouse=True)
def _cost_models_stay_in_the_session(tmp_path_factory):
    """Adaptive K's step-cost files go to a session folder, not the user's cache: decisions in
    one test run never depend on timings measured by another."""
    patch = pytest.MonkeyPatch()
    patch.setenv("JAXSPEC_COST_CACHE", str(tmp_path_factory.mktemp("cost")))
    yield
    patch.undo()


@pytest.fixture(scope="module", autouse=True)
def _compiled_code_leaves_with_its_module():
    """Each test file's executables are freed when it ends: a worker process then holds one
    file's compiled code, not the whole suite's; what its predictors learned goes too."""
    yield
    jax.clear_caches()
    compiles.LEDGER.forget_programs()
    acceptance.forget()


@pytest.fixture(scope="session")
def smollm2():
    """(model, tokenizer) of the embedded default, through the on-disk cache."""
    return registry.load(None)


@pytest.fixture(scope="session")
def tiny_lm():
    """The tiny random Llama of seed 0 (`jaxspec.models.tiny`); tests must not mutate it."""
    return tiny.tiny_model(seed=0)


@functools.lru_cache(maxsize=4)
def _jitted_forward(graphdef):
    @jax.jit
    def forward(state, tokens):
        model = nnx.merge(graphdef, state)
        b, t = tokens.shape
        num_pages = -(-t // PAGE_SIZE)
        spec = model.cache_spec
        kv = kv_cache.init_pages(num_layers=spec.num_layers, num_pages=num_pages + 1,
                                 page_size=PAGE_SIZE, num_kv_heads=spec.num_kv_heads,
                                 head_dim=spec.head_dim)
        view = kv_cache.CacheView(
            page_table=jnp.arange(1, num_pages + 1, dtype=jnp.int32)[None, :] * jnp.ones(
                (b, 1), jnp.int32),
            lengths=jnp.zeros((b,), jnp.int32), num_new=jnp.full((b,), t, jnp.int32))
        hidden, _ = model(tokens, kv, view)
        return model.logits(hidden)
    return forward


def full_logits(model, tokens) -> np.ndarray:
    """Logits f32[B, T, V] of a whole prompt in one forward over an empty cache.

    Every row gets the same pages, which is harmless: nothing is read from the cache when all
    lengths are 0, and the writes are discarded.
    """
    graphdef, state = nnx.split(model)
    return np.asarray(_jitted_forward(graphdef)(state, jnp.asarray(tokens, jnp.int32)))


@pytest.fixture(scope="session")
def forward():
    return full_logits


@functools.lru_cache(maxsize=8)
def _jitted_next_token(graphdef, width):
    @jax.jit
    def next_token(state, tokens, length):
        model = nnx.merge(graphdef, state)
        num_pages = -(-width // PAGE_SIZE)
        spec = model.cache_spec
        kv = kv_cache.init_pages(num_layers=spec.num_layers, num_pages=num_pages + 1,
                                 page_size=PAGE_SIZE, num_kv_heads=spec.num_kv_heads,
                                 head_dim=spec.head_dim)
        view = kv_cache.CacheView(page_table=jnp.arange(1, num_pages + 1, dtype=jnp.int32)[None],
                                  lengths=jnp.zeros((1,), jnp.int32), num_new=length[None])
        hidden, _ = model(tokens, kv, view)
        return jnp.argmax(model.logits(hidden[0, length - 1]))
    return next_token


def uncached_greedy_decode(model, prompt, n: int, width: int = 128) -> list[int]:
    """Argmax decoding that recomputes the whole sequence from scratch for every new token."""
    graphdef, state = nnx.split(model)
    step = _jitted_next_token(graphdef, width)
    tokens = np.zeros((1, width), np.int32)
    tokens[0, :len(prompt)] = prompt
    length = len(prompt)
    for _ in range(n):
        tokens[0, length] = int(step(state, jnp.asarray(tokens), jnp.int32(length)))
        length += 1
    return [int(t) for t in tokens[0, len(prompt):length]]


@pytest.fixture(scope="session")
def uncached_greedy():
    return uncached_greedy_decode
