"""jaxspec: model-free speculative decoding for JAX."""
