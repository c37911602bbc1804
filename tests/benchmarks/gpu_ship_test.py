"""Shipping the GPU check: pins read from pyproject, the package map equal to pyproject's, what
travels under 64 MiB, and the device command short enough, installing with --no-deps
--no-build-isolation before it runs the check."""

import pathlib
import re

import pytest

from benchmarks import gpu_ship

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_pins_come_from_pyproject(tmp_path):
    assert re.fullmatch(r"gguf==[\w.]+", gpu_ship.pinned("gguf"))
    (tmp_path / "pyproject.toml").write_text('dependencies = ["numpy>=1"]\n')
    with pytest.raises(ValueError, match="'numpy'"):
        gpu_ship.pinned("numpy", tmp_path)


def test_package_dirs_match_pyproject():
    text = (ROOT / "pyproject.toml").read_text()
    block = text[text.index("[tool.setuptools.package-dir]"):].split("\n\n")[0]
    declared = dict(re.findall(r'"?([\w.]+)"?\s*=\s*"([\w/]+)"', block))
    for package, folder in gpu_ship.PACKAGE_DIRS.items():
        assert declared.get(package, package.replace(".", "/")) == folder, package


def test_what_travels_fits(tmp_path):
    sizes = gpu_ship.travelling_files(ROOT, carry=())
    assert "benchmarks/gpu_check.py" in sizes and "pyproject.toml" in sizes
    assert not any(p.startswith(".venv/") for p in sizes)
    assert sum(sizes.values()) < gpu_ship.LIMIT_BYTES


def test_device_command():
    command = gpu_ship.device_command("--sections kernels")
    assert len(command) <= gpu_ship.MAX_COMMAND
    assert "--no-deps" in command and "--no-build-isolation" in command
    assert command.index("pip install") < command.index("benchmarks.gpu_check")
    assert "--out $OUT --sections kernels" in command and f"$OUT/{gpu_ship.LOG}" in command
