"""Put a results folder's summary table and % SOL plot into README.md (between the BENCH markers).

python -m benchmarks.readme benchmarks/results/<run>
"""

import json
import re
import sys
from pathlib import Path

from benchmarks import run

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- BENCH:BEGIN -->", "<!-- BENCH:END -->"


def section(folder: Path) -> str:
    data = json.loads((folder / "results.json").read_text())
    rel = folder.resolve().relative_to(ROOT)
    table = run.markdown(data["rows"], data["summary"], data["meta"])
    kinds = {"results.json": "JSON", "results.csv": "CSV", "roofline.png": "roofline plot"}
    kinds["latency.png"] = "latency plot"
    present = ", ".join(kind for name, kind in kinds.items() if (folder / name).exists())
    return (
        f"{BEGIN}\n{table}\nFull results: [`{rel}/`]({rel}/) ({present}).\n\n"
        f"![% SOL per case]({rel}/pct_sol.png)\n{END}"
    )


def update(folder: Path, readme: Path = ROOT / "README.md") -> None:
    text = readme.read_text()
    if BEGIN not in text or END not in text:
        raise ValueError(f"{readme} has no {BEGIN} … {END} markers to replace.")
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.DOTALL)
    readme.write_text(pattern.sub(lambda _: section(folder), text))


if __name__ == "__main__":
    update(Path(sys.argv[1]))
