"""The files an export writes: the model's state_dict, and its .json spec beside it.

May import: nothing of gnn_dist
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import nn


def spec_path(path: str | os.PathLike) -> Path:
    return Path(path).with_suffix(".json")


def write_export(out: str, module: nn.Module, spec: dict, writes=()) -> None:
    """module's state_dict at out, any other (path, write) files, then the spec beside out: each written under a
    temporary name and renamed when whole, so a failed export leaves nothing half-written."""
    target = Path(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    for path, write in ((target, lambda p: torch.save(module.state_dict(), p)), *writes,
                        (spec_path(target), lambda p: p.write_text(json.dumps(spec, indent=1)))):
        tmp = path.with_name(f".{path.name}.partial")
        write(tmp)
        os.replace(tmp, path)
