"""The secret key prefix of the health check's rendezvous store.

A TCPStore has no authentication: anyone with a shell on a node of the job can connect to rank 0's
port (its number is predictable, rendezvous.health_port) and get, set or delete keys. One
`delete_key("reg/2")` by another user made a good node look unhealthy. So every
key lives under "health/<token>/" (a PrefixStore), where <token> is 128 random bits that only the
job's owner can read:

- rank 0 makes the token before it opens the store and writes it into the job's owner-only
  health/ folder, created O_CREAT | O_EXCL | O_NOFOLLOW with mode 0600 (a file already there, or
  a link in its place, is refused: rank 0 then cannot host the check, which blames nobody);
- every other rank reads it back from the shared filesystem once the store's port answers (rank 0
  wrote it before opening the port), through the bounded no-follow reader, and accepts it only
  from a regular file of this user, mode 0600, with one link.

Another user can still connect to the port and flood or close it: that blames nobody (the check
then fails as "not attributable to one node").
"""

from __future__ import annotations

import os
import re
import secrets
import stat
import time
from pathlib import Path
from typing import Any

from orchestrator.contract import UntrustedFileError, read_untrusted

TOKEN_BYTES = 16
TOKEN_PATTERN = re.compile(r"[0-9a-f]{32}")
POLL_SECONDS = 0.1


class TokenError(Exception):
    """The token file is missing, not this user's own, or not a token; the message says which."""


def token_file(health_dir: Path, job_id: str, step_id: str) -> Path:
    return health_dir / f".rendezvous-{job_id}.{step_id}.token"


def create_token(path: Path) -> str:
    """Rank 0: a new random token in `path` (which must not exist yet), 0600, fsynced."""
    token = secrets.token_hex(TOKEN_BYTES)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        raise TokenError(f"{path} exists already: a token is made once per check step; remove it") from None
    try:
        os.write(fd, token.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    return token


def read_token(path: Path, deadline: float) -> str:
    """Every other rank: rank 0's token, waiting for the file until `deadline` (time.monotonic)."""
    while True:
        try:
            data, info = read_untrusted(path, max_bytes=4 * TOKEN_BYTES)
            break
        except FileNotFoundError:
            if time.monotonic() >= deadline:
                raise TokenError(f"{path} did not appear: rank 0 made no token") from None
            time.sleep(POLL_SECONDS)
        except UntrustedFileError as exc:
            raise TokenError(str(exc)) from None
    if info.st_uid != os.geteuid() or info.st_nlink != 1 or stat.S_IMODE(info.st_mode) & 0o077:
        raise TokenError(f"{path} is not this user's own 0600 file with one link: refusing its token")
    token = data.decode("ascii", errors="replace")
    if not TOKEN_PATTERN.fullmatch(token):
        raise TokenError(f"{path} does not hold a token")
    return token


def prefixed(store: Any, token: str) -> Any:
    """`store` seen through the secret prefix: what every rank reads and writes."""
    from torch.distributed import PrefixStore

    return PrefixStore(f"health/{token}/", store)
