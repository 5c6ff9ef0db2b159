"""The foreign loops' tests borrow the controller tests' helpers (an operator's command run as
another user: test_operators.run_as)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "controller"))
