"""Notifications through apprise: Slack, Teams, PagerDuty, Matrix, e-mail, JSON webhooks and a
hundred more services from one URL scheme (https://github.com/caronc/apprise/wiki).

Where notifications go (config `notifications`), by the kind's severity (page, chat or info:
orchestrator/contract/severity.py, the one table):
- `page`: apprise URLs that get pages only (a person must act: PagerDuty, Opsgenie ...);
- `chat`: apprise URLs that get chat and pages (the team's channel);
- `urls`: apprise URLs that get everything, e.g. `slack://T000/B000/XXXX`, `msteams://...`, `pagerduty://KEY@APIKEY`,
  `matrix://user:pass@host/#room`, `mailtos://user:pass@smtp.example.org?to=oncall@example.org`,
  an SMTP relay without login as `mailto://relay:25?from=a@example.org&to=b@example.org`, a plain
  JSON receiver as `json://host:port/path` (apprise's POST: "title", "message", "type").
The title is `[run] kind: message` on one line; the message is the text and the details' lines.

A notification that fails is reported (returned; the caller writes it to events.jsonl), never
raised: a flaky chat server must not stop the controller that keeps a 384-GPU run alive.

A notification URL is a secret (whoever has it can post: Slack and Teams put the token in the
path, PagerDuty and Matrix in the user and host parts), and events.jsonl and controller.log are
read by every operator. So a problem names a destination only by `redact_url` (the scheme, plus
the host for the services whose host is a server), apprise's own log is captured per call and
scrubbed of every part of the URL, and nothing of apprise's reaches the process's logging.
"""

from __future__ import annotations

import re
import urllib.parse
from typing import Any

from orchestrator.contract.severity import Severity, severity_of
from orchestrator.plan.config.notify_urls import SERVER_SCHEMES, apprise_quiet, redact_url

# What the lowest severity each list takes: a destination gets that severity and every higher one.
ROUTES = (("page", Severity.PAGE), ("chat", Severity.CHAT), ("urls", Severity.INFO))


def destinations(settings: Any, kind: str) -> list[tuple[str, str]]:
    """(how a problem names it, apprise URL) of each destination of one notification: the `page`,
    `chat` and `urls` lists its severity reaches (a URL in two lists gets it once)."""
    severity = severity_of(kind)
    found: list[tuple[str, str]] = []
    for key, lowest in ROUTES:
        if severity.rank >= lowest.rank:
            found += [
                (redact_url(url) if key == "urls" else f"{key} {redact_url(url)}", url)
                for url in getattr(settings, key, None) or []
                if url not in {u for _, u in found}
            ]
    return found


def notify(
    settings: Any, run_name: str, kind: str, message: str, details: dict[str, Any] | None = None
) -> list[str]:
    """Send `kind` (a key of contract.severity.SEVERITY) where its severity is routed. Returns the
    problems (empty when every destination got it)."""
    if settings is None or kind not in (settings.events or []):
        return []
    title = " ".join(f"[{run_name}] {kind}: {message}".split())[:160]  # one line: an e-mail subject
    body = "\n".join([message, *(f"{key}: {value}" for key, value in (details or {}).items())])
    problems = []
    for label, url in destinations(settings, kind):
        why = _send(url, title, body, kind, settings.timeout_seconds)
        if why:
            problems.append(f"{label}: {why}")
    return problems


def _send(url: str, title: str, body: str, kind: str, timeout: float) -> str | None:
    """One destination; the scrubbed reason when it failed."""
    import apprise  # noqa: PLC0415 - slow-ish import, only when notifying

    sender = apprise.Apprise()
    with apprise_quiet():
        added = sender.add(url)
    if not added:
        return "not a URL apprise knows (see https://github.com/caronc/apprise/wiki)"
    notify_type = {
        Severity.PAGE: apprise.NotifyType.FAILURE,
        Severity.CHAT: apprise.NotifyType.WARNING,
        Severity.INFO: apprise.NotifyType.INFO,
    }[severity_of(kind)]
    try:
        with apprise_quiet():
            result = sender.notify(body=body, title=title, notify_type=notify_type, timeout=timeout)
    except Exception as exc:  # an apprise bug must not stop the controller
        return _scrub(f"{type(exc).__name__}: {exc}", url)
    if result:
        return None
    reasons = "; ".join(entry.message for entry in result.logs())[:500] or "not delivered"
    return _scrub(reasons, url)


def _scrub(text: str, url: str) -> str:
    """Remove the URL and every part of it that may be a secret (path, query, user, password, and
    the host of a service whose host is a token) from a message, in any letter case."""
    try:
        parts = urllib.parse.urlsplit(url)
        pieces = [url, parts.path, parts.query, parts.username or "", parts.password or ""]
        pieces += [p for p in parts.path.split("/") if len(p) >= 6]
        if parts.scheme not in SERVER_SCHEMES:
            pieces += [parts.netloc, *re.split(r"[@:]", parts.netloc)]
        pieces += [urllib.parse.quote(p, safe="") for p in pieces if p]
    except ValueError:
        pieces = [url]
    for secret in sorted({s for s in pieces if s and s != "/"}, key=len, reverse=True):
        text = re.sub(re.escape(secret), "<redacted>", text, flags=re.IGNORECASE)
    return text
