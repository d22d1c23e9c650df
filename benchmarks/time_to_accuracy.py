"""Time to a target validation accuracy on a modelled link (`gnn-dist bench --links 1,10,100`).

Each run with a link trains under `--simulate-link GBPS` (gnn_dist.comm.simulated_link),
so its epoch times include what its bytes would cost on that link. The time to
target is the training time (the slowest rank's epoch_s, summed) until the
first epoch whose validation accuracy reaches the target. The target is
`--target-val-acc`, or else 0.98 x the exact schedule's best validation
accuracy for the same dataset, P, mode and model (mean over seeds and links).
Every figure here is modelled, and labelled so.
"""
from __future__ import annotations

from pathlib import Path

from gnn_dist.comm.simulated_link import LinkModel


def _gbps(link: str) -> float:
    return LinkModel.parse(link).gbps


def val_curve(records: list[dict]) -> list[list[float]]:
    """[cumulative training seconds, validation accuracy] after every epoch."""
    curve, elapsed = [], 0.0
    for record in records:
        if "final" in record:
            continue
        elapsed += record["epoch_s"]
        curve.append([elapsed, record["val_acc"]])
    return curve


def _group(row: dict) -> tuple:
    return row["dataset"], row["parts"], row["mode"], row["model"]


def add_time_to_target(rows: list[dict], target: float = 0.0) -> None:
    """Sets row["target_val_acc"] and row["time_to_target_s"] (None: not reached) on every run with a link."""
    linked = [r for r in rows if r.get("link") and r.get("status") == "ok" and r.get("val_curve")]
    for row in linked:
        goal = target
        if not goal:
            exact = [r["best_val_acc"] for r in linked if _group(r) == _group(row) and r["schedule"] == "exact"
                     and r["halo_dtype"] == "fp32"]
            goal = 0.98 * sum(exact) / len(exact) if exact else 0.0
        row["target_val_acc"] = goal
        row["time_to_target_s"] = next((s for s, acc in row["val_curve"] if goal and acc >= goal), None)


def section(rows: list[dict]) -> list[str]:
    """The summary's table: time to target per schedule and dtype (columns: links), mean over seeds."""
    linked = [r for r in rows if "target_val_acc" in r]
    if not linked:
        return []
    links = sorted({r["link"] for r in linked}, key=lambda link: (_gbps(link), link))
    lines = ["## Time to target validation accuracy (modelled link)", "",
             "Training seconds until validation accuracy first reaches the target, each exchange held to "
             "latency + bytes / bandwidth of the modelled link (`--simulate-link`); '–': not reached.", "",
             "| dataset | P | schedule | halo dtype | target | " + " | ".join(LinkModel.parse(link).label() for link in links)
             + " |", "|---|---|---|---|---|" + "---|" * len(links)]
    for key in sorted({(r["dataset"], r["parts"], r["schedule"], r["halo_dtype"]) for r in linked}, key=str):
        mine = [r for r in linked if (r["dataset"], r["parts"], r["schedule"], r["halo_dtype"]) == key]
        cells = []
        for link in links:
            times = [r["time_to_target_s"] for r in mine if r["link"] == link]
            reached = [t for t in times if t is not None]
            cells.append(f"{sum(reached) / len(reached):.1f} s" if times and len(reached) == len(times) else "–")
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {mine[0]['target_val_acc']:.3f} | "
                     + " | ".join(cells) + " |")
    return lines + [""]


def plot(rows: list[dict], out: Path, plt) -> Path | None:
    linked = [r for r in rows if r.get("time_to_target_s") is not None]
    if not linked:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for key in sorted({(r["schedule"], r["halo_dtype"]) for r in linked}):
        mine = [r for r in linked if (r["schedule"], r["halo_dtype"]) == key]
        links = sorted({_gbps(r["link"]) for r in mine})
        ax.plot(links, [sum(r["time_to_target_s"] for r in mine if _gbps(r["link"]) == g)
                        / sum(1 for r in mine if _gbps(r["link"]) == g) for g in links],
                marker="o", label=f"{key[0]} {key[1]}")
    ax.set_xscale("log")
    ax.set_xlabel("link bandwidth, Gb/s (modelled)")
    ax.set_ylabel("training seconds to target val. accuracy")
    ax.set_title("Time to accuracy on a modelled link")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = out / "time_to_accuracy.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
