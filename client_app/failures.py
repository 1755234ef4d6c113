"""A ClientApp failure as one line: the error reply names the problem and the fix, the traceback goes to a file.

Flower turns an exception in a ClientApp into an error reply and logs its traceback; under the
simulation engine each client's failure is a Ray traceback some 90 lines long, repeated for every
client of every round, so the one line that names the fix is lost among them. pflower's handlers
catch the exception themselves: the traceback is appended to a log file on the client's machine
(:func:`log_file`), and the reply is Flower's own error reply, whose reason is the exception's
message and the file's path. The server logs it once per client, and a round in which every client
failed stops the run with that line (strategies.base.replies.ClientsFailed).
"""

from __future__ import annotations

import functools
import os
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path

from flwr.app import Context, Error, Message

from pflower.compat import ErrorCode
from pflower.protocol import wire

Handler = Callable[[Message, Context], Message]


def log_file(context: Context) -> Path:
    """Where a node's ClientApp tracebacks go: ``$TMPDIR/pflower-clientapp-<run id>.log`` (one file
    per run on each machine; the reason of each error reply names it)."""
    return Path(tempfile.gettempdir()) / f"pflower-clientapp-{context.run_id}.log"


def error_line(exc: BaseException) -> str:
    """The reply's reason: a pflower error that is the user's to fix (``user_error``) is its own
    message; any other exception its type and message."""
    text = str(exc).strip() or repr(exc)
    return text if getattr(exc, "user_error", False) else f"{type(exc).__name__}: {text}"


def reply_with_error(msg: Message, context: Context, exc: BaseException) -> Message:
    """Append ``exc``'s traceback to the log file; Flower's error reply naming the file."""
    path = log_file(context)
    where = ""
    try:
        with path.open("a", encoding="utf-8") as f:
            f.write(
                f"--- node {context.node_id}, {msg.metadata.message_type} message of round "
                f"{_round(msg)} (pid {os.getpid()})\n{''.join(traceback.format_exception(exc))}\n"
            )
        where = f" (traceback: {path})"
    except OSError:
        pass
    return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=f"{error_line(exc)}{where}"), reply_to=msg)


def _round(msg: Message) -> str:
    try:
        return str(msg.content.config_records[wire.CONFIG_RECORD][wire.ROUND_KEY])
    except (KeyError, AttributeError, TypeError):
        return msg.metadata.group_id or "?"


def one_line_failures(handler: Handler, only_user_errors: bool = False) -> Handler:
    """``handler`` whose exceptions become one-line error replies (their tracebacks in
    :func:`log_file`). ``only_user_errors``: other exceptions pass to Flower as before (pflower's own
    ClientApp, whose unexpected failures the deployment tests read as Flower reports them)."""

    @functools.wraps(handler)
    def wrapped(msg: Message, context: Context) -> Message:
        try:
            return handler(msg, context)
        except Exception as exc:  # noqa: BLE001 - every failure of the user's code or settings, as a reply
            if only_user_errors and not getattr(exc, "user_error", False):
                raise
            return reply_with_error(msg, context, exc)

    return wrapped
