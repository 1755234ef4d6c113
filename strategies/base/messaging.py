"""How the server talks to the grid: push, then pull replies until all are in or the time is up."""

from __future__ import annotations

import time
from collections.abc import Iterable

from flwr.app import Message
from flwr.serverapp import Grid

# seconds a message outlives the wait for its reply: the SuperLink then drops it, so a SuperNode
# that reconnects after its round closed is not handed training whose reply would be discarded
TTL_MARGIN_S = 60.0
# How often the ServerApp asks the SuperLink for replies (seconds). Flower's own send_and_receive
# waits several times longer between pulls, so a deployment round idled after its last reply; a
# pull is one small request to the SuperLink (docs/deployment.md, "What a round costs").
REPLY_POLL_S = 0.5


def send_and_receive(grid: Grid, messages: Iterable[Message], timeout: float | None) -> list[Message]:
    """Flower's ``Grid.send_and_receive`` (push, then pull until every reply is in or the
    timeout passes), polling every :data:`REPLY_POLL_S`. Grids that only deliver synchronously
    (the in-process grid) keep their own."""
    messages = list(messages)
    try:
        pending = set(grid.push_messages(messages))
    except NotImplementedError:
        return list(grid.send_and_receive(messages, timeout=timeout))
    end = time.time() + (timeout if timeout is not None else 0.0)
    replies: list[Message] = []
    while timeout is None or time.time() < end:
        got = list(grid.pull_messages(pending))
        replies.extend(got)
        pending.difference_update(m.metadata.reply_to_message_id for m in got)
        if not pending:
            break
        time.sleep(REPLY_POLL_S)
    return replies
