"""``build_clientapp``: your model and your data as a ClientApp that runs any pflower method's client side.

    from pflower.client_app import build_clientapp
    from my_app.task import Net, load_data

    app = build_clientapp(model=Net, data=lambda context: load_data(
        context.node_config["partition-id"], context.node_config["num-partitions"]))

The ClientApp answers pflower's messages (the discovery query, train, evaluate) with the method's
client role, as pflower's own ClientApp does, on the user's module (adapted into layer groups,
:func:`pflower.models.adapt`) and the user's datasets (:mod:`pflower.federated_data.datasets`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from pflower.logs import quiet_flower_logs

from .failures import one_line_failures
from .runtime import handle_evaluate, handle_hello, handle_train
from .user_parts import ClientHooks, DataFn, ModelFn


def build_clientapp(
    model: ModelFn,
    data: DataFn,
    *,
    groups: Mapping[str, Sequence[str] | str] | None = None,
    num_classes: int | None = None,
) -> ClientApp:
    """A Flower ClientApp running pflower's client roles on ``model()`` and ``data(...)``.

    ``model``: a function or class returning a ``torch.nn.Module`` (gets ``in_shape`` and
    ``num_classes`` where its signature names them). ``data``: returns this client's ``(train,
    test)`` datasets or ``(images, labels)`` pairs, called with ``context``, ``client_id`` and
    ``num_clients`` where its signature names them. ``groups``: layer group -> submodule names,
    in forward order, where the top-level children are not the right groups."""
    if not callable(model) or not callable(data):
        raise TypeError("build_clientapp(model=..., data=...) takes two functions (or classes)")
    hooks = ClientHooks(model, data, groups, num_classes)
    quiet_flower_logs()
    app = ClientApp()

    # a failure (a model whose names do not match, a data function raising...) is one line in the
    # server's log, its traceback in a file on this machine (client_app.failures)
    @app.query()
    @one_line_failures
    def query(msg: Message, context: Context) -> Message:
        return handle_hello(msg, context, hooks)

    @app.train()
    @one_line_failures
    def train(msg: Message, context: Context) -> Message:
        return handle_train(msg, context, hooks)

    @app.evaluate()
    @one_line_failures
    def evaluate(msg: Message, context: Context) -> Message:
        return handle_evaluate(msg, context, hooks)

    return app
