"""Flax NNX causal language models, loaders and tokenizers (installed as ``jaxspec.models``)."""

from jaxspec.models.gguf_loader import load_gguf as load_gguf
from jaxspec.models.hf_loader import load_hf as load_hf
from jaxspec.models.registry import default_gguf_path as default_gguf_path
from jaxspec.models.registry import load as load
from jaxspec.models.registry import load_default as load_default
from jaxspec.models.tokenizer import StreamDecoder as StreamDecoder
from jaxspec.models.tokenizer import Tokenizer as Tokenizer
