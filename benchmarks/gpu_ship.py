"""Ships the GPU check to a lent device in two calls: the wheels it lacks, the real model split in
two, the size of what travels, and the device tool's two exact calls.

    make gpu-ship                # = python -m benchmarks.gpu_ship [--args "--dump"]
    python -m benchmarks.gpu_ship --rehearse     # both calls on copies, here (--cpu)

The device (the nvidia-h200 kind) has Python 3.12 as `python3`, jax/jaxlib 0.11.2 with the CUDA
plugin, flax, optax, chex, numba, tokenizers, jinja2, torch 2.11 (CUDA), transformers 5.17 and
accelerate, but not `gguf`, which `import jaxspec` imports (through `jaxspec.models`); nothing can
be fetched there, and one call carries 64 MiB at most, the working tree included. So:

1. the wheels in `DEVICE_LACKS`, at the versions pyproject.toml pins, are downloaded into `.whl/`
   (ignored by git) for CPython 3.12 on x86-64 Linux, as the device's README says;
2. the model (the embedded SmolLM2-135M-Instruct GGUF, 94 MiB, or `--gguf`) is split into two
   halves in `.model/` (ignored by git; never commit it), its sha256 kept in
   `.model/manifest.json`;
3. what each call carries is summed: git's tracked and untracked-not-ignored files, `shared/` if
   the checkout has one, `.whl/` and one half of the model; each must stay under `LIMIT_BYTES`;
4. the two calls are printed. Each installs the wheels and the checkout with
   `pip install --no-index --no-deps --no-build-isolation --target /tmp/site` (the package maps
   `models/` and `pallas_kernels/` into `jaxspec`, so the bare tree has no `jaxspec.models`) and
   runs `python3 -P -m benchmarks.gpu_check --out $OUT` with `/tmp/site` first on the path (`-P`:
   the checkout's own `jaxspec/` must not shadow the installed one), teeing its log into $OUT.

   Call 1 carries part A: it copies it to /tmp/model first, then runs the sections that need no
   model, the profile section first (`gpu_check.SECTIONS` less `gpu_check.MODEL_SECTIONS`).
   Call 2 carries part B and must be sent AT ONCE when call 1 returns (a warm machine goes back
   after 30 s idle): it joins the halves in /tmp/model, checks the sha256 and runs the model
   sections (engine at batch 1, divergence, then hf) with `--gguf`. If part A is not in /tmp
   (the machine went back and this is a fresh one) or the joined file fails its checksum, it
   says so and runs the sections that need no model instead. Give the machine back
   (`give_back`) when call 2 returns: idle time counts.

The plan, in device seconds (measured on an H200 on 2026-12-04, the device tool's start-up and
transfers included; 15 minutes a session):

    call 1  start-up and transfer ~30, install ~10, imports ~10;   ~130  (--budget-s 80: the step
            profile ~75 (6 keys of ~12 s), then the step grid             section fills what the
            until the budget is spent; kernels, attention,                profile leaves)
            sa_timing and mesh are skipped for time
    between the calls (the caller's turn)                         <10
    call 2  transfer and install ~10, join + sha256 ~2, imports   ~210  (--budget-s 200, a cap:
            ~10; engine ~60 (GGUF conversion, compiles, 8                  sections end when done)
            prompts x 128 tokens, plain and SA, a warm and a
            timed pass); divergence ~50 (exact numerics,
            float32 and bfloat16, 2 prompts x 64 positions); hf
            ~80 (torch, HF's GGUF load ~37, prompt lookup,
            greedy)
                                                                  ~6 min in all, ~10 at most

Both calls' `timeout_s` bound a hang (budget + `TIMEOUT_MARGIN_S`), so a failed pair still leaves
time for one more call. `--first-budget-s` / `--second-budget-s` change the plan (more for call 1
reaches the kernels' proofs); `--args` goes to both checks (after the plan's, so it can override).

The device tool sends the checkout the session was started in: run this there, with the GPU
check's code in it. Record the two results as one section of BENCHMARKS.md with
`python -m benchmarks.gpu_check --record CALL1/gpu_check.json CALL2/gpu_check.json`.
"""

import argparse
import dataclasses
import hashlib
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

from benchmarks import gpu_check

ROOT = pathlib.Path(__file__).resolve().parent.parent
WHEEL_DIR = ".whl"
DEVICE_LACKS = ("gguf",)           # the device's package list (KINDS.md) has everything else
DEVICE_PYTHON = "3.12"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64")
LIMIT_BYTES = 64 * 2**20           # the working tree and carried paths, per call
MAX_COMMAND = 2000                 # characters of one device command
DEVICE_TMP = "/tmp"                # where the install and the model halves live there
MODEL_DIR = ".model"               # the model's halves here (in .gitignore)
PARTS = ("part-a", "part-b")
MANIFEST = "manifest.json"
FIRST_BUDGET_S = 80                # see the plan in the module doc
SECOND_BUDGET_S = 200
# Batch 8 alone would take the second call's budget; fast numerics' divergence is measured on CPU.
SECOND_ARGS = "--engine-batches 1 --divergence-numerics exact"
TIMEOUT_MARGIN_S = 120             # install, imports, the unit running when the budget ends
# pyproject.toml's [tool.setuptools.package-dir], parents first (a test keeps them equal).
PACKAGE_DIRS = {"jaxspec": "jaxspec", "jaxspec.models": "models",
                "jaxspec.pallas_kernels": "pallas_kernels"}
LOG = "gpu_check.log"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Call:
    """One call of the device tool's `run`: the command, the ignored paths it carries, its limit."""

    command: str
    carry: tuple[str, ...]
    timeout_s: int

    def as_json(self) -> dict:
        return dict(command=self.command, carry=list(self.carry), timeout_s=self.timeout_s)


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


def sha256(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(2**20):
            digest.update(block)
    return digest.hexdigest()


def split_model(source: pathlib.Path, folder: pathlib.Path) -> dict:
    """Splits `source` into `folder/part-a` and `folder/part-b` (part A the larger by a byte at
    most) and records its name, size and sha256 in `folder/manifest.json`, which it returns;
    halves that the manifest already describes for this file are kept.
    """
    digest = sha256(source)
    manifest_path = folder / MANIFEST
    if manifest_path.is_file():
        manifest = json.loads(manifest_path.read_text())
        if (manifest.get("sha256") == digest and manifest.get("name") == source.name
                and all((folder / p).is_file() and (folder / p).stat().st_size == size
                        for p, size in manifest["parts"].items())):
            return manifest
    folder.mkdir(parents=True, exist_ok=True)
    size = source.stat().st_size
    half = (size + 1) // 2
    with open(source, "rb") as f:
        for part, length in zip(PARTS, (half, size - half), strict=True):
            (folder / part).write_bytes(f.read(length))
    manifest = dict(name=source.name, bytes=size, sha256=digest,
                    parts={part: (folder / part).stat().st_size for part in PARTS})
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


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


def _install(site: str) -> str:
    """Installs the wheels and the checkout into `site`. Should building the checkout fail there
    (a setuptools too old for pyproject.toml, no `wheel` for an older one), the wheels are
    installed alone and the package is laid out by copying its folders as `PACKAGE_DIRS` maps
    them: the same files, no build step."""
    pip = ("python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir "
           f"--disable-pip-version-check --root-user-action=ignore --upgrade --target {site}")
    copy = " && ".join(f"cp -rT {folder} {site}/{package.replace('.', '/')}"
                       for package, folder in PACKAGE_DIRS.items())
    return (f"{pip} --no-build-isolation {WHEEL_DIR}/*.whl . "
            f"|| {{ {pip} {WHEEL_DIR}/*.whl && {copy}; }} || exit 1; ")


def _check(site: str, args: str) -> str:
    return (f"PYTHONPATH={site}:. python3 -P -m benchmarks.gpu_check --out $OUT {args} 2>&1 "
            f"| tee $OUT/{LOG}")


def sections() -> tuple[list[str], list[str]]:
    """(the sections that need no model, the model sections), each in the check's order."""
    return ([s for s in gpu_check.SECTIONS if s not in gpu_check.MODEL_SECTIONS],
            [s for s in gpu_check.SECTIONS if s in gpu_check.MODEL_SECTIONS])


def device_calls(manifest: dict, *, args: str = "", first_budget_s: float = FIRST_BUDGET_S,
                 second_budget_s: float = SECOND_BUDGET_S, tmp: str = DEVICE_TMP
                 ) -> tuple[Call, Call]:
    """The two calls (see the module doc) for the model `manifest` describes.

    Args:
      manifest: `split_model`'s record of the model.
      args: more arguments of both checks, after the plan's.
      first_budget_s, second_budget_s: each check's `--budget-s`.
      tmp: the device's temporary folder (the rehearsal's stand-in here).
    """
    site, model = f"{tmp}/site", f"{tmp}/model"
    gguf = f"{model}/{manifest['name']}"
    plain, with_model = sections()
    extra = f" {args.strip()}" if args.strip() else ""
    no_model = f"--sections {','.join(plain)}"
    head = "export PYTHONUNBUFFERED=1; set -o pipefail; "
    first = (head + f"mkdir -p {model} && cp {MODEL_DIR}/{PARTS[0]} {model}/ || exit 1; "
             + _install(site) + _check(site, f"{no_model} --budget-s {first_budget_s:g}{extra}"))
    second = (head + _install(site)
              + f"M={model}; if [ -f $M/{PARTS[0]} ] && cat $M/{PARTS[0]} {MODEL_DIR}/{PARTS[1]} "
              f"> {gguf} && echo '{manifest['sha256']}  {gguf}' | sha256sum -c -; then "
              f"A='--gguf {gguf} --sections {','.join(with_model)} {SECOND_ARGS}'; else "
              f"echo 'gpu_ship: part A of the model is not in {model} (a fresh machine: the "
              "last one went back after call 1) or the joined file failed its sha256: running "
              f"the sections that need no model'; A='{no_model}'; fi; "
              + _check(site, f"$A --budget-s {second_budget_s:g}{extra}"))
    return (Call(command=first, carry=(WHEEL_DIR, f"{MODEL_DIR}/{PARTS[0]}"),
                 timeout_s=round(first_budget_s + TIMEOUT_MARGIN_S)),
            Call(command=second, carry=(WHEEL_DIR, f"{MODEL_DIR}/{PARTS[1]}"),
                 timeout_s=round(second_budget_s + TIMEOUT_MARGIN_S)))


# The plan's budgets are a GPU's: the rehearsal's checks get the CPU run's, so every section runs.
REHEARSAL_ARGS = f"--cpu --budget-s {gpu_check.DEFAULT_BUDGET_S['cpu']:g}"


def rehearse(calls_at, root: pathlib.Path = ROOT, cpu_args: str = REHEARSAL_ARGS) -> int:
    """Runs both calls one after the other here, each on a fresh copy of what it carries, with
    this Python as `python3` (its packages stand in for the device's) and a folder standing in
    for the device's /tmp, shared by the two calls as a warm machine's is; returns the worse exit
    status. `calls_at(tmp, cpu_args)` builds the calls for that folder, with `cpu_args` added
    (after the plan's arguments, so they win)."""
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        bindir = tmp / "bin"                                # `python3` is this interpreter
        bindir.mkdir()
        (bindir / "python3").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
        (bindir / "python3").chmod(0o755)
        (tmp / "device_tmp").mkdir()
        codes = []
        for i, call in enumerate(calls_at(str(tmp / "device_tmp"), cpu_args), 1):
            tree, out = tmp / f"tree{i}", tmp / f"out{i}"
            for path in travelling_files(root, call.carry):
                (tree / path).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(root / path, tree / path, follow_symlinks=False)
            out.mkdir()
            env = dict(os.environ, OUT=str(out), PATH=f"{bindir}:{os.environ['PATH']}",
                       JAXSPEC_CACHE=str(tmp / "cache"))     # the joined model's conversion
            print(f"--- rehearsal of call {i}", flush=True)
            codes.append(subprocess.run(["bash", "-c", call.command], cwd=tree,
                                        env=env).returncode)
            print(f"--- rehearsal of call {i}: exit status {codes[-1]}; $OUT held "
                  f"{sorted(p.name for p in out.iterdir())}", flush=True)
        return max(codes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_ship",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--args", default="", help="extra arguments of both GPU checks there")
    parser.add_argument("--first-budget-s", type=float, default=FIRST_BUDGET_S)
    parser.add_argument("--second-budget-s", type=float, default=SECOND_BUDGET_S)
    parser.add_argument("--gguf", type=pathlib.Path, default=None,
                        help="the model to ship (default: the embedded SmolLM2 GGUF)")
    parser.add_argument("--no-download", action="store_true",
                        help="carry the wheels already in .whl/ (fails if one is missing)")
    parser.add_argument("--rehearse", action="store_true",
                        help="then run both calls, with --cpu, on copies here")
    args = parser.parse_args(argv)
    wheels = (sorted((ROOT / WHEEL_DIR).glob("*.whl")) if args.no_download
              else download(ROOT))
    missing = [n for n in DEVICE_LACKS if not any(w.name.startswith(n) for w in wheels)]
    if missing:
        print(f"no wheel of {missing} in {WHEEL_DIR}/: run without --no-download",
              file=sys.stderr)
        return 1
    if args.gguf is None:
        from jaxspec.models import registry

        args.gguf = registry.default_gguf_path()
    manifest = split_model(args.gguf, ROOT / MODEL_DIR)
    print(f"wheels: {', '.join(w.name for w in wheels)}")
    print(f"model: {manifest['name']}, {manifest['bytes'] / 2**20:.2f} MiB, sha256 "
          f"{manifest['sha256']}; halves in {MODEL_DIR}/: " + ", ".join(
              f"{p} {b / 2**20:.2f} MiB" for p, b in manifest["parts"].items()))

    def calls_at(tmp: str, more: str = "") -> tuple[Call, Call]:
        return device_calls(manifest, args=f"{args.args} {more}", tmp=tmp,
                            first_budget_s=args.first_budget_s,
                            second_budget_s=args.second_budget_s)

    calls = calls_at(DEVICE_TMP)
    plain, with_model = sections()
    runs = [f"copies part A to {DEVICE_TMP}/model, then runs {','.join(plain)} "
            f"(--budget-s {args.first_budget_s:g})",
            f"joins the halves, checks the sha256, then runs {','.join(with_model)} with --gguf "
            f"(--budget-s {args.second_budget_s:g}); without part A, {','.join(plain)}"]
    for i, (call, what) in enumerate(zip(calls, runs, strict=True), 1):
        sizes = travelling_files(ROOT, call.carry)
        total = sum(sizes.values())
        largest = sorted(sizes.items(), key=lambda kv: -kv[1])[:3]
        print(f"call {i} travels: {len(sizes)} files, {total / 2**20:.2f} MiB of "
              f"{LIMIT_BYTES / 2**20:.0f} MiB (largest: "
              + ", ".join(f"{p} {s / 2**20:.2f} MiB" for p, s in largest) + ")")
        if total >= LIMIT_BYTES:
            print("too large to travel: ignore or leave out what the check does not need",
                  file=sys.stderr)
            return 1
        if len(call.command) > MAX_COMMAND:
            print(f"call {i}'s command has {len(call.command)} characters, more than "
                  f"{MAX_COMMAND}", file=sys.stderr)
            return 1
        print(f"device call {i} (the run tool; {len(call.command)} characters): {what}"
              + (". Send it AT ONCE when call 1 returns (the machine goes back after 30 s idle)."
                 if i == 2 else "."))
        print(json.dumps(call.as_json(), indent=1))
    print("Then give the machine back (give_back). Results come back as gpu_check.json, "
          f"gpu_check.md and {LOG} from each call; record both with: python -m "
          "benchmarks.gpu_check --record <call 1's files_at>/gpu_check.json <call 2's "
          "files_at>/gpu_check.json")
    if args.rehearse:
        return rehearse(calls_at, ROOT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
