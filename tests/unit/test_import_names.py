"""Our top-level import names belong to us alone.

Python has one namespace of top-level modules per environment. A package of ours named like a
module another installed distribution provides shadows it (or is shadowed by it) depending on
sys.path order: transformers 5 requires Hugging Face's `kernels`, and a `kernels/` of ours made
`import transformers.models.bloom` fail. The check compares the names this checkout defines with
every installed distribution's (`importlib.metadata.packages_distributions()`), so a new
dependency that brings a clashing name fails here, not on a user's machine.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

from tests.conftest import REPO_ROOT

OUR_DISTRIBUTION = "bloomctl"


def top_level_packages(root: Path) -> set[str]:
    """Folders at the root of the checkout that are importable packages (an __init__.py)."""
    return {p.parent.name for p in root.glob("*/__init__.py")} - {"tests"}


def clashes(ours: set[str], installed: dict[str, list[str]]) -> dict[str, list[str]]:
    """Each of our names that another distribution also provides, with those distributions."""
    found = {}
    for name in sorted(ours):
        others = sorted({d for d in installed.get(name, []) if d.lower() != OUR_DISTRIBUTION})
        if others:
            found[name] = others
    return found


def test_the_checkout_defines_the_packages_setup_cfg_ships():
    ours = top_level_packages(REPO_ROOT)
    assert {"orchestrator", "trainer", "bloom_kernels", "simulation"} <= ours, ours


def test_no_installed_distribution_provides_one_of_our_top_level_names():
    found = clashes(top_level_packages(REPO_ROOT), importlib.metadata.packages_distributions())
    assert not found, (
        f"top-level names of this checkout that other installed distributions also provide: {found}. "
        "One of the two shadows the other at import time: rename our package (setup.cfg "
        "[options.packages.find], and every import of it)"
    )


def test_the_check_sees_a_clash_of_the_kind_that_broke_transformers():
    installed = {"kernels": ["kernels"], "trainer": ["bloomctl"], "yaml": ["PyYAML"]}
    assert clashes({"kernels", "trainer"}, installed) == {"kernels": ["kernels"]}
    assert clashes({"orchestrator"}, installed) == {}
