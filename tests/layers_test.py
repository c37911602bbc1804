"""Dependencies point one way (DESIGN §1): cli/engine -> host -> device -> pallas_kernels, with
the automaton layout (`jaxspec.sa_layout`) a leaf everyone may use. Read from the source, so an
upward import anywhere (lazy ones inside functions included) fails here."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
# Source folder -> the package it installs as (pyproject's package-dir mapping).
PACKAGES = {"jaxspec": "jaxspec", "models": "jaxspec.models",
            "pallas_kernels": "jaxspec.pallas_kernels"}
LAYERS = {  # module prefix -> layer, longest prefix first
    "jaxspec.sa_layout": "leaf",
    "jaxspec.pallas_kernels": "kernels",
    "jaxspec.device": "device",
    "jaxspec.host": "host",
    "jaxspec.models": "models",
    "jaxspec.config": "config",
    "jaxspec.schedule": "config",
    "jaxspec._validate": "config",
}
# Layers each layer must never import.
FORBIDDEN = {
    "leaf": {"kernels", "device", "host", "models", "config", "top"},
    "kernels": {"device", "host", "models", "config", "top"},
    "device": {"host", "models", "top"},
    "models": {"host", "top"},
    "host": {"kernels", "top"},
    "config": {"kernels", "device", "host", "models", "top"},
}


def _module_name(path: pathlib.Path) -> str:
    folder, *rest = path.relative_to(ROOT).with_suffix("").parts
    parts = [PACKAGES[folder], *rest]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _layer(module: str) -> str | None:
    # `from jaxspec import sa_layout` names the package only as the parent of a module.
    if module == "jaxspec" or not module.startswith("jaxspec."):
        return None
    for prefix, layer in LAYERS.items():
        if module == prefix or module.startswith(prefix + "."):
            return layer
    return "top"          # engine, cli


def _imports(path: pathlib.Path) -> set[str]:
    """Every module `path` imports, at module level or inside functions."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            # `from jaxspec import pallas_kernels` imports a module, not a name.
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


SOURCES = sorted(p for folder in PACKAGES for p in (ROOT / folder).rglob("*.py"))


def test_the_sources_are_found():
    names = {_module_name(p) for p in SOURCES}
    assert {"jaxspec.host.executor", "jaxspec.device.step", "jaxspec.models.llama",
            "jaxspec.pallas_kernels.sa_extend", "jaxspec.sa_layout"} <= names


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_point_down(path):
    layer = _layer(_module_name(path))
    if layer not in FORBIDDEN:
        return
    upward = sorted(name for name in _imports(path) if _layer(name) in FORBIDDEN[layer])
    assert not upward, f"{layer} module imports {upward}"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_only_kernel_files_import_a_pallas_backend(path):
    pallas = sorted(n for n in _imports(path) if n.startswith("jax.experimental.pallas"))
    if _layer(_module_name(path)) != "kernels":
        assert not pallas, pallas


def test_the_checker_sees_an_upward_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from jaxspec.host import executor\n")
    assert "jaxspec.host.executor" in _imports(bad)
    assert _layer("jaxspec.host.executor") in FORBIDDEN["device"]
