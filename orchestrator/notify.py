"""Notifications: a JSON POST to a webhook and/or an email over SMTP, as the config says.

A notification that fails is logged (returned and written to events.jsonl by the caller), never
raised: a flaky chat server must not stop the controller that keeps a 384-GPU run alive.

A webhook URL is a secret (whoever has it can post to the channel: Slack and Teams put the token in
the path), and events.jsonl is readable by every operator: a problem names the webhook only by its
scheme and host (`redact_url`), and the exception text is scrubbed of the URL too.
"""

from __future__ import annotations

import json
import smtplib
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from email.message import EmailMessage
from typing import Any


def notify(
    settings: Any, run_name: str, kind: str, message: str, details: dict[str, Any] | None = None
) -> list[str]:
    """Send `kind` (failure, hang, restart, kill, crash_loop, finish, disk) where configured.

    Returns the list of problems (empty when everything that was configured got through).
    """
    if settings is None or kind not in (settings.events or []):
        return []
    payload = {
        "run": run_name,
        "event": kind,
        "message": message,
        "time": time.time(),
        "host": socket.gethostname(),
        "details": details or {},
    }
    problems: list[str] = []
    if settings.webhook:
        problems += _post_webhook(settings.webhook, payload, settings.timeout_seconds)
    if settings.email is not None:
        problems += _send_email(settings.email, payload, settings.timeout_seconds)
    return problems


def redact_url(url: str) -> str:
    """scheme://host[:port]/<redacted>: enough to tell which service failed, not to post to it."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "<webhook URL redacted>"
    return f"{parts.scheme or '?'}://{host}{port}/<redacted>"


def _scrub(text: str, url: str) -> str:
    """Remove the URL (and its path and query, which hold the token) from an error message."""
    try:
        parts = urllib.parse.urlsplit(url)
        secrets = [url, parts.path, parts.query, parts.username or "", parts.password or ""]
    except ValueError:
        secrets = [url]
    for secret in sorted((s for s in secrets if s and s != "/"), key=len, reverse=True):
        text = text.replace(secret, "<redacted>")
    return text


def _post_webhook(url: str, payload: dict[str, Any], timeout: float) -> list[str]:
    # Slack-style hooks show "text"; everything else reads the structured fields.
    body = json.dumps(
        {"text": f"[{payload['run']}] {payload['event']}: {payload['message']}", **payload}
    ).encode()
    request = urllib.request.Request(
        url, data=body, headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - URL from the config
            if response.status >= 300:
                return [f"webhook {redact_url(url)}: HTTP {response.status}"]
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return [f"webhook {redact_url(url)}: {_scrub(str(exc), url)}"]
    return []


def _send_email(email: Any, payload: dict[str, Any], timeout: float) -> list[str]:
    msg = EmailMessage()
    # A header is one line: a newline in a message (a reason, srun's output) would make
    # EmailMessage raise, and the notification would be lost.
    subject = " ".join(f"[{payload['run']}] {payload['event']}: {payload['message']}".split())
    msg["Subject"] = subject[:160]
    msg["From"] = email.sender
    msg["To"] = ", ".join(email.to)
    msg.set_content(
        f"{payload['message']}\n\nrun: {payload['run']}\nevent: {payload['event']}\n"
        f"controller host: {payload['host']}\n\n{json.dumps(payload['details'], indent=2, default=str)}\n"
    )
    try:
        with smtplib.SMTP(email.smtp_host, email.smtp_port, timeout=timeout) as smtp:
            smtp.send_message(msg)
    except (smtplib.SMTPException, OSError) as exc:
        return [f"email via {email.smtp_host}:{email.smtp_port}: {exc}"]
    return []
