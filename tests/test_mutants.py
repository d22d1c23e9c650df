"""The mutation tool stays pointed at the code: a refactor that moves or rewrites mutated code must retarget its
mutant (scripts/mutants.py --check), or the mutant would silently turn n/a and protect nothing."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_mutant_applies_exactly_once_and_names_tests_that_exist():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "mutants.py"), "--check"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert " 0 problem(s)" in done.stdout
