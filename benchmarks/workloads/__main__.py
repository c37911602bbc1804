"""Command line: `python -m benchmarks.workloads {list | show NAME [--n N] | demo-prompt}`."""

import argparse
import statistics
import sys

from benchmarks.workloads import WORKLOADS
from benchmarks.workloads import WorkloadUnavailable
from benchmarks.workloads import code_editing
from benchmarks.workloads import load


def _list() -> None:
    print(f"{'workload':<16} {'conversations':>13} {'turns':>5} "
          f"{'mean chars':>10} {'mean words':>10}")
    for name in WORKLOADS:
        try:
            conversations = load(name)
        except WorkloadUnavailable as e:
            print(f"{name:<16} skipped: {e}")
            continue
        texts = ["\n".join(c.turns) for c in conversations]
        print(f"{name:<16} {len(conversations):>13} {len(conversations[0].turns):>5} "
              f"{statistics.mean(map(len, texts)):>10.0f} "
              f"{statistics.mean(len(t.split()) for t in texts):>10.0f}")


def _show(name: str, n: int | None) -> None:
    for conversation in load(name, n):
        print(f"=== {conversation.name} ===")
        if conversation.system is not None:
            print(f"--- system ---\n{conversation.system}")
        for i, turn in enumerate(conversation.turns, start=1):
            print(f"--- user turn {i} ---\n{turn}")
        print()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.workloads", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="each workload with its size and mean prompt length")
    show = commands.add_parser("show", help="print a workload's prompts")
    show.add_argument("name", choices=list(WORKLOADS))
    show.add_argument("--n", type=int, default=None, help="at most this many conversations")
    commands.add_parser("demo-prompt", help="print one code-editing prompt (the user message)")
    args = parser.parse_args(argv)
    try:
        if args.command == "list":
            _list()
        elif args.command == "show":
            _show(args.name, args.n)
        else:
            print(code_editing(1)[0].turns[-1])
    except (WorkloadUnavailable, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
