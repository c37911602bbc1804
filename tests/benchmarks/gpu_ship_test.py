"""Shipping the GPU check: pins read from pyproject, the package map equal to pyproject's, what
travels under 64 MiB, the model split in halves with its checksum, and the two device commands:
short enough, and, run by bash with a stand-in `python3`, staging part A, joining and checking the
halves, and falling back to the sections that need no model without part A or with a bad half."""

import hashlib
import json
import os
import pathlib
import re
import shutil
import subprocess

import numpy as np
import pytest

from benchmarks import gpu_check
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


def test_what_travels_fits():
    sizes = gpu_ship.travelling_files(ROOT, carry=())
    assert "benchmarks/gpu_check.py" in sizes and "pyproject.toml" in sizes
    assert not any(p.startswith((".venv/", ".whl/", gpu_ship.MODEL_DIR + "/")) for p in sizes)
    # A half of the real model (47 MiB) travels beside the tree in each call.
    assert sum(sizes.values()) < gpu_ship.LIMIT_BYTES - 48 * 2**20


def _model(tmp_path, size: int = 1001) -> pathlib.Path:
    path = tmp_path / "m.gguf"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, size, np.uint8).tobytes())
    return path


def test_split_halves_and_checksum(tmp_path):
    source, folder = _model(tmp_path), tmp_path / "parts"
    manifest = gpu_ship.split_model(source, folder)
    a, b = ((folder / p).read_bytes() for p in gpu_ship.PARTS)
    assert (len(a), len(b)) == (501, 500) and a + b == source.read_bytes()
    assert manifest == dict(name="m.gguf", bytes=1001,
                            sha256=hashlib.sha256(source.read_bytes()).hexdigest(),
                            parts={"part-a": 501, "part-b": 500})
    assert json.loads((folder / gpu_ship.MANIFEST).read_text()) == manifest
    stamp = (folder / "part-a").stat().st_mtime_ns
    assert gpu_ship.split_model(source, folder) == manifest            # kept, not rewritten
    assert (folder / "part-a").stat().st_mtime_ns == stamp
    source.write_bytes(b"another model")
    again = gpu_ship.split_model(source, folder)
    assert again["sha256"] != manifest["sha256"] and again["parts"] == {"part-a": 7, "part-b": 6}


def test_the_two_calls():
    manifest = dict(name="SmolLM2-135M-Instruct.Q4_1.gguf", sha256="0" * 64)
    first, second = gpu_ship.device_calls(manifest, args="--seed 3")
    for call in (first, second):
        assert len(call.command) <= gpu_ship.MAX_COMMAND
        assert "--no-deps" in call.command and "--no-build-isolation" in call.command
        assert call.command.index("pip install") < call.command.index("benchmarks.gpu_check")
        assert f"$OUT/{gpu_ship.LOG}" in call.command and call.command.endswith(
            f"| tee $OUT/{gpu_ship.LOG}")
    assert first.carry == (".whl", ".model/part-a") and second.carry == (".whl", ".model/part-b")
    # Both hanging to their limits, with a start-up and the turn between them, leave the 4
    # minutes a lease needs to start another machine.
    assert 35 + first.timeout_s + 30 + second.timeout_s <= (15 - 4) * 60
    assert first.command.index("cp .model/part-a /tmp/model/") < first.command.index(
        "pip install")
    plain, with_model = gpu_ship.sections()
    assert (f"--sections {','.join(plain)} --budget-s {gpu_ship.FIRST_BUDGET_S} --seed 3"
            in first.command)
    assert f"echo '{'0' * 64}  /tmp/model/{manifest['name']}' | sha256sum -c -" in second.command
    assert f"--sections {','.join(with_model)} {gpu_ship.SECOND_ARGS}'" in second.command
    assert f"--budget-s {gpu_ship.SECOND_BUDGET_S} --seed 3" in second.command
    assert plain[0] == "profile" and {"engine", "hf"} <= set(with_model)
    assert sorted(plain + with_model) == sorted(gpu_check.SECTIONS)
    # The longest the tool takes, with room for more sections and a long --args.
    _, long = gpu_ship.device_calls(dict(manifest, name="x" * 100), args="--dump " * 20)
    assert len(long.command) <= gpu_ship.MAX_COMMAND


@pytest.fixture
def device(tmp_path):
    """A checkout with the halves of a small model, a stand-in /tmp, and a `python3` that only
    writes its arguments to `calls.txt` and succeeds."""
    if shutil.which("sha256sum") is None:
        pytest.skip("no sha256sum here")
    source = _model(tmp_path, 4097)
    tree = tmp_path / "tree"
    manifest = gpu_ship.split_model(source, tree / gpu_ship.MODEL_DIR)
    (tree / gpu_ship.WHEEL_DIR).mkdir()
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python3").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/calls.txt\n')
    (bindir / "python3").chmod(0o755)

    def run(call, device_tmp, name):
        out = tmp_path / name
        out.mkdir()
        env = dict(os.environ, OUT=str(out), PATH=f"{bindir}:{os.environ['PATH']}")
        proc = subprocess.run(["bash", "-c", call.command], cwd=tree, env=env,
                              capture_output=True, text=True, timeout=60)
        calls = (tmp_path / "calls.txt").read_text().splitlines()
        (tmp_path / "calls.txt").unlink()
        check = next(c for c in calls if "benchmarks.gpu_check" in c)
        return proc, check

    return source, manifest, run


def test_calls_stage_join_and_check_the_model(tmp_path, device):
    source, manifest, run = device
    first, second = gpu_ship.device_calls(manifest, tmp=str(tmp_path / "dev"))
    proc, check = run(first, tmp_path / "dev", "out1")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "dev/model/part-a").is_file()
    assert "--sections profile,step" in check
    proc, check = run(second, tmp_path / "dev", "out2")
    assert proc.returncode == 0, proc.stderr
    joined = tmp_path / "dev/model/m.gguf"
    assert joined.read_bytes() == source.read_bytes()
    assert f"{joined}: OK" in proc.stdout
    _, with_model = gpu_ship.sections()
    assert (f"--gguf {joined} --sections {','.join(with_model)} {gpu_ship.SECOND_ARGS} "
            f"--budget-s {gpu_ship.SECOND_BUDGET_S}" in check)


def test_a_fresh_machine_or_a_bad_half_runs_the_sections_without_the_model(tmp_path, device):
    _, manifest, run = device
    _, second = gpu_ship.device_calls(manifest, tmp=str(tmp_path / "fresh"))
    proc, check = run(second, tmp_path / "fresh", "out1")
    assert proc.returncode == 0 and "part A of the model is not in" in proc.stdout
    assert "--gguf" not in check and "--sections profile,step,kernels" in check
    first, second = gpu_ship.device_calls(dict(manifest, sha256="f" * 64),
                                          tmp=str(tmp_path / "dev"))
    run(first, tmp_path / "dev", "out2")
    proc, check = run(second, tmp_path / "dev", "out3")
    assert "FAILED" in proc.stdout + proc.stderr and "failed its sha256" in proc.stdout
    assert "--gguf" not in check
