"""pass_collection: what a supervision pass keeps is frozen (no collection traverses it), and a
full collection every FULL_COLLECTION_EVERY_PASSES passes still frees reference cycles."""

from __future__ import annotations

import gc
import weakref

from orchestrator.contract import files


class Node:
    pass


def test_a_pass_freezes_what_it_keeps_and_the_nth_pass_collects_cycles(monkeypatch):
    monkeypatch.setattr(files, "FULL_COLLECTION_EVERY_PASSES", 3)
    monkeypatch.setattr(files, "_passes_since_full_collection", 0)
    files.full_collection()
    try:
        with files.pass_collection():
            assert not gc.isenabled()  # no collection inside the pass
            kept = [Node() for _ in range(100)]
            cycle = Node()
            cycle.me = cycle  # garbage only a collection can free
            alive = weakref.ref(cycle)
            del cycle
        assert gc.isenabled()
        assert gc.get_freeze_count() >= 100, "what the pass kept is frozen"
        gc.collect()  # an ordinary (automatic) collection skips frozen objects
        assert alive() is not None
        with files.pass_collection():
            pass
        assert alive() is not None
        with files.pass_collection():  # the third pass: a full collection, frozen objects too
            pass
        assert alive() is None, "the cycle a pass left was never collected"
        assert gc.get_freeze_count() == 0 and len(kept) == 100
    finally:
        gc.unfreeze()


def test_nested_in_a_pass_it_leaves_the_collector_to_the_outer_one():
    files.full_collection()
    with files.deferred_collection():
        with files.pass_collection():
            pass
        assert not gc.isenabled() and gc.get_freeze_count() == 0
    assert gc.isenabled()
