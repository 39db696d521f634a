"""Plots of a benchmark run (matplotlib, PNG): % SOL per case, roofline, latency vs T.

python -m benchmarks.plots RESULTS_DIR     # re-plot a results.json
"""

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from benchmarks.cases import case_order
from benchmarks.impls import weight_format

LAYER_SUITES = ("gptoss", "swiglu256", "decode", "train")


def _impls(rows):
    return list(dict.fromkeys(r["impl"] for r in rows))


def _colors(rows):
    """One colour an implementation, distinct for up to 18 (the canonical run times 13)."""
    palette = [*plt.get_cmap("tab10").colors, *plt.get_cmap("Dark2").colors]
    return {impl: palette[i % len(palette)] for i, impl in enumerate(_impls(rows))}


def plot_pct_sol(rows, meta, path):
    """Grouped bars: % SOL of every timed implementation on every case, one panel per suite."""
    suites = list(dict.fromkeys(r["suite"] for r in rows))
    colors = _colors(rows)
    fig, axes = plt.subplots(len(suites), 1, figsize=(12, 3.2 * len(suites)), squeeze=False)
    for ax, suite in zip(axes[:, 0], suites):
        suite_rows = [r for r in rows if r["suite"] == suite]
        cases = case_order(suite_rows)
        # Quantised weights have a floor of their own, not the case's bf16 SOL (latency.png).
        impls = _impls(
            [r for r in suite_rows if r["status"] == "ok" and weight_format(r["impl"]) is None]
        )
        width = 0.8 / max(len(impls), 1)
        for j, impl in enumerate(impls):
            by_case = {r["case"]: r for r in suite_rows if r["impl"] == impl}
            xs = [
                i + j * width
                for i, c in enumerate(cases)
                if by_case.get(c, {}).get("status") == "ok"
            ]
            ys = [by_case[c]["pct_sol"] for c in cases if by_case.get(c, {}).get("status") == "ok"]
            ax.bar(xs, ys, width, label=impl, color=colors[impl])
        ax.axhline(100, color="k", lw=0.8)
        ax.axhline(100 / 1.15, color="k", lw=0.8, ls=":")
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(cases))])
        ax.set_xticklabels(
            [c.replace("/fwd", "") for c in cases], rotation=60, ha="right", fontsize=7
        )
        ax.set_ylabel("% of SOL")
        ax.set_title(f"{suite}", fontsize=10)
        if impls:  # beside the panel: inside, it hides bars
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.005, 1.0))
    fig.suptitle(f"% SOL (higher is better; dotted: within 15%) — {meta['device']}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_roofline(rows, meta, path):
    """Achieved TFLOP/s against arithmetic intensity, under the device's roof."""
    peak, bw = meta["peak_flops_bf16"] / 1e12, meta["bandwidth"] / 1e12
    ok = [r for r in rows if r["status"] == "ok" and weight_format(r["impl"]) is None]  # bf16
    colors = _colors(rows)
    fig, ax = plt.subplots(figsize=(7, 5))
    if ok:
        lo = min(r["intensity"] for r in ok) / 2
        hi = max(max(r["intensity"] for r in ok) * 2, 2 * peak / bw)
        xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
        ax.plot(xs, [min(peak, bw * x) for x in xs], "k-", lw=1, label="roof")
    markers = {"fwd": "o", "train": "s", "gmm": "^", "tgmm": "v"}
    for impl in _impls(ok):
        for mode, marker in markers.items():
            pts = [r for r in ok if r["impl"] == impl and r["mode"] == mode]
            if pts:
                ax.scatter(
                    [r["intensity"] for r in pts],
                    [r["tflops"] for r in pts],
                    s=14,
                    color=colors[impl],
                    marker=marker,
                    label=f"{impl} ({mode})",
                )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte of the SOL traffic)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f"Roofline — {meta['device']}", fontsize=10)
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_latency(rows, meta, path):
    """Forward latency against tokens T per workload (decode and suite cases), with SOL."""
    fwd = [r for r in rows if r["mode"] == "fwd" and r["suite"] in LAYER_SUITES]
    workloads = list(dict.fromkeys(r["workload"] for r in fwd))
    colors = _colors(rows)
    fig, axes = plt.subplots(
        1, max(len(workloads), 1), figsize=(6 * max(len(workloads), 1), 6), squeeze=False
    )
    for ax, wl in zip(axes[0], workloads):
        wl_rows = sorted((r for r in fwd if r["workload"] == wl), key=lambda r: r["tokens"])
        sol = {r["tokens"]: r["sol_ms"] for r in wl_rows}
        ax.plot(list(sol), list(sol.values()), "k--", lw=1, label="SOL")
        for impl in _impls(wl_rows):
            pts = [r for r in wl_rows if r["impl"] == impl and r["status"] == "ok"]
            if pts:
                ax.plot(
                    [r["tokens"] for r in pts],
                    [r["time_ms"] for r in pts],
                    ".-",
                    color=colors[impl],
                    label=impl,
                )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("tokens T")
        ax.set_ylabel("ms")
        ax.set_title(wl, fontsize=10)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=3)
    fig.suptitle(f"Latency vs T (forward) — {meta['device']}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_all(rows, meta, out_dir: Path) -> list[Path]:
    paths = [out_dir / "pct_sol.png", out_dir / "roofline.png", out_dir / "latency.png"]
    plot_pct_sol(rows, meta, paths[0])
    plot_roofline(rows, meta, paths[1])
    plot_latency(rows, meta, paths[2])
    return paths


if __name__ == "__main__":
    folder = Path(sys.argv[1])
    data = json.loads((folder / "results.json").read_text())
    print(write_all(data["rows"], data["meta"], folder))
