"""The task registry: `--task NAME` -> the Task class that a task file registered (gnn_dist.tasks.base says
what a task owns)."""
from __future__ import annotations

_TASKS: dict[str, type] = {}


def register_task(task_class: type) -> type:
    """Class decorator: make `task_class` (a gnn_dist.tasks.base.Task) available as --task task_class.name."""
    name = getattr(task_class, "name", "")
    if not name or not isinstance(name, str):
        raise ValueError(f"{task_class.__name__} needs a class attribute `name` (its --task NAME)")
    if name in _TASKS and _TASKS[name] is not task_class:
        raise ValueError(f"--task {name} is registered twice: by {_TASKS[name].__qualname__} and "
                         f"{task_class.__qualname__}")
    _TASKS[name] = task_class
    return task_class


def task_names() -> tuple[str, ...]:
    return tuple(_TASKS)


def task_class(name: str) -> type:
    """The Task class of --task NAME; ValueError naming the valid choices otherwise."""
    from gnn_dist.models import one_of

    try:
        return _TASKS[name]
    except KeyError:
        raise ValueError(f"unknown --task {name!r}: use {one_of(task_names())}") from None
