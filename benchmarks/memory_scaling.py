"""Peak memory per rank as ranks are added, resident against sequential halos, and the planner's error.

    python -m gnn_dist.benchmarks.memory_scaling --dataset synthetic:large --parts 1,2,4 --out runs/bench-memory \
        [--modes resident,sequential] [--epochs 3] [--before ../gnn-dist-at-an-older-commit]

GCN 3x256, exact schedule (--schedule S for another), dropout 0.5, one thread per rank, every run on the
same partitions. For each P and halo mode it runs `mpiexec -n P gnn-dist
train` and reads each rank's peak RSS from the final metrics record; beside
it, the peak that `gnn-dist inspect` (gnn_dist.plan.memory) predicts for the same
rank before the run. With --before it also runs the older checkout at that
path (resident halos: older code has no other mode), interleaved with this
tree's runs so the host's drift touches both alike.

Targets (sequential): peak per rank at P=2 <= 0.6x P=1 and at P=4 <= 0.4x P=1;
epoch time at P=2 <= 1.3x resident's; planner within 15% of every measured
peak. --plan-only MODE,... adds predictions for modes not run (a mode that
would not fit this host).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from statistics import median

from gnn_dist.benchmarks.common import machine, markdown_table, partition, run_train
from gnn_dist.config import ModelConfig
from gnn_dist.partition.format import load_meta, part_shapes
from gnn_dist.plan.memory import PlanConfig, plan_part

GIB = 2**30


def predicted(parts_dir: Path, mode: str, hidden: int, schedule: str = "exact") -> list[int]:
    meta = load_meta(parts_dir)
    config = PlanConfig(model=ModelConfig(model="gcn", hidden=hidden, num_layers=3, dropout=0.5), halo_memory=mode,
                        schedule=schedule)
    return [plan_part(shape, config, meta.num_features, meta.num_classes).peak for shape in part_shapes(parts_dir)]


def one_run(parts_dir: Path, num_parts: int, mode: str, args, metrics: Path, tree: Path | None) -> dict:
    extra = ["--model", "gcn", "--hidden", str(args.hidden), "--num-layers", "3", "--epochs", str(args.epochs),
             "--dropout", "0.5", "--timeout", "0"]
    if tree is None:
        extra += ["--halo-memory", mode, "--schedule", args.schedule]
    final = run_train(num_parts, parts_dir, metrics, extra, tree=tree)
    if (tree is None) != ("halo_memory" in final):
        raise RuntimeError(f"the {'older' if tree else 'current'} run did not import the code it should: "
                           f"check that --before names another checkout")
    per_rank = final.get("peak_rss_bytes_per_rank") or [final["peak_rss_bytes"]]
    epochs = final["per_epoch"]
    return {
        "parts": num_parts, "mode": mode, "code": "before" if tree else "after",
        "peak_rss_bytes": final["peak_rss_bytes"], "peak_rss_bytes_per_rank": per_rank,
        "setup_peak_rss_bytes": final.get("setup_peak_rss_bytes"),
        "train_peak_rss_bytes": final.get("train_peak_rss_bytes"),
        "eval_peak_rss_bytes": final.get("eval_peak_rss_bytes"),
        # the first epoch pays one-time costs (kernel loading, first touch of buffers)
        "epoch_s": median(e["epoch_s"] for e in epochs[1:] or epochs),
        "halo_bytes_per_epoch": epochs[-1]["halo_bytes"], "loss": [e["loss"] for e in epochs],
        "test_acc": final["test_acc"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="synthetic:arxiv")
    parser.add_argument("--parts", default="1,2,4")
    parser.add_argument("--modes", default="resident,sequential")
    parser.add_argument("--schedule", default="exact", help="--schedule of this tree's runs (and of their plans)")
    parser.add_argument("--plan-only", default="", help="halo modes to predict without running them")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--before", default=None, help="another checkout of gnn-dist to run side by side")
    parser.add_argument("--out", default="runs/bench-memory")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = args.dataset.replace(":", "-") + ("" if args.schedule == "exact" else "-" + args.schedule.replace(":", "_"))
    results, plans = [], []
    for num_parts in (int(p) for p in args.parts.split(",")):
        parts_dir = partition(args.dataset, num_parts, out / f"parts-{args.dataset.replace(':', '-')}-p{num_parts}")
        runs = [(mode, None) for mode in args.modes.split(",")]
        if args.before:
            runs.insert(0, ("resident", Path(args.before).resolve()))
        for mode, tree in runs:
            row = one_run(parts_dir, num_parts, mode, args, out / f"{'before' if tree else 'after'}-{mode}-"
                          f"p{num_parts}-{args.schedule.replace(':', '_')}.jsonl", tree)
            row["predicted_per_rank"] = predicted(parts_dir, mode, args.hidden, args.schedule)
            results.append(row)
            print(json.dumps(row), flush=True)
        for mode in filter(None, args.plan_only.split(",")):
            plans.append({"parts": num_parts, "mode": mode,
                          "predicted_per_rank": predicted(parts_dir, mode, args.hidden, args.schedule)})
    (out / f"memory_scaling-{name}.json").write_text(json.dumps(
        {"machine": machine(), "args": vars(args), "results": results, "plan_only": plans}, indent=1))
    text = report(args, results, plans)
    (out / f"memory_scaling-{name}.md").write_text(text)
    print(text)
    return 0


def report(args, results: list[dict], plans: list[dict]) -> str:
    def gib(value) -> str:
        return f"{value / GIB:.2f}" if value else ""

    at_one = {(r["code"], r["mode"]): r["peak_rss_bytes"] for r in results if r["parts"] == 1}
    resident = {(r["code"], r["parts"]): r for r in results if r["mode"] == "resident"}
    rows = []
    for r in results:
        errors = [p / m - 1 for p, m in zip(r["predicted_per_rank"], r["peak_rss_bytes_per_rank"])]
        base = at_one.get((r["code"], r["mode"]))
        res = resident.get(("after", r["parts"]))
        rows.append([
            r["code"], r["parts"], r["mode"], gib(r["peak_rss_bytes"]),
            " / ".join(gib(v) for v in r["peak_rss_bytes_per_rank"]),
            f"{r['peak_rss_bytes'] / base:.2f}" if base else "",
            gib(r["setup_peak_rss_bytes"]), gib(r["train_peak_rss_bytes"]), gib(r["eval_peak_rss_bytes"]),
            f"{r['epoch_s']:.2f}", f"{r['epoch_s'] / res['epoch_s']:.2f}" if res and r["code"] == "after" else "",
            f"{r['halo_bytes_per_epoch'] / 1e6:.1f}", gib(max(r["predicted_per_rank"])),
            f"{min(errors):+.1%} .. {max(errors):+.1%}", f"{r['test_acc']:.3f}",
        ])
    table = markdown_table(["code", "P", "halo memory", "peak/rank GiB (max)", "per rank", "vs P=1", "setup",
                            "train", "eval", "epoch s", "vs resident", "halo MB/epoch", "planned GiB",
                            "planner error", "test acc"], rows)
    text = (f"# Memory as ranks are added: {args.dataset}, GCN 3x{args.hidden}, {args.schedule}, {args.epochs} epochs\n\n"
            f"{table}\n")
    if plans:
        text += "\nPredicted only (not run):\n\n" + markdown_table(
            ["P", "halo memory", "planned GiB per rank", "sum over ranks"],
            [[p["parts"], p["mode"], " / ".join(gib(v) for v in p["predicted_per_rank"]),
              gib(sum(p["predicted_per_rank"]))] for p in plans]) + "\n"
    return text


if __name__ == "__main__":
    raise SystemExit(main())
