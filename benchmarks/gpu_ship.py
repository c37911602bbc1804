"""Ships the GPU check to a lent device: the wheels it lacks, the size of what travels, and the
device tool's exact call.

    make gpu-ship                # = python -m benchmarks.gpu_ship [--args "--sections step"]
    python -m benchmarks.gpu_ship --rehearse     # the install and a --cpu run on a copy, here

The device (the nvidia-h200 kind) has Python 3.12 as `python3`, jax/jaxlib 0.11.2 with the CUDA
plugin, flax, optax, chex, numba, tokenizers and jinja2, but not `gguf`, which `import jaxspec`
imports (through `jaxspec.models`); nothing can be fetched there. So:

1. the wheels in `DEVICE_LACKS`, at the versions pyproject.toml pins, are downloaded into `.whl/`
   (ignored by git) for CPython 3.12 on x86-64 Linux, as the device's README says;
2. what travels is summed: git's tracked and untracked-not-ignored files, `shared/` if the
   checkout has one, and the carried `.whl/`; it must stay under `LIMIT_BYTES`;
3. the call is printed. Its command installs the wheels and the checkout with
   `pip install --no-index --no-deps --no-build-isolation --target /tmp/site` (the package maps
   `models/` and `pallas_kernels/` into `jaxspec`, so the bare tree has no `jaxspec.models`),
   then runs `python3 -P -m benchmarks.gpu_check --out $OUT` with `/tmp/site` first on the path
   (`-P`: the checkout's own `jaxspec/` must not shadow the installed one), teeing its log into
   $OUT.

The device tool sends the checkout the session was started in: run this there, with the GPU
check's code in it.
"""

import argparse
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
WHEEL_DIR = ".whl"
DEVICE_LACKS = ("gguf",)           # the device's package list (KINDS.md) has everything else
DEVICE_PYTHON = "3.12"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64")
LIMIT_BYTES = 64 * 2**20           # the working tree and carried paths, per call
MAX_COMMAND = 2000                 # characters of one device command
# The check's budget (300 s) plus install, imports and a section overrunning it; with a start-up
# of ~3 minutes, 15 device minutes keep ~4 for a rerun of the sections that failed.
TIMEOUT_S = 450
SITE = "/tmp/site"
# pyproject.toml's [tool.setuptools.package-dir], parents first (a test keeps them equal).
PACKAGE_DIRS = {"jaxspec": "jaxspec", "jaxspec.models": "models",
                "jaxspec.pallas_kernels": "pallas_kernels"}
LOG = "gpu_check.log"


def pinned(name: str, root: pathlib.Path = ROOT) -> str:
    """`name==version` as pyproject.toml pins it.

    Raises:
      ValueError: pyproject.toml pins no version of `name`.
    """
    match = re.search(rf'"({re.escape(name)}==[^";]+)"', (root / "pyproject.toml").read_text())
    if match is None:
        raise ValueError(f"pyproject.toml pins no version of {name!r}")
    return match.group(1)


def download(root: pathlib.Path = ROOT, names=DEVICE_LACKS) -> list[pathlib.Path]:
    """The device's wheels of `names` in `root/.whl`, downloaded unless already there."""
    folder = root / WHEEL_DIR
    wheels = []
    for name in names:
        requirement = pinned(name, root)
        version = requirement.split("==")[1]
        have = sorted(folder.glob(f"{name.replace('-', '_')}-{version}-*.whl"))
        if not have:
            platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                            "--only-binary=:all:", "--python-version", DEVICE_PYTHON,
                            "--implementation", "cp", *platforms, "-d", str(folder),
                            requirement], check=True)
            have = sorted(folder.glob(f"{name.replace('-', '_')}-{version}-*.whl"))
        if not have:
            raise FileNotFoundError(f"pip saved no wheel of {requirement} in {folder}")
        wheels += have
    return wheels


def travelling_files(root: pathlib.Path = ROOT, carry=(WHEEL_DIR,)) -> dict[str, int]:
    """Bytes of every file the device tool sends: git's tracked and untracked-not-ignored files,
    `shared/`, and the carried paths (relative path -> size)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=root, capture_output=True,
                            check=True).stdout.decode()
    paths = [p for p in listed.split("\0") if p]
    for extra in ("shared", *carry):
        top = root / extra
        if top.is_file():
            paths.append(extra)
        elif top.is_dir():
            paths += [str(p.relative_to(root)) for p in sorted(top.rglob("*")) if p.is_file()]
    sizes = {}
    for path in paths:
        full = root / path
        if full.is_symlink() or full.is_file():      # tracked files deleted here do not travel
            sizes[path] = full.lstat().st_size
    return sizes


def device_command(gpu_check_args: str = "") -> str:
    """The shell command the device runs (in the checkout's copy; $OUT comes back).

    Should building the checkout fail there (a setuptools too old for pyproject.toml, no
    `wheel` for an older one), the wheels are installed alone and the package is laid out by
    copying its folders as `PACKAGE_DIRS` maps them: the same files, no build step.
    """
    args = f" {gpu_check_args.strip()}" if gpu_check_args.strip() else ""
    pip = ("python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir "
           f"--disable-pip-version-check --root-user-action=ignore --upgrade --target {SITE}")
    copy = " && ".join(f"cp -rT {folder} {SITE}/{package.replace('.', '/')}"
                       for package, folder in PACKAGE_DIRS.items())
    return ("export PYTHONUNBUFFERED=1; set -o pipefail; "
            f"{pip} --no-build-isolation {WHEEL_DIR}/*.whl . "
            f"|| {{ {pip} {WHEEL_DIR}/*.whl && {copy}; }} || exit 1; "
            f"PYTHONPATH={SITE}:. python3 -P -m benchmarks.gpu_check --out $OUT{args} 2>&1 "
            f"| tee $OUT/{LOG}")


def rehearse(root: pathlib.Path = ROOT, gpu_check_args: str = "--cpu") -> int:
    """Copies what travels into a temporary folder and runs the device command's install and
    check there with this Python (whose packages stand in for the device's); returns its exit
    status. `$OUT` is a folder beside the copy."""
    with tempfile.TemporaryDirectory() as tmp:
        tree, out = pathlib.Path(tmp) / "tree", pathlib.Path(tmp) / "out"
        for path in travelling_files(root):
            (tree / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / path, tree / path, follow_symlinks=False)
        out.mkdir()
        bindir = pathlib.Path(tmp) / "bin"                 # `python3` is this interpreter
        bindir.mkdir()
        (bindir / "python3").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
        (bindir / "python3").chmod(0o755)
        command = device_command(gpu_check_args).replace(SITE, f"{tmp}/site")
        env = dict(os.environ, OUT=str(out), PATH=f"{bindir}:{os.environ['PATH']}")
        code = subprocess.run(["bash", "-c", command], cwd=tree, env=env).returncode
        print(f"rehearsal exit status {code}; $OUT held {sorted(p.name for p in out.iterdir())}")
        return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_ship",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--args", default="", help="extra arguments of the GPU check there")
    parser.add_argument("--no-download", action="store_true",
                        help="carry the wheels already in .whl/ (fails if one is missing)")
    parser.add_argument("--rehearse", action="store_true",
                        help="then run the install and a --cpu check on a copy, here")
    args = parser.parse_args(argv)
    wheels = (sorted((ROOT / WHEEL_DIR).glob("*.whl")) if args.no_download
              else download(ROOT))
    missing = [n for n in DEVICE_LACKS if not any(w.name.startswith(n) for w in wheels)]
    if missing:
        print(f"no wheel of {missing} in {WHEEL_DIR}/: run without --no-download",
              file=sys.stderr)
        return 1
    sizes = travelling_files(ROOT)
    total = sum(sizes.values())
    largest = sorted(sizes.items(), key=lambda kv: -kv[1])[:3]
    print(f"wheels: {', '.join(w.name for w in wheels)}")
    print(f"travels: {len(sizes)} files, {total / 2**20:.2f} MiB of {LIMIT_BYTES / 2**20:.0f} MiB"
          f" (largest: {', '.join(f'{p} {s / 2**10:.0f} KiB' for p, s in largest)})")
    if total >= LIMIT_BYTES:
        print("too large to travel: ignore or leave out what the check does not need",
              file=sys.stderr)
        return 1
    command = device_command(args.args)
    if len(command) > MAX_COMMAND:
        print(f"the command has {len(command)} characters, more than {MAX_COMMAND}",
              file=sys.stderr)
        return 1
    print("device call (the run tool):")
    print(json.dumps(dict(command=command, carry=[WHEEL_DIR], timeout_s=TIMEOUT_S), indent=1))
    print(f"results come back as gpu_check.json, gpu_check.md and {LOG}; record a GPU result "
          "with: python -m benchmarks.gpu_check --record <files_at>/gpu_check.json")
    if args.rehearse:
        return rehearse(ROOT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
