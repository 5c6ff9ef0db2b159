"""Events in words (orchestrator/views/event_text/): every kind of contract.events has a sentence; a
sentence shows no raw dict or list, names the job and the node it is about, says nothing of a
field an old line lacks ("None"), and lets no control character through.

Each kind is built from its own dataclass fields, with sample values chosen by the field's type,
so a kind added to the contract is covered here without editing this file.
"""

from __future__ import annotations

import dataclasses
import time

import pytest

from orchestrator.contract import events as ev
from orchestrator.contract import failure_events as fev
from orchestrator.views.event_text import SENTENCES, clock, sentence

JOB, NODE = "4207", "node17"
ANSI = "\x1b[2J\x1b]0;pwned\x07\nforged line"


def sample(name: str, kind: str, text: str = "fine") -> object:
    """A value of the field's annotated type (annotations are strings: `str | None`, ...)."""
    if name in ("job_id", "failed_job_id", "reported_by_job"):
        return JOB
    if name in ("node", "host"):
        return NODE
    if kind.startswith("list[dict"):
        return [{"host": NODE, "rank": 3, "age_seconds": 212.0, "limit_seconds": 210.0, "kind": "dead_rank"}]
    if kind.startswith("list["):
        return ["node01", "node02"] if "str" in kind else [1.5, 2.5]
    if kind.startswith("dict[str, str]"):
        return {NODE: "GPU missing"}
    if kind.startswith(("dict[", "Any")):
        return {"key": "value", "nested": {"a": 1}}
    if kind.startswith("bool"):
        return True
    if kind.startswith("int"):
        return 7
    if kind.startswith("float"):
        return 212.0
    return text


def build(kind: type[ev.Event], text: str = "fine", blank_required: bool = False) -> ev.Event:
    values = {}
    for spec in dataclasses.fields(kind):
        if spec.name == "time":
            continue
        required = spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING
        values[spec.name] = None if blank_required and required else sample(spec.name, str(spec.type), text)
    return kind(time=1_800_000_000.0, **values)


def all_kinds() -> list[type[ev.Event]]:
    return [*ev.event_kinds().values(), ev.UnknownEvent]


def test_every_kind_has_its_own_sentence():
    kinds = all_kinds()
    missing = [k.__name__ for k in kinds if k not in SENTENCES]
    assert missing == [], f"no sentence for {missing}: add one to the matching orchestrator/views/event_text/*_sentences.py"
    assert len({SENTENCES[k] for k in kinds}) == len(kinds), "one function per kind"


@pytest.mark.parametrize("kind", all_kinds(), ids=lambda k: k.KIND or k.__name__)
def test_a_sentence_names_its_job_and_node_and_shows_no_raw_record(kind):
    event = build(kind)
    text = sentence(event)
    print(f"{kind.KIND or kind.__name__}: {text}")
    assert text and "\n" not in text
    for raw in ("{", "}", "['", '["', "None"):
        assert raw not in text, f"{kind.__name__}: {raw!r} in {text!r}"
    names = {f.name for f in dataclasses.fields(kind)}
    if names & {"job_id", "failed_job_id"}:
        assert JOB in text, f"{kind.__name__} does not say which job: {text!r}"
    if "node" in names:
        assert NODE in text, f"{kind.__name__} does not say which node: {text!r}"


@pytest.mark.parametrize("kind", all_kinds(), ids=lambda k: k.KIND or k.__name__)
def test_an_old_line_without_the_fields_reads_in_words(kind):
    """A field missing from an older line reads as None (contract.events): never shown as None."""
    text = sentence(build(kind, blank_required=True))
    assert "None" not in text and "{" not in text, f"{kind.__name__}: {text!r}"


@pytest.mark.parametrize("kind", all_kinds(), ids=lambda k: k.KIND or k.__name__)
def test_text_from_other_users_stays_one_inert_line(kind):
    text = sentence(build(kind, text=ANSI))
    assert not any(ch in text for ch in "\x1b\x07\x9b\n"), repr(text)


def test_a_lost_node_and_its_restart_read_as_the_on_call_says_them():
    failure = fev.Failure(job_id=JOB, cause="dead_rank", failure_time=0.0, detection_time=212.0, last_step=1200,
                         ranks_affected=8, ranks=[{"host": NODE, "age_seconds": 212.4, "limit_seconds": 210.0}])  # fmt: skip
    assert sentence(failure).startswith(f"{NODE} lost in job {JOB} at step 1200 (no beat for 212 s, dead after 210 s")
    restart = fev.Restart(job_id=JOB, in_allocation=True, failed_job_id=JOB, cause="dead_rank", failure_time=0.0,
                         detection_time=212.0, restart_time=212.0, resume_step=1000,
                         how="inside job 4207: launch 2 leaving out node17 (3 spare(s) left)")  # fmt: skip
    assert sentence(restart) == (
        f"restarting inside job {JOB} from step 1000 after a lost node; launch 2 leaving out node17 (3 spare(s) left)"
    )
    ended = ev.JobEnded(job_id=JOB, state="failed", exit_code=137, outcome="failed")
    assert sentence(ended) == f"job {JOB} ended: failed (signal 9) (failed, exit 137)"


def test_a_hang_names_the_rank_behind_the_others_or_says_why_nobody():
    stuck = [{"host": NODE, "rank": r, "age_seconds": 81.0, "limit_seconds": 80.0} for r in (8, 9)]
    named = fev.Failure(job_id=JOB, cause="hang", failure_time=0.0, detection_time=81.0, last_step=1200,
                       ranks=stuck, suspects=[{"rank": 9, "host": "node18"}],
                       suspects_why="working while the others wait")  # fmt: skip
    assert sentence(named).endswith("; behind: rank 9 on node18 (working while the others wait)")
    nobody = dataclasses.replace(named, suspects=[], suspects_why="nobody named: all 2 stuck ranks waiting")
    assert sentence(nobody).endswith("(limit 80 s); nobody named: all 2 stuck ranks waiting")


def test_clock_is_local_time_with_the_date_only_on_another_day(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    try:
        now = 1_796_047_500.0  # 2026-11-30 14:05 UTC
        assert clock(now - 3 * 60, now) == "14:02"
        assert clock(now - 86400, now) == "11-29 14:05"
        assert clock(None, now) == "--:--"
    finally:
        monkeypatch.undo()
        time.tzset()
