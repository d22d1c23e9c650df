"""Tasks: what a run learns (`--task node|link`), one file per task, each registering its Task class
(gnn_dist.tasks.registry; what a task owns: gnn_dist.tasks.base).

Importing this package imports every module of its folder, which registers the built-in tasks.

May import: config, hetero, link, models, plugins, schedules, steps
"""
from gnn_dist.plugins.registry import import_modules_of
from gnn_dist.tasks.registry import register_task, task_class, task_names

import_modules_of(__name__, __path__, first=("registry", "base", "node"))

__all__ = ["register_task", "task_class", "task_names"]
