"""`python -m gnn_dist`: the same command as `gnn-dist`.

May import: cli
"""
import sys

from gnn_dist.cli import main

sys.exit(main())
