"""The attack corpus of docs/security.md: one test per hole of issues 12 and 22, each showing the
attack refused with nothing lost. Real Unix users (attack_env.py); needs root, as CI runs."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from attack_env import shared_run, team  # noqa: E402,F401 - fixtures
from owner_controller import owner_controller  # noqa: E402,F401 - fixture
