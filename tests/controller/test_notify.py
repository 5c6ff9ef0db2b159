"""Notifications through apprise against a local HTTP server and a local SMTP server (apprise's
json:// and mailto:// URLs); a failure is reported, never raised, and no part of a secret URL
reaches the report or the process's logging."""

from __future__ import annotations

import logging
import socket

from fakes import SMTPServer, WebhookServer, make_config

from orchestrator.controller.notify import notify
from orchestrator.plan.config.notify_urls import unknown_urls


def mailto(port: int, sender: str, *to: str) -> str:
    """An SMTP relay without login, as apprise's URL."""
    return f"mailto://127.0.0.1:{port}?from={sender}&to={','.join(to)}&smtp=127.0.0.1"


def test_json_and_mailto_urls_delivered():
    hook, smtp = WebhookServer(), SMTPServer()
    try:
        cfg = make_config(notifications={"urls": [hook.url, mailto(smtp.port, "runctl@cluster.org", "oncall@team.org",
                                                                  "lead@team.org")]})  # fmt: skip
        problems = notify(cfg.notifications, "demo", "hang", "job 12: hang of 4 rank(s)", {"job_id": "12"})
        assert problems == []
        print(hook.received)
        sent = hook.received[0]
        assert (sent["title"], sent["type"]) == ("[demo] hang: job 12: hang of 4 rank(s)", "warning")
        assert sent["message"] == "job 12: hang of 4 rank(s)\njob_id: 12"
        mail = smtp.messages[0]
        assert mail["from"] == "runctl@cluster.org" and sorted(mail["to"]) == ["lead@team.org", "oncall@team.org"]
        assert "Subject: [demo] hang: job 12" in mail["data"]
    finally:
        for server in (hook, smtp):
            server.close()


def test_events_filter():
    hook = WebhookServer()
    try:
        cfg = make_config(notifications={"urls": [hook.url], "events": ["crash_loop"]})
        assert notify(cfg.notifications, "demo", "restart", "x") == []
        assert notify(cfg.notifications, "demo", "crash_loop", "y") == []
        assert hook.kinds() == ["crash_loop"]
    finally:
        hook.close()


def test_unreachable_servers_are_reported_redacted_not_raised_nor_logged(caplog):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    token = "T0KEN1234secret"
    cfg = make_config(notifications={
        "urls": [f"jsons://127.0.0.1:{port}/x/{token}", f"json://127.0.0.1:{port}/hooks/{token}",
                 mailto(port, "a@b.org", "c@d.org")],
        "timeout_seconds": 2,
    })  # fmt: skip
    with caplog.at_level(logging.DEBUG):
        problems = notify(cfg.notifications, "demo", "failure", "boom")
    print(problems)
    assert len(problems) == 3
    assert problems[0].startswith(f"jsons://127.0.0.1:{port}/<redacted>: ")
    assert problems[1].startswith(f"json://127.0.0.1:{port}/<redacted>: ")
    assert problems[2].startswith(f"mailto://127.0.0.1:{port}/<redacted>: ")
    assert not any(token in p for p in problems), "a problem must not carry the URL's secret"
    assert not [r for r in caplog.records if token in r.getMessage()], "apprise's log must not reach ours"


def test_a_newline_in_a_message_still_sends_the_email():
    """A kill reason or srun's output with a newline once made EmailMessage raise on the header."""
    smtp = SMTPServer()
    try:
        cfg = make_config(notifications={"urls": [mailto(smtp.port, "runctl@cluster.org", "oncall@team.org")]})
        problems = notify(cfg.notifications, "demo", "kill", "stopped: loss spike\nBcc: everyone@corp", {})
        assert problems == [] and len(smtp.messages) == 1
        headers = smtp.messages[0]["data"].split("\r\n\r\n", 1)[0].split("\n\n", 1)[0]
        assert "Subject: [demo] kill: stopped: loss spike Bcc: everyone@corp" in headers
        assert "\nBcc:" not in headers
    finally:
        smtp.close()


def test_pre_flight_names_what_apprise_cannot_send_to():
    cfg = make_config(notifications={
        "urls": ["slack://T000/B000/XXXXXXXX", "slakc://T000/B000/XXXXXXXX"],
        "page": [mailto(25, "ops@team", "oncall@team.org")],  # a sender without a dotted domain
    })  # fmt: skip
    problems = unknown_urls(cfg.notifications)
    print(problems)
    assert len(problems) == 2
    assert problems[0].startswith("notifications.page: mailto://127.0.0.1:25/<redacted> is not a URL apprise knows")
    assert problems[1].startswith("notifications.urls: slakc://<redacted> is not a URL apprise knows")
    assert not any("XXXXXXXX" in p for p in problems)


def test_a_reason_that_quotes_the_url_is_scrubbed():
    """What apprise says about a failure is scrubbed of every part of the URL that may be a
    secret, whatever service: the path and query (Slack-style hooks), the user and password, and
    the host of services whose host is a token (slack://TOKEN/..., pagerduty://KEY@APIKEY)."""
    from orchestrator.controller.notify import _scrub
    from orchestrator.plan.config.notify_urls import redact_url

    cases = {
        "jsons://hookuser:PASSWORD@hooks.example.org/services/T0SECRET/B0TOKEN?key=QSECRET":
            ("T0SECRET", "B0TOKEN", "QSECRET", "PASSWORD", "hookuser"),
        "slack://T0SECRET/B0TOKEN/X0TOKEN": ("T0SECRET", "B0TOKEN", "X0TOKEN"),
        "pagerduty://INTEGRATIONKEY@APIKEYSECRET": ("INTEGRATIONKEY", "APIKEYSECRET"),
    }  # fmt: skip
    for url, secrets in cases.items():
        said = f"could not post to {url} (host {url.split('://')[1].split('/')[0]}; path {url.split('://')[1]})"
        shown = f"{redact_url(url)}: {_scrub(said, url)}"
        print(shown)
        assert not [s for s in secrets if s in shown], shown
    assert redact_url("jsons://u:p@hooks.example.org/x") == "jsons://hooks.example.org/<redacted>"


def test_routing_by_severity_page_and_chat_each_get_their_own():
    """Two apprise JSON endpoints (local http.server): a restart reaches chat only, a crash loop
    reaches the pager (and chat, which sees pages), a finish neither; `urls` keeps getting all."""
    pager, chat, everything = WebhookServer(), WebhookServer(), WebhookServer()
    try:
        cfg = make_config(
            notifications={"page": [pager.url], "chat": [chat.url], "urls": [everything.url]}
        )
        for kind in ("restart", "crash_loop", "finish"):
            assert notify(cfg.notifications, "demo", kind, f"{kind} happened") == []
        got = lambda server: [(m["title"].split()[1], m["type"]) for m in server.received]  # noqa: E731
        assert got(pager) == [("crash_loop:", "failure")]
        assert got(chat) == [("restart:", "warning"), ("crash_loop:", "failure")]
        assert got(everything) == [("restart:", "warning"), ("crash_loop:", "failure"), ("finish:", "info")]
    finally:
        pager.close(), chat.close(), everything.close()


def test_every_notification_kind_has_one_severity_and_the_stops_page_only_on_their_own():
    from orchestrator.contract.severity import SEVERITY, Severity

    cfg = make_config()
    assert set(cfg.notifications.events) == set(SEVERITY)  # every kind is sent unless a config says not
    assert {k for k, s in SEVERITY.items() if s is Severity.PAGE} == {"crash_loop", "stopped", "disk", "pool", "doctor"}
    assert SEVERITY["kill"] is SEVERITY["finish"] is Severity.INFO
    assert SEVERITY["restart"] is SEVERITY["failure"] is SEVERITY["spares"] is Severity.CHAT
