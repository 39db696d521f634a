"""Command line: `python -m moe_pallas demo|train [options]` (`--help` on each)."""

import importlib
import sys

PROG = "python -m moe_pallas"
COMMANDS = {
    "demo": ("moe_pallas.demo", "run both workloads on each backend, check against the reference"),
    "train": ("moe_pallas.train", "train a tiny MoE transformer (progress bar, falling loss)"),
}


def _usage() -> str:
    lines = [f"usage: {PROG} {{{','.join(COMMANDS)}}} [options]"]
    lines += [f"  {name:<6} {help_text}" for name, (_, help_text) in COMMANDS.items()]
    lines.append(f"`{PROG} COMMAND --help` lists a command's options.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run a command; 0 on success, 2 (with a message on stderr) for a missing or unknown one,
    else the command's own status."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if not argv or argv[0] not in COMMANDS:
        problem = "a command is required" if not argv else f"unknown command {argv[0]!r}"
        print(
            f"{_usage()}\n{PROG}: error: {problem}; choose one of: {', '.join(COMMANDS)}"
            f" (e.g. {PROG} demo)",
            file=sys.stderr,
        )
        return 2
    module = importlib.import_module(COMMANDS[argv[0]][0])
    return module.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
