"""OGB's raw files: ogb imported without its network check, and the row of its master table for a dataset.

Shared by the homogeneous loaders (gnn_dist.partition.datasets, convert) and the typed one (ogb_mag).
"""
from __future__ import annotations

import sys
from pathlib import Path


def import_ogb_quietly():
    """Import ogb without its PyPI version check.

    `import ogb` starts a non-daemon thread that calls PyPI with no timeout
    (via the `outdated` package); on a cluster without internet that can keep
    the process alive. When `outdated` is not imported yet we hide it, so
    ogb skips the check (it does so itself when the import fails).
    """
    hid = "outdated" not in sys.modules
    if hid:
        sys.modules["outdated"] = None  # type: ignore[assignment]
    try:
        import ogb.io.read_graph_raw as raw_readers
        import ogb.nodeproppred
    finally:
        if hid and sys.modules.get("outdated", 0) is None:
            del sys.modules["outdated"]
    return raw_readers, ogb.nodeproppred


def ogb_meta(name: str) -> dict:
    """The row of ogb's master.csv for `name` (directory, split, binary, url...)."""
    import pandas as pd

    _, nodeproppred = import_ogb_quietly()
    master = pd.read_csv(Path(nodeproppred.__file__).parent / "master.csv", index_col=0, keep_default_na=False)
    return dict(master[name])
