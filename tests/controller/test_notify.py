"""Notifications against a local HTTP server and a local SMTP server; a failure is reported,
never raised."""

from __future__ import annotations

import socket

from fakes import SMTPServer, WebhookServer, make_config

from orchestrator.notify import notify


def test_webhook_and_email_delivered():
    hook, smtp = WebhookServer(), SMTPServer()
    try:
        cfg = make_config(notifications={"webhook": hook.url, "email": {
            "smtp_host": "127.0.0.1", "smtp_port": smtp.port, "sender": "runctl@cluster", "to": ["oncall@team", "lead@team"]}})
        problems = notify(cfg.notifications, "demo", "hang", "job 12: hang of 4 rank(s)", {"job_id": "12"})
        assert problems == []
        assert hook.received[0]["event"] == "hang" and hook.received[0]["run"] == "demo"
        assert hook.received[0]["details"] == {"job_id": "12"} and "hang" in hook.received[0]["text"]
        mail = smtp.messages[0]
        assert mail["from"] == "runctl@cluster" and mail["to"] == ["oncall@team", "lead@team"]
        assert "Subject: [demo] hang: job 12" in mail["data"]
    finally:
        hook.close()
        smtp.close()


def test_events_filter():
    hook = WebhookServer()
    try:
        cfg = make_config(notifications={"webhook": hook.url, "events": ["crash_loop"]})
        assert notify(cfg.notifications, "demo", "restart", "x") == []
        assert notify(cfg.notifications, "demo", "crash_loop", "y") == []
        assert hook.kinds() == ["crash_loop"]
    finally:
        hook.close()


def test_unreachable_servers_are_reported_not_raised():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    cfg = make_config(notifications={"webhook": f"http://127.0.0.1:{port}/hook", "timeout_seconds": 2, "email": {
        "smtp_host": "127.0.0.1", "smtp_port": port, "sender": "a@b", "to": ["c@d"]}})
    problems = notify(cfg.notifications, "demo", "failure", "boom")
    print(problems)
    assert len(problems) == 2 and "webhook" in problems[0] and "email" in problems[1]


def test_a_newline_in_a_message_still_sends_the_email():
    """A kill reason or srun's output with a newline once made EmailMessage raise on the header."""
    smtp = SMTPServer()
    try:
        cfg = make_config(notifications={"email": {
            "smtp_host": "127.0.0.1", "smtp_port": smtp.port, "sender": "runctl@cluster", "to": ["oncall@team"]}})
        problems = notify(cfg.notifications, "demo", "kill", "stopped: loss spike\nBcc: everyone@corp", {})
        assert problems == [] and len(smtp.messages) == 1
        headers = smtp.messages[0]["data"].split("\r\n\r\n", 1)[0].split("\n\n", 1)[0]
        assert "Subject: [demo] kill: stopped: loss spike Bcc: everyone@corp" in headers
        assert "\nBcc:" not in headers
    finally:
        smtp.close()
