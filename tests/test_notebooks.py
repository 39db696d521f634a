"""Every notebook runs top to bottom on CPU (nbclient, the venv's "python3" kernel).

A failing cell fails the test with the cell's traceback; a cell running past CELL_TIMEOUT_S
(a hang guard, far above the ~1-2 minutes a whole notebook takes on 2 idle cores: wall time on a
shared CI machine is no test of correctness) fails it too. To refresh a notebook's stored outputs:
`python tests/test_notebooks.py notebooks/NAME.ipynb`.
"""

import sys
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT_S = 600


def execute(path: Path):
    """Run a notebook in its own folder (repo imports work from there); return it and seconds."""
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    nbclient.NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
    ).execute()
    return nb, time.perf_counter() - start


def test_notebooks_exist():
    assert {p.name[:2] for p in NOTEBOOKS} == {"01", "02", "03", "04", "05"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_on_cpu(path):
    _, seconds = execute(path)
    print(f"{path.name}: {seconds:.1f} s")


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        notebook, seconds = execute(Path(arg).resolve())
        for cell in notebook.cells:  # the kernel's timestamps: no dates in the tree
            cell.metadata.pop("execution", None)
        nbformat.write(notebook, arg)
        print(f"{arg}: {seconds:.1f} s")
