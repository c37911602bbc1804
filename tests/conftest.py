"""Strict numerics for every test, as the house style asks (equinox's conftest)."""

import jax

jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")
