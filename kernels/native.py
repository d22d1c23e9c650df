"""The native kernels (CSR SpMM, fused keyed dropout), compiled with torch's C++ extension tooling on first use.

The build runs once per machine and torch version (cached under
TORCH_EXTENSIONS_DIR, default ~/.cache/torch_extensions) and never during
`pip install`. Without a compiler or ninja the dispatcher falls back to
torch's sparse kernels with one warning. GNN_DIST_KERNEL=torch forces the
fallback; GNN_DIST_KERNEL=native makes a failed build an error.
"""
from __future__ import annotations

import hashlib
import os
import threading
import warnings
from pathlib import Path

KERNEL_ENV = "GNN_DIST_KERNEL"
_SOURCE = Path(__file__).with_name("native_kernels.cpp")
_lock = threading.Lock()
_module = None
_failed: str | None = None


def native_module():
    """The compiled module, or None (after one warning) when it cannot be built or is switched off."""
    global _module, _failed
    choice = os.environ.get(KERNEL_ENV, "auto")
    if choice == "torch":
        return None
    if _module is not None or _failed is not None:
        if _failed is not None and choice == "native":
            raise RuntimeError(f"{KERNEL_ENV}=native but the native kernel could not be built: {_failed}")
        return _module
    with _lock:
        if _module is None and _failed is None:
            try:
                import torch.utils.cpp_extension as cpp

                # The build is named by its source's digest: checkouts with different kernel sources (an
                # older release beside this one, benchmarks of two commits) never rebuild over each other's
                # build while the other's ranks are loading it.
                digest = hashlib.sha256(_SOURCE.read_bytes()).hexdigest()[:12]
                _module = cpp.load(name=f"gnn_dist_native_kernels_{digest}", sources=[str(_SOURCE)],
                                   extra_cflags=["-O3", "-march=native"], verbose=False)
            except Exception as err:  # noqa: BLE001 - any build problem means: use the fallback
                _failed = f"{type(err).__name__}: {str(err).strip().splitlines()[-1] if str(err).strip() else ''}"
                if choice == "native":
                    raise RuntimeError(f"{KERNEL_ENV}=native but the native kernel could not be built: "
                                       f"{_failed}") from err
                warnings.warn(f"gnn-dist: native CSR kernel unavailable ({_failed}); using torch's sparse "
                              f"kernels (slower). Install a C++ compiler and ninja to enable it.", stacklevel=2)
    return _module

