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
import time
import warnings
from pathlib import Path

KERNEL_ENV = "GNN_DIST_KERNEL"
# torch marks a build in progress with a bare `lock` file and waits, without a bound, for it to go. A build
# killed half way (Ctrl-C, a job torn down on its first run) leaves it for good, and every later run would
# wait forever before its first epoch; a build takes a minute or two, so a lock this old is a dead one's.
STALE_BUILD_LOCK_S = 600
_SOURCES = [Path(__file__).with_name(name) for name in ("native_kernels.cpp", "workspace_allocator.cpp")]
_lock = threading.Lock()
_module = None
_failed: str | None = None


def torch_forced() -> bool:
    """GNN_DIST_KERNEL=torch: the torch formulations run even where the native kernel could (cheap: no build)."""
    return os.environ.get(KERNEL_ENV, "auto") == "torch"


def torch_formulations_run() -> bool:
    """Whether host tensors go through the torch formulations: GNN_DIST_KERNEL=torch, or a native build that was
    tried and failed. It never starts a build (the memory plan asks; train has loaded the kernel by then)."""
    return torch_forced() or _failed is not None


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
                digest = hashlib.sha256(b"".join(source.read_bytes() for source in _SOURCES)).hexdigest()[:12]
                name = f"gnn_dist_native_kernels_{digest}"
                build = Path(cpp._get_build_directory(name, verbose=False))
                _module = _load_built(cpp, name, build)
                if _module is None:
                    _remove_stale_build_lock(build / "lock")
                    _module = cpp.load(name=name, sources=[str(source) for source in _SOURCES],
                                       extra_cflags=["-O3", "-march=native"], verbose=False)
            except Exception as err:  # noqa: BLE001 - any build problem means: use the fallback
                _failed = f"{type(err).__name__}: {str(err).strip().splitlines()[-1] if str(err).strip() else ''}"
                if choice == "native":
                    raise RuntimeError(f"{KERNEL_ENV}=native but the native kernel could not be built: "
                                       f"{_failed}") from err
                warnings.warn(f"gnn-dist: native CSR kernel unavailable ({_failed}); using torch's sparse "
                              f"kernels (slower). Install a C++ compiler and ninja to enable it.", stacklevel=2)
    return _module


def _load_built(cpp, name: str, build: Path):
    """The module already built under this name, loaded without taking torch's build lock; None when absent.

    The name carries the sources' digest, so a built library of that name is what a build would make now.
    Loading it directly spares every run after the first build torch's lock, whose waiters wait without a
    bound: one rank killed while it held the lock (a job torn down at start) would hang every later run."""
    library = build / f"{name}.so"
    if not library.is_file() or (build / "lock").exists():
        return None
    try:
        return cpp._import_module_from_library(name, str(build), True)
    except (ImportError, OSError):
        return None  # half written by a killed build: build it again


def _remove_stale_build_lock(lock: Path, max_age_s: float = STALE_BUILD_LOCK_S) -> bool:
    """Delete a build lock older than max_age_s (left by a killed build); True when one was deleted."""
    try:
        age = time.time() - lock.stat().st_mtime
    except OSError:
        return False  # no lock: nothing is building
    if age < max_age_s:
        return False  # another process may be building right now: torch waits for it
    lock.unlink(missing_ok=True)
    warnings.warn(f"gnn-dist: removed {lock}, left {age / 60:.0f} min ago by a kernel build that did not finish",
                  stacklevel=3)
    return True
