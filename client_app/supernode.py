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
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from pflower.protocol import compat

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


def main() -> None:
    """``pflower-supernode``: ``flower-supernode`` with :func:`install`'s poll."""
    install()
    compat.supernode_loop().flower_supernode()
