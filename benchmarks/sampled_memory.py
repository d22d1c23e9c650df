"""Sampled training's memory against full-batch training's, per rank and per phase.

    python -m gnn_dist.benchmarks.sampled_memory --dataset synthetic:medium --parts 1,2 --out runs/bench-sampled-memory \
        [--before ../gnn-dist-at-an-older-commit]

GraphSAGE 3x256, fanouts 15,10,5, batch 1024 per rank, one epoch (training,
then one evaluation of every owned node), one thread per rank, on the same
partition for every row. For each P it runs full-batch exact and sampled
training; with --before it also runs the same two with the checkout at that
path (imported through PYTHONPATH), interleaved with this tree's runs so the
host's drift touches both alike. Older code reports only its overall peak, so
its phase columns stay empty.

Targets: sampled peak per rank <= 0.6x full-batch exact's peak per rank on
the same partition; evaluation time no more than 1.5x the older code's.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from gnn_dist.benchmarks.common import machine, markdown_table, partition, run_train

GIB = 2**30


def one_run(parts_dir: Path, num_parts: int, mode: str, args, metrics: Path, tree: Path | None) -> dict:
    extra = ["--model", "sage", "--hidden", str(args.hidden), "--num-layers", "3", "--epochs", "1",
             "--mode", mode, "--timeout", "0"]
    if mode == "sampled":
        extra += ["--fanouts", "15,10,5", "--batch-size", str(args.batch_size)]
    final = run_train(num_parts, parts_dir, metrics, extra, tree=tree)
    # Guard against measuring the wrong code: only this tree's trainer reports per-phase peaks.
    if (tree is None) != ("train_peak_rss_bytes" in final):
        raise RuntimeError(f"the {'older' if tree else 'current'} run did not import the code it should: "
                           f"check that --before names another checkout")
    epoch = final["per_epoch"][-1]
    return {
        "parts": num_parts, "mode": mode, "peak_rss_bytes": final["peak_rss_bytes"],
        "peak_rss_bytes_per_rank": final.get("peak_rss_bytes_per_rank"),
        "setup_peak_rss_bytes": final.get("setup_peak_rss_bytes"),
        "train_peak_rss_bytes": final.get("train_peak_rss_bytes"),
        "eval_peak_rss_bytes": final.get("eval_peak_rss_bytes"),
        "epoch_s": epoch["epoch_s"], "eval_s": epoch.get("eval_s"), "test_acc": final["test_acc"],
    }


def gib(value) -> str:
    return f"{value / GIB:.2f}" if value else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="synthetic:medium")
    parser.add_argument("--parts", default="1,2")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--before", default=None, help="another checkout of gnn-dist to run side by side")
    parser.add_argument("--out", default="runs/bench-sampled-memory")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    trees = [("after", None)]
    if args.before:
        trees.insert(0, ("before", Path(args.before).resolve()))
    results = []
    for num_parts in (int(p) for p in args.parts.split(",")):
        parts_dir = partition(args.dataset, num_parts, out / f"parts-{args.dataset.replace(':', '-')}-p{num_parts}")
        for mode in ("full", "sampled"):
            for code, tree in trees:
                row = one_run(parts_dir, num_parts, mode, args, out / f"{code}-{mode}-p{num_parts}.jsonl", tree)
                row["code"] = code
                results.append(row)
                print(json.dumps(row), flush=True)
    (out / "sampled_memory.json").write_text(json.dumps({"machine": machine(), "args": vars(args),
                                                          "results": results}, indent=1))
    full_peak = {(r["code"], r["parts"]): r["peak_rss_bytes"] for r in results if r["mode"] == "full"}
    eval_before = {(r["parts"], r["mode"]): r["eval_s"] for r in results if r["code"] == "before"}
    rows = []
    for r in results:
        ratio = r["peak_rss_bytes"] / full_peak[(r["code"], r["parts"])]
        before = eval_before.get((r["parts"], r["mode"]))
        rows.append([r["code"], r["parts"], r["mode"], gib(r["peak_rss_bytes"]),
                     " / ".join(gib(v) for v in r["peak_rss_bytes_per_rank"] or []),
                     gib(r["setup_peak_rss_bytes"]), gib(r["train_peak_rss_bytes"]), gib(r["eval_peak_rss_bytes"]),
                     f"{ratio:.2f}", f"{r['epoch_s']:.1f}", f"{r['eval_s']:.2f}",
                     f"{r['eval_s'] / before:.2f}" if before and r["code"] == "after" else "",
                     f"{r['test_acc']:.3f}"])
    table = markdown_table(["code", "P", "mode", "peak/rank GiB (max)", "per rank", "setup", "train", "eval",
                            "vs full-batch peak", "epoch s", "eval s", "eval s vs before", "test acc"], rows)
    text = (f"# Sampled vs full-batch memory: {args.dataset}, GraphSAGE 3x{args.hidden}, fanouts 15,10,5, "
            f"batch {args.batch_size}\n\n{table}\n")
    (out / "sampled_memory.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
