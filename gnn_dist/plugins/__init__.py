"""Extension points: the `Registry` that --model and --task are made of, the discovery that fills a registry
from its folder (registry), and --plugin, a user's module imported before any registry is read (loading).
docs/extending.md walks through adding a model, a schedule, a task or a dataset.

May import: nothing of gnn_dist
"""
