"""Command line: `python -m moe_pallas demo|train [options]` (`--help` on each)."""

import importlib
import sys

COMMANDS = {
    "demo": ("moe_pallas.demo", "run both workloads, check against the reference, print a table"),
    "train": ("moe_pallas.train", "train a tiny MoE transformer (progress bar, falling loss)"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        print("usage: python -m moe_pallas {" + ",".join(COMMANDS) + "} [options]")
        for name, (_, help_text) in COMMANDS.items():
            print(f"  {name:<6} {help_text}")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    module = importlib.import_module(COMMANDS[argv[0]][0])
    return module.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
