"""Writes one benchmark's results into its own section of BENCHMARKS.md.

Each benchmark owns a section delimited by HTML comments, so benchmarks can be rerun one at a time
without clobbering the others:

    <!-- begin:host_overhead -->
    ...markdown written by the benchmark...
    <!-- end:host_overhead -->
"""

import datetime
import os
import pathlib
import platform
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
BENCHMARKS_MD = ROOT / "BENCHMARKS.md"


def checkout_relative(arg: str) -> str:
    """A command-line argument with any absolute path inside the checkout made relative to it, so
    a recorded command reads the same on every machine."""
    path = pathlib.Path(arg)
    if path.is_absolute():
        try:
            return str(path.resolve().relative_to(ROOT))
        except ValueError:
            return arg
    return arg


def machine_description() -> str:
    """One line naming the machine the numbers come from."""
    import jax

    cpus = os.cpu_count()
    devices = ", ".join(sorted({d.device_kind for d in jax.devices()}))
    return (f"{platform.machine()} {platform.system()}, {cpus} CPU cores, JAX {jax.__version__} "
            f"on {jax.default_backend()} ({devices}), Python {platform.python_version()}")


def write_section(name: str, markdown: str, *, command: str, path: pathlib.Path = BENCHMARKS_MD,
                  machine: str | None = None, stamp: str | None = None):
    """Replaces (or appends) the section `name` with `markdown`, headed by command and date.

    `machine` and `stamp` describe where and when the numbers were measured (default: this
    machine, now); a result measured elsewhere and recorded here gives its own.
    """
    if stamp is None:
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    machine = machine_description() if machine is None else machine
    body = (f"<!-- begin:{name} -->\n{markdown.rstrip()}\n\n"
            f"Command: `{command}` — {stamp}, {machine}.\n<!-- end:{name} -->")
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    pattern = re.compile(rf"<!-- begin:{re.escape(name)} -->.*?<!-- end:{re.escape(name)} -->",
                         re.DOTALL)
    if pattern.search(text):
        text = pattern.sub(lambda _: body, text)
    else:
        text = text.rstrip() + "\n\n" + body + "\n"
    path.write_text(text)


def publish(section: str, markdown: str, *, module: str, argv: list[str], write: bool,
            show: bool = True):
    """Prints a benchmark's section (unless not `show`) and, if `write`, records it with the
    command that made it."""
    if show:
        print(markdown)
    if write:
        command = " ".join(["python -m", module, *map(checkout_relative, argv)])
        write_section(section, markdown, command=command)
