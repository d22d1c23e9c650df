"""The task registry: `--task NAME` -> the Task class that a task file registered (gnn_dist.tasks.base says
what a task owns)."""
from __future__ import annotations

from gnn_dist.plugins.registry import Registry

TASKS = Registry("--task", "task")
register_task = TASKS.register  # class decorator: a gnn_dist.tasks.base.Task as --task cls.name
task_names = TASKS.names
task_class = TASKS.get
