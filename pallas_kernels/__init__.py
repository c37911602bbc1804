"""Pallas kernels, each beside its XLA reference (installed as ``jaxspec.pallas_kernels``)."""
