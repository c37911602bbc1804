"""Flax NNX causal language models, loaders and tokenizers (installed as ``jaxspec.models``)."""
