"""Pallas kernels (installed as ``jaxspec.pallas_kernels``), one file per kernel.

Each kernel computes what its XLA reference in `jaxspec.device` computes; `jaxspec.device.ops`
holds the implementation switch and is the only caller. Kernels import nothing from jaxspec but
the automaton layout (`jaxspec.sa_layout`), so the arrows point one way: device -> kernels.
"""
