"""The pflower ClientApp (component ``client_app.app:app``)."""

from __future__ import annotations

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from pflower.protocol.logs import quiet_flower_logs

from .runtime import handle_evaluate, handle_hello, handle_train

quiet_flower_logs()  # in Ray's actors and SuperNodes' ClientApp processes too
app = ClientApp()


@app.query()
def query(msg: Message, context: Context) -> Message:
    return handle_hello(msg, context)


@app.train()
def train(msg: Message, context: Context) -> Message:
    return handle_train(msg, context)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    return handle_evaluate(msg, context)
