"""The pflower ClientApp (component ``client_app.app:app``)."""

from __future__ import annotations

import functools

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from pflower.logs import quiet_flower_logs

from .failures import one_line_failures
from .runtime import handle_evaluate, handle_hello, handle_train

quiet_flower_logs()  # in Ray's actors and SuperNodes' ClientApp processes too
app = ClientApp()


# a setting of the user's that cannot work (``user_error``) is one line in the server's log, its
# traceback in a file on this machine; any other failure reaches Flower as before
@app.query()
@functools.partial(one_line_failures, only_user_errors=True)
def query(msg: Message, context: Context) -> Message:
    return handle_hello(msg, context)


@app.train()
@functools.partial(one_line_failures, only_user_errors=True)
def train(msg: Message, context: Context) -> Message:
    return handle_train(msg, context)


@app.evaluate()
@functools.partial(one_line_failures, only_user_errors=True)
def evaluate(msg: Message, context: Context) -> Message:
    return handle_evaluate(msg, context)
