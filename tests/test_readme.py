"""The README is a manual that stays true: every ```python block runs as written, the two
fresh-machine commands appear verbatim, and it stays short."""

import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_LINES = 160
COMMANDS = (
    (
        "python3.12 -m venv .venv && .venv/bin/pip install -e '.[dev]' && "
        ".venv/bin/python -m moe_pallas demo"
    ),
    ".venv/bin/python -m pytest -q -n 2 --dist worksteal",
)
# A fence line "```python" opens a block to run; "```python no-run" one to skip.
_FENCE = re.compile(r"^```python([^\n]*)\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)


def python_blocks(text: str) -> list[tuple[str, str]]:
    """(info after "python", code) of every ```python block, in order."""
    return [(info.strip(), code) for info, code in _FENCE.findall(text)]


def test_fence_parsing():
    text = "a\n```python\nx = 1\n```\n```bash\nls\n```\n```python no-run\nboom()\n```\n"
    assert python_blocks(text) == [("", "x = 1\n"), ("no-run", "boom()\n")]


def test_readme_is_short_and_has_the_two_commands():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines; keep it to {MAX_LINES}"
    for command in COMMANDS:
        assert command in lines, f"README.md lacks the command line {command!r}"


def test_readme_python_blocks_run():
    """All blocks in order in one fresh interpreter (later blocks use earlier names), as a reader
    pasting them into one session would; the package imported is this checkout's. A snippet that
    raises fails the test with its block number and traceback."""
    blocks = [code for info, code in python_blocks(README.read_text()) if info != "no-run"]
    shown = "\n".join(blocks)
    for name in (
        "MoE(",
        "moe_experts(",
        "ragged_dot(",
        "tgmm(",
        "load_experts(",
        "expert_params()",
    ):
        assert name in shown, f"README.md's snippets should show {name}"
    program = "\n".join(
        f"print('--- README block {i}', flush=True)\n{code}" for i, code in enumerate(blocks, 1)
    )
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    # One CPU device, as on a fresh machine: of the inherited flags only tests/conftest.py's
    # compile-time one (no LLVM optimisation passes on CPU) stays.
    kept = [f for f in env.pop("XLA_FLAGS", "").split() if "xla_backend_optimization_level" in f]
    if kept:
        env["XLA_FLAGS"] = " ".join(kept)
    result = subprocess.run(
        [sys.executable, "-c", program],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, (
        f"a README snippet failed (last block started: "
        f"{re.findall(r'--- README block \d+', result.stdout)[-1:]}):\n{result.stderr[-4000:]}"
    )
