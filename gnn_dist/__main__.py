import sys

from gnn_dist.cli import main

sys.exit(main())
