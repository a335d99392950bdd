"""The cold-start benchmark's results as one figure (`cold_start.py --figure PATH`).

One row per model, two panels: first output (seconds from process start, the
`import torch` floor marked) and steady state (ms per call), every case side by
side, medians with min-max whiskers. matplotlib is a benchmark-only dependency
(`./dev.sh bench` installs it beside the examples); nothing else imports it.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

OURS = "load_compiled"  # cases of ours start with this; drawn in the accent colour


def draw(rows: list[tuple[str, dict[str, list[dict[str, Any]]]]], floor_case: str, path: Path, subtitle: str) -> None:
    """`rows`: (model title, {case: the runs' results}) per model, cases in table order."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a build machine
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(len(rows), 2, figsize=(13, 1.2 + 0.42 * max(len(r[1]) for r in rows) * len(rows)), squeeze=False)
    for (title, results), (first_axis, call_axis) in zip(rows, axes):
        cases = [case for case, runs in results.items() if runs and "skipped" not in runs[0]]
        colours = ["tab:orange" if case.startswith(OURS) else "tab:gray" if case == floor_case else "tab:blue" for case in cases]
        _bars(first_axis, cases, [[r["first"] for r in results[c]] for c in cases], colours, log=True)
        first_axis.set_title(f"{title}: first output, s from process start (log scale)", fontsize=10, loc="left")
        if floor_case in cases:
            floor = statistics.median(r["first"] for r in results[floor_case])
            first_axis.axvline(floor, color="tab:gray", linestyle="--", linewidth=1)
            first_axis.text(floor, len(cases) - 0.55, " the import torch floor", color="tab:gray", fontsize=8, va="bottom")
        timed = [c for c in cases if results[c][0]["call"] is not None]
        _bars(call_axis, timed, [[r["call"] * 1000 for r in results[c]] for c in timed], [colours[cases.index(c)] for c in timed], log=False)
        call_axis.set_title("steady state, ms per call", fontsize=10, loc="left")
    figure.suptitle(subtitle, fontsize=9, x=0.01, ha="left")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _bars(axis: Any, labels: list[str], values: list[list[float]], colours: list[str], *, log: bool) -> None:
    medians = [statistics.median(v) for v in values]
    whiskers = [[m - min(v) for m, v in zip(medians, values)], [max(v) - m for m, v in zip(medians, values)]]
    positions = range(len(labels))
    axis.barh(positions, medians, xerr=whiskers, color=colours, capsize=2, error_kw={"linewidth": 0.8})
    axis.set_yticks(list(positions), labels, fontsize=8)
    axis.invert_yaxis()  # the table's order, top to bottom
    axis.tick_params(axis="x", labelsize=8)
    for position, median, spread in zip(positions, medians, values):
        axis.text(max(spread), position, f" {median:.3g}", va="center", fontsize=7)
    highest = max(max(v) for v in values)
    if log:
        axis.set_xscale("log")
        axis.set_xlim(min(min(v) for v in values) / 2, highest * 2)
    else:
        axis.set_xlim(0, highest * 1.18)
