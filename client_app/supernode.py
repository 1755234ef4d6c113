"""``pflower-supernode``: Flower's ``flower-supernode`` with an idle poll that is short when a
message is due and Flower's own when the node is idle.

Between two pulls that bring no message, Flower's SuperNode sleeps a fixed 3 s
(``time.sleep(3)`` in ``flwr/supernode/start_client_internal.py``, flwr 1.42 and the 1.43
nightly). In a federated round a node's next message follows its reply within about a second
(the server aggregates, then sends the next round), so that sleep adds up to 3 s to every
message on a device. This launcher runs Flower's SuperNode unchanged but for that wait: for
:data:`HOT_S` seconds after the node sent a reply (or pulled a message) it polls every
:data:`FAST_S`; after that, every :data:`IDLE_S` (Flower's 3 s). Same flags as
``flower-supernode``. (Flower's loop pulls a message, then waits in ``_push_messages`` until
the ClientApp's reply is sent, so the window starts when the reply has left.)

What it costs the SuperLink: an idle node sends one pull every 3 s, as before; a node in a
round, one every 0.25 s for the 10 s after each reply (4 a second, then back to one every 3 s).

``--heartbeat-interval S`` (pflower's one flag; 10-1800 s, Flower's own 30 s when absent): how
often the node tells the SuperLink it is alive. The SuperLink marks a node offline after two
intervals without one, so a device that dies is noticed after 2 S (60 s with Flower's 30), and a
node restarted after a crash is let in again only then. A shorter interval costs one small
request every 0.8 (S - 5) s per node.

``--steady-poll`` keeps Flower's 3 s wait at all times (only the heartbeat flag then acts): for
nodes that share their host's cores with each other and the SuperLink (a demo or test bench on
one machine), where four pulls a second from every node compete with the training (measured in
docs/deployment.md, "Polling": no gain with three nodes on two cores).
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pflower import compat

HOT_S = 10.0  # how long after a pulled message the node keeps polling fast
FAST_S = 0.25  # the wait between pulls then
IDLE_S = 3.0  # the wait when idle: Flower's own
FLOWER_IDLE_S = 3  # the value Flower passes to time.sleep between empty pulls


class AdaptivePoll:
    """Stands in for the loop module's ``time``: its ``sleep(3)`` (Flower's idle wait) becomes
    :data:`FAST_S` while a message came within :data:`HOT_S`, else :data:`IDLE_S`; every other
    call goes to the real ``time``. ``pulled()`` marks a message's arrival."""

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, sleeper: Callable[[float], None] = time.sleep
    ) -> None:
        self.clock, self.sleeper = clock, sleeper
        self.hot_until = clock() + HOT_S  # a node that just started may be handed a message soon
        self.waits: list[float] = []  # every idle wait taken (for the tests and a benchmark)

    def pulled(self) -> None:
        self.hot_until = self.clock() + HOT_S

    def sleep(self, seconds: float) -> None:
        if seconds == FLOWER_IDLE_S:
            seconds = FAST_S if self.clock() < self.hot_until else IDLE_S
            self.waits.append(seconds)
        self.sleeper(seconds)

    def __getattr__(self, name: str) -> Any:  # time.time, time.monotonic...: the real ones
        return getattr(time, name)


def install(poll: AdaptivePoll | None = None) -> AdaptivePoll:
    """Put the adaptive poll into Flower's SuperNode loop (this process only)."""
    loop = compat.supernode_loop()
    poll = poll or AdaptivePoll()
    pull, push = loop.pull, loop.push

    def pull_and_mark(*args: Any, **kwargs: Any) -> Any:
        run_id = pull(*args, **kwargs)
        if run_id is not None:
            poll.pulled()
        return run_id

    def push_and_mark(*args: Any, **kwargs: Any) -> Any:
        try:
            return push(*args, **kwargs)
        finally:
            poll.pulled()  # the reply has left: the round's next message is due soon

    loop.module.time = poll
    loop.module._pull_and_store_message = pull_and_mark
    loop.module._push_messages = push_and_mark
    return poll


HEARTBEAT_FLAG = "--heartbeat-interval"


def split_heartbeat(argv: list[str]) -> tuple[float | None, list[str]]:
    """Take ``--heartbeat-interval S`` (or ``=S``) out of the command line: (S or None, the rest,
    which is ``flower-supernode``'s). A value the SuperLink would refuse stops here, naming the range."""
    from pflower.client_app.forkserver import take_option

    hb = compat.supernode_heartbeat()
    values, rest = take_option(argv, [HEARTBEAT_FLAG], f"seconds between {hb.low} and {hb.high}", "pflower-supernode")
    if not values:
        return None, rest
    value = values[-1]
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not hb.low <= seconds <= hb.high:
        raise SystemExit(
            f"pflower-supernode: {HEARTBEAT_FLAG} {value!r}: give seconds between {hb.low} and {hb.high} "
            "(the SuperLink refuses others; Flower's default is 30)"
        )
    return seconds, rest


def set_heartbeat(seconds: float) -> None:
    """Make this process's SuperNode announce and send heartbeats every ``seconds``."""
    hb = compat.supernode_heartbeat()
    for module in hb.modules:
        setattr(module, hb.name, seconds)


STEADY_FLAG = "--steady-poll"


def accepted_marker(argv: list[str]) -> Path:
    """The file that says this node's key was accepted by this SuperLink before (written at its first
    pull): ``$XDG_CACHE_HOME/pflower/supernodes/<sha of the key's path and the SuperLink address>``."""
    from pflower.client_app.forkserver import take_option

    keys = take_option(argv, ["--auth-supernode-private-key"], "the node's private key file", "pflower-supernode")[0]
    links = take_option(argv, ["--superlink"], "the SuperLink's address", "pflower-supernode")[0]
    key, link = (keys or ["no-key"])[-1], (links or ["127.0.0.1:9092"])[-1]
    digest = hashlib.sha256(f"{Path(key).expanduser().resolve()}|{link}".encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "pflower" / "supernodes" / digest


def refusal_diagnosis(accepted_before: bool, heartbeat_s: float) -> str:
    """What a refused activation ("[code: 2004] Failed to activate SuperNode", exit code 305) means
    for this node. Flower says the same for two causes the node can tell apart by its own history:
    a key never accepted (not registered: the SuperLink's log says "No SuperNode found with the
    given public key") and a node restarted after a kill, which the SuperLink still lists online
    until it misses two heartbeats."""
    if accepted_before:
        return (
            "pflower-supernode: this node's key was accepted by this SuperLink before, so it is most likely a "
            "restart after a crash or kill: the SuperLink lets the node in again once it has missed two heartbeats "
            f"(up to {2 * heartbeat_s:g} s after the node died); start it again then, or run it under a supervisor "
            "that restarts it (systemd Restart=on-failure, compose restart: unless-stopped)"
        )
    return (
        "pflower-supernode: this node's key was never accepted by this SuperLink: most likely it is not registered; "
        "register its public key (`flwr supernode register <key.pub> <superlink>`; the SuperLink's log then no "
        "longer says 'No SuperNode found with the given public key'). If it was accepted from another machine or "
        f"cache before, it may instead be a restart: wait {2 * heartbeat_s:g} s and start it again"
    )


class DiagnoseRefusal(logging.Filter):
    """Adds :func:`refusal_diagnosis` to Flower's exit message of a refused activation."""

    def __init__(self, marker: Path, heartbeat_s: float) -> None:
        super().__init__()
        self.marker, self.heartbeat_s = marker, heartbeat_s

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage() if isinstance(record.msg, str) else ""
        if text.startswith("Exit Code: 305") and "Failed to activate SuperNode" in text:
            record.msg, record.args = text + "\n" + refusal_diagnosis(self.marker.exists(), self.heartbeat_s), ()
        return True


def remember_acceptance(marker: Path) -> None:
    """Write ``marker`` at the node's first pull: its activation went through."""
    loop = compat.supernode_loop()
    pull = loop.module._pull_and_store_message

    def pull_and_remember(*args: Any, **kwargs: Any) -> Any:
        result = pull(*args, **kwargs)
        if not marker.exists():
            try:
                marker.parent.mkdir(parents=True, exist_ok=True)
                marker.write_text("accepted\n")
            except OSError:
                pass
        return result

    loop.module._pull_and_store_message = pull_and_remember


def main() -> None:
    """``pflower-supernode [--heartbeat-interval S] [--steady-poll]``: ``flower-supernode`` with
    :func:`install`'s poll (unless ``--steady-poll``) and the heartbeat interval given."""
    seconds, args = split_heartbeat(sys.argv[1:])
    steady = STEADY_FLAG in args
    sys.argv[1:] = [a for a in args if a != STEADY_FLAG]
    if seconds is not None:
        set_heartbeat(seconds)
    if not steady:
        install()
    marker = accepted_marker(sys.argv[1:])
    remember_acceptance(marker)
    compat.FLOWER_LOGGER.addFilter(DiagnoseRefusal(marker, seconds or 30.0))
    compat.supernode_loop().flower_supernode()
