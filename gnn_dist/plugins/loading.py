"""`--plugin MODULE|FILE.py`: a user's module imported before anything reads a registry, so what it registers
(models, schedules, tasks, datasets) becomes a valid choice; and `option_values`, which finds a flag's values
on a raw command line (before any parser exists: the parser's choices depend on the plugins)."""
from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path


class PluginError(ValueError):
    """A --plugin that could not be imported; the message names it and the cause (one usage-error line)."""


def option_values(command: list[str], flag: str) -> list[str]:
    """Every value of `flag VALUE` or `flag=VALUE` in a command line, in order."""
    values = []
    for k, word in enumerate(command):
        if word == flag and k + 1 < len(command):
            values.append(command[k + 1])
        elif word.startswith(flag + "="):
            values.append(word[len(flag) + 1:])
    return values


def import_target(target: str, prefix: str = "gnn_dist_plugin_"):
    """Import a module by name, or a .py file by path (as module prefix + its stem); returns the module. Any
    failure of the user's code propagates as raised."""
    if not target.endswith(".py"):
        return importlib.import_module(target)
    path = Path(target).resolve()
    spec = importlib.util.spec_from_file_location(f"{prefix}{path.stem}", path)
    if spec is None or not path.is_file():
        raise FileNotFoundError(f"no such file {target}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def import_plugins(argv: list[str]) -> None:
    """Import every --plugin of a command line, in order; PluginError on the first that fails."""
    for target in option_values(argv, "--plugin"):
        try:
            import_target(target)
        except Exception as err:  # noqa: BLE001 - any failure of user code is one usage error line
            raise PluginError(f"--plugin {target}: cannot import it ({type(err).__name__}: {err})") from err
