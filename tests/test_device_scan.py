"""Every tensor the runtime creates names its device: a scan of the source, not of a run.

On a GPU a tensor made with a bare `torch.zeros(n)` lands on the host, and the
first operation that mixes it with device tensors fails, far from where it was
made. A CPU-only test run cannot see that, so this test reads the code: every
call of a torch factory in gnn_dist/ and kernels/ must pass `device=` (or be
made from an existing tensor: `new_zeros`, `empty_like`, ... are not factories
here), and every `torch.from_numpy` must be moved with `.to(...)` at once.
Host-only code is exempt: whole modules that never touch a device tensor (the
sampler, the partitioner, the memory plan, the MPI layer), and single lines
that say why with a trailing `# host: <reason>` comment.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = [ROOT / "gnn_dist", ROOT / "kernels"]
FACTORIES = {"zeros", "ones", "empty", "full", "arange", "rand", "randn", "randint", "randperm", "tensor", "eye",
             "linspace", "as_tensor"}
# Modules that build host data only: what they make never meets a device tensor without an explicit move.
HOST_ONLY = {
    "gnn_dist/graph/sampler.py",            # sampling stays on the host (its keyed draw is the CPU kernel)
    "gnn_dist/graph/feature_store.py",      # sampled mode serves features from the host; each batch then moves
    "gnn_dist/hetero/sampler.py",           # typed sampling: the homogeneous sampler's host draw, per relation
    "gnn_dist/hetero/batch_inputs.py",      # a typed batch's inputs: typed sampled training runs on the CPU
    "gnn_dist/pyg/loader.py",               # gd.NeighborLoader's batches: host rows, as PyG's loader yields
    "gnn_dist/partition",             # partitioning and the on-disk format
    "gnn_dist/plan/memory.py",        # arithmetic on shapes
    "gnn_dist/comm/communicator.py",               # MPI metadata (counts) and host buffers
    "gnn_dist/comm/simulated_ranks.py",    # simulated ranks: host threads
    "gnn_dist/comm/staging.py",            # host staging buffers, by definition
    "gnn_dist/link/metrics.py",       # OGB's evaluator takes host tensors
    "gnn_dist/export",                # writes files
    "gnn_dist/embed.py",              # writes files
}
MARKER = "# host:"


def _exempt(path: Path) -> bool:
    rel = path.relative_to(ROOT).as_posix()
    return any(rel == h or rel.startswith(h + "/") for h in HOST_ONLY)


def _is_torch_call(node: ast.Call, names: set[str]) -> str | None:
    func = node.func
    if isinstance(func, ast.Attribute) and func.attr in names and isinstance(func.value, ast.Name) \
            and func.value.id == "torch":
        return func.attr
    return None


def violations_in(source: str, label: str) -> list[str]:
    """'label:line: call' for every factory without device= and every from_numpy not moved at once."""
    tree = ast.parse(source)
    lines = source.splitlines()
    moved = set()  # from_numpy calls that are the receiver of .to(...)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "to" \
                and isinstance(node.func.value, ast.Call):
            moved.add(id(node.func.value))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _is_torch_call(node, FACTORIES | {"from_numpy"})
        if name is None:
            continue
        end = getattr(node, "end_lineno", node.lineno)
        if any(MARKER in lines[n - 1] for n in range(node.lineno, end + 1)):
            continue
        if name == "from_numpy":
            if id(node) not in moved:
                found.append(f"{label}:{node.lineno}: torch.from_numpy(...) not moved with .to(device)")
        elif not any(k.arg == "device" for k in node.keywords):
            found.append(f"{label}:{node.lineno}: torch.{name}(...) without device=")
    return found


def scan() -> list[str]:
    found = []
    for top in SCANNED:
        for path in sorted(top.rglob("*.py")):
            if not _exempt(path):
                found += violations_in(path.read_text(), path.relative_to(ROOT).as_posix())
    return found


def test_every_tensor_the_runtime_creates_names_its_device():
    found = scan()
    assert not found, "tensors created without a device (pass device=, or mark a host-only line `# host: why`):\n" \
        + "\n".join(found)


def test_the_scan_finds_what_it_is_meant_to_find():
    # The rule itself, on snippets whose answer is known: a scan that flags nothing would pass the test above.
    bad = "import torch\nx = torch.zeros(3)\ny = torch.from_numpy(a)\nz = torch.arange(4, dtype=torch.int64)\n"
    assert [v.split(": ", 1)[0] for v in violations_in(bad, "m")] == ["m:2", "m:3", "m:4"]
    good = ("import torch\nx = torch.zeros(3, device=d)\ny = torch.from_numpy(a).to(d)\n"
            "z = torch.arange(4)  # host: an index of host rows\nw = x.new_zeros(3)\nv = torch.empty_like(x)\n")
    assert violations_in(good, "m") == []
    split = "import torch\nx = torch.ones(\n    3,\n    dtype=torch.bool)  # host: a mask of host rows\n"
    assert violations_in(split, "m") == []
