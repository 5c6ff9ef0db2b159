"""Text another user wrote, made safe to show: one sanitiser for terminals, one for rich.

Reasons of operator requests, node reasons of the exclude list and anything else a person other
than the owner could have typed reach the on-call's terminal through `runctl events --audit`,
`runctl nodes`, `runctl status` and the live view. Raw, an ANSI escape could rewrite the screen
(clear it, fake a line, set the window title) and a newline could forge a whole audit line; in the
live view, rich markup such as `[/]` breaks the rendering.

    for_terminal(text)  control characters (C0, DEL, C1: ESC, CSI, BEL, ...) shown as \\xNN,
                        newline and tab as \\n and \\t, so one record is always one line
    for_rich(text)      for_terminal + rich.markup.escape: markup shows literally
    cap(text, n)        at most n characters, with "..." when cut

Stdlib only (rich is imported inside for_rich), so the CLI keeps starting fast.
"""

from __future__ import annotations

import re

# C0 controls, DEL and C1 controls (0x80-0x9f: a lone 0x9b is a CSI on some terminals), plus the
# Unicode line and paragraph separators and the bidi overrides that reorder what is displayed.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}
MAX_REASON_CHARS = 500


def for_terminal(value: object) -> str:
    """`value` as one printable line: no control character survives."""
    text = value if isinstance(value, str) else str(value)
    return _UNSAFE.sub(lambda m: _NAMED.get(m.group(), f"\\x{ord(m.group()):02x}"), text)


def for_rich(value: object) -> str:
    """`for_terminal`, then rich's markup escape (for Table cells and console.print)."""
    from rich.markup import escape  # noqa: PLC0415

    return escape(for_terminal(value))


def cap(text: str, limit: int = MAX_REASON_CHARS) -> str:
    return text if len(text) <= limit else text[: max(0, limit - 3)] + "..."
