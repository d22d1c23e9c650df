"""Train a GCN with the Python API; start it with mpirun / mpiexec.

    gnn-dist partition --dataset synthetic:small --num-parts 2 --out parts/small2
    mpiexec -n 2 python examples/train_gcn.py parts/small2
"""
import sys

from gnn_dist import ModelConfig, RankContext, SetupError, TrainConfig, make_world_comm, train

ctx = RankContext(make_world_comm())
config = TrainConfig(
    parts=sys.argv[1] if len(sys.argv) > 1 else "parts/small2",
    model=ModelConfig(model="gcn", hidden=64, num_layers=2, dropout=0.5),
    epochs=100,
    lr=0.01,
    progress=ctx.is_root,
)
try:
    final = train(ctx, config)
except SetupError as err:
    if ctx.is_root:
        print(f"error: {err}", file=sys.stderr)
    sys.exit(1)
if ctx.is_root:
    print(f"test accuracy {final['test_acc']:.4f}, halo bytes sent {final['halo_bytes_total']:,}")
