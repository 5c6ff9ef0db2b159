"""Every scenario the tests run: the failure classes (scenarios.py) and the paths BLOOM's config
ships (shipped.py: spares, the 20 h chain, stragglers), which build on scenarios.py's helpers."""

from __future__ import annotations

from .scenarios import SCENARIOS as FAILURES
from .shipped import SHIPPED

SCENARIOS = [*FAILURES, *SHIPPED]
