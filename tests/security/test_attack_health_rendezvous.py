"""The health check's rendezvous store (a TCPStore) accepted anyone on the
node, and one `delete_key("reg/2")` by another user made a good node look unhealthy.

The ranks are the real all-reduce check (trainer.health.rendezvous.check_allreduce: TCPStore,
gloo) run as the owner in forked children, with an 8 s check timeout instead of the config's 30 s
minimum (CI time); the job folder is in a setgid team directory and made under umask 002.
"""

from __future__ import annotations

import datetime
import json
import socket
import time
from pathlib import Path

import torch.distributed  # noqa: F401 - imported before any fork
from attack_env import as_user, start_as
from torch.distributed import PrefixStore, TCPStore

from trainer.health.__main__ import private_dir
from trainer.health.rendezvous import Deadlines, Layout, Stage, check_allreduce
from trainer.health.secret import token_file

TIMEOUT = 8.0
JOB, STEP = "77", "0"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_ranks(team, health_dir: Path, world: int, port: int, late: dict[int, float]) -> list:
    """`world` ranks of one check step, as the owner; rank r starts late[r] seconds late."""
    started = time.monotonic()

    def rank(r: int):
        def run():
            # A forked child of a process whose OpenMP pool ran (the model tests' bf16 matmuls)
            # blocks in the pool's barrier at its first parallel op: this child computes alone.
            torch.set_num_threads(1)
            time.sleep(late.get(r, 0.0))
            layout = Layout(r, world, f"n{r + 1}", JOB, STEP, "127.0.0.1", port)
            deadlines = Deadlines.from_timeout(started, TIMEOUT)
            return check_allreduce(layout, True, "gloo", deadlines, health_dir, Stage())

        return run

    return [start_as(team.owner, rank(r), umask=0o002) for r in range(world)]


def connect(port: int, wait: float = 5.0) -> TCPStore:
    deadline = time.monotonic() + wait
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert time.monotonic() < deadline, "rank 0's store never opened"
            time.sleep(0.02)
    return TCPStore(
        "127.0.0.1", port, None, False, timeout=datetime.timedelta(seconds=5), wait_for_workers=False
    )


def delete_until(store, stops: dict[str, str], limit: float) -> dict[str, int]:
    """Delete each key of `stops` whenever it is there, until its stop key appears (or the store
    goes away, or `limit` seconds). Returns how many times each was deleted."""
    deleted, end = dict.fromkeys(stops, 0), time.monotonic() + limit
    try:
        while time.monotonic() < end:
            going = [key for key, stop in stops.items() if not store.check([stop])]
            if not going:
                break
            for key in going:
                deleted[key] += bool(store.delete_key(key))
            time.sleep(0.01)
    except Exception:  # noqa: BLE001 - rank 0 closed its store: the check is over
        pass
    return deleted


def health_dir_of(team, shared_run) -> Path:
    paths = shared_run(team_dir=True)
    health_dir = paths.job_dir(JOB) / "health"
    made, out = as_user(
        team.owner, lambda: (health_dir.parent.mkdir(parents=True), private_dir(health_dir)), umask=0o002
    )
    assert not isinstance(made, BaseException), out
    return health_dir


def test_another_user_cannot_delete_a_registration_nor_forge_the_roster(team, shared_run):
    health_dir = health_dir_of(team, shared_run)
    port = free_port()
    ranks = start_ranks(team, health_dir, 3, port, late={2: 1.0})  # rank 2 late: the attack has time

    def attack():  # the outsider reaches the port and names the keys the code uses
        store = connect(port)
        forged = {"members": [0, 2], "joined": {"0": "n1", "2": "n3"}, "missing": [1], "attributed": True}
        store.set("roster", json.dumps({**forged, "job_id": JOB, "step_id": STEP}))  # "n2 never came"
        return delete_until(store, {"reg/1": "(until the store closes)"}, limit=0.7 * TIMEOUT)

    attacker = start_as(team.outsider, attack)
    checks = [rank.result(timeout=2 * TIMEOUT)[0] for rank in ranks]
    attacker.result(timeout=2 * TIMEOUT)
    assert not getattr(checks[1], "fails_node", False), f"n2 blamed: {checks[1]}"
    for r, check in enumerate(checks):
        assert check.ok and "all-reduce of 1 MiB over 3 node(s)" in check.detail, (r, check)
    for user in (team.outsider, team.oncall):
        secret, _ = as_user(user, token_file(health_dir, JOB, STEP).read_text)
        assert isinstance(secret, PermissionError), f"{user} read the rendezvous token"


def test_a_lost_registration_is_asked_again_and_never_blamed(team, shared_run):
    """Someone who knows the token (here the owner's own process: the store losing keys) deletes
    n2's registration until rank 0 asks again, and n4's for good: n2 registers again and joins;
    n4 is missing from the roster but is not blamed, since its own registration went through."""
    health_dir = health_dir_of(team, shared_run)
    port = free_port()
    ranks = start_ranks(team, health_dir, 4, port, late={1: 1.0, 3: 1.0})  # after the loser is ready

    def lose():
        store = connect(port)
        path = token_file(health_dir, JOB, STEP)
        while not path.exists():
            time.sleep(0.01)
        keys = PrefixStore(f"health/{path.read_text()}/", store)
        return delete_until(keys, {"reg/1": "retry", "reg/3": "roster"}, TIMEOUT)

    loser = start_as(team.owner, lose)
    checks = [rank.result(timeout=2 * TIMEOUT)[0] for rank in ranks]
    deleted, out = loser.result(timeout=2 * TIMEOUT)
    # Both lost, n4's twice (its first registration, and again when asked). The checks say which
    # side of the race lost if not: n4 missing the retry, or the deleter too slow for rank 0.
    assert deleted["reg/1"] >= 1 and deleted["reg/3"] >= 2, (deleted, out, [(c.ok, c.detail) for c in checks])
    for r in (0, 1, 2):
        assert checks[r].ok and "all-reduce of 1 MiB over 3 node(s)" in checks[r].detail, (r, checks[r])
    assert "rank 3 did not register" in checks[0].detail, checks[0]  # rank 0 names it (no SLURM names here)
    assert not checks[3].ok and not checks[3].fails_node, checks[3]
    assert "not attributable to this node" in checks[3].detail, checks[3]
