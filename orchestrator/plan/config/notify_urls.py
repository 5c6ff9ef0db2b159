"""What a notification destination of the config is: apprise's URL scheme, checked before the run
(the pre-flight names the key of every URL apprise cannot send to) and redacted wherever a problem
names it. A notification URL is a secret (whoever has it can post), and the events and logs that
name a destination are read by every operator, so only `redact_url`'s form is ever shown.
Sending is the controller's (orchestrator/controller/notify.py).
"""

from __future__ import annotations

import contextlib
import logging
import urllib.parse
from collections.abc import Iterator
from typing import Any

# Services whose URL host is a server's name, not a token: the redacted form keeps it.
SERVER_SCHEMES = ("http", "https", "json", "jsons", "mailto", "mailtos", "xml", "xmls", "form", "forms")
# The config's lists of apprise URLs (notifications.page, .chat, .urls).
URL_LISTS = ("page", "chat", "urls")


@contextlib.contextmanager
def apprise_quiet() -> Iterator[None]:
    """Nothing apprise logs reaches the process's handlers (its messages may hold a URL); what a
    failed send says comes back through its result and is scrubbed."""
    log = logging.getLogger("apprise")
    propagate, log.propagate = log.propagate, False
    try:
        yield
    finally:
        log.propagate = propagate


def apprise_knows(url: str) -> bool:
    """apprise parses `url` into a service with at least one target (an e-mail whose addresses it
    refuses, e.g. `ops@team` without a dotted domain, has none)."""
    import apprise  # noqa: PLC0415

    with apprise_quiet():
        service = apprise.Apprise.instantiate(url, suppress_exceptions=True)
    return service is not None and len(service) > 0


def unknown_urls(settings: Any, run_name: str = "run") -> list[str]:
    """What apprise cannot send to, redacted, naming the config key (for the pre-flight)."""
    problems = [
        f"notifications.{key}: {redact_url(url)} is not a URL apprise knows (see "
        "https://github.com/caronc/apprise/wiki)"
        for key in URL_LISTS
        for url in getattr(settings, key, None) or []
        if not apprise_knows(url)
    ]
    return problems


def redact_url(url: str) -> str:
    """scheme://host[:port]/<redacted> for services whose host is a server, scheme://<redacted>
    for the others (slack://TOKEN/..., pagerduty://KEY@APIKEY): enough to tell which destination
    failed, not to post to it."""
    try:
        parts = urllib.parse.urlsplit(url)
        scheme = parts.scheme or "?"
        if scheme not in SERVER_SCHEMES:
            return f"{scheme}://<redacted>"
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "<notification URL redacted>"
    return f"{scheme}://{host}{port}/<redacted>"
