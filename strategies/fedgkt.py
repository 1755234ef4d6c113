"""FedGKT (He, Annavaram, Avestimehr: "Group Knowledge Transfer: Federated Learning of Large CNNs at
the Edge", NeurIPS 2020; docs/methods/fedgkt.md): clients train small models and send the
features, logits and labels of their data; the server trains a larger model on them with
knowledge distillation and sends back its logits of each client's samples.

No weights travel client to server: a client keeps its whole model, of any architecture whose
classifier input has the federation's width D. The server keeps each client's latest features,
logits and labels and, every round, trains its model (``models/gkt.py``: an MLP on the D-wide
features) for ``server_epochs`` over all of them with CE + alpha x KD toward the clients' logits
(strategies/fedgkt_math.py). A client receives the server's logits of its own training samples
(computed by the current server model from its stored features) and the server's model, so
that it is evaluated as FedGKT is: its feature extractor followed by the server's model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from typing_extensions import override

from pflower.client_app.roles.fedgkt import GKT, FedGKTArgs
from pflower.models.gkt import server_head
from pflower.models.optim import PlainAdam
from pflower.protocol.options import option

from .base.hooks import MethodTraits, Uplink
from .base.strategy import PersonalizedStrategy
from .base.validation import ClientUpdate
from .fedgkt_math import head_accuracy, head_logits, train_server_head
from .felo import shared_feature_width

SERVER = GKT + "server/"


@dataclass(frozen=True)
class FedGKTOptions(FedGKTArgs):
    """FedGKT's options (``method.<name>=`` on the command line, keywords of ``FedGKT(...)``),
    checked before round 1; ``pflower methods`` lists them."""

    server_epochs: int = option(1, "epochs over every stored client's features per round", low=1)
    server_batch: int = option(256, "the server's batch size", low=1)
    server_lr: float = option(1.0e-3, "the server's Adam step (one optimizer for the run)", above=0)


class FedGKT(PersonalizedStrategy):
    """Group knowledge transfer between small client models and one server model (options:
    :class:`FedGKTOptions`)."""

    name = "fedgkt"
    options_type = FedGKTOptions
    traits = MethodTraits(
        role="fedgkt",
        heterogeneous=True,
        # extractor + server model on the global test set at the end
        clients_evaluate_on_public=True,
        state=("head", "head_optimizer", "knowledge"),
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        o = self.options
        self.feature_dim = shared_feature_width(self.model.schemas, self.name)
        schema = self.model.schema()
        self.num_classes = int(schema.template[schema.group_keys[schema.groups[-1]][0]][0][0])
        self.head = server_head(self.feature_dim, self.num_classes, o.hidden, seed=int(self.run.seed) + 5407)
        # torch.optim.Adam's update with a correctly rounded square root: the same bits on every CPU
        self.head_optimizer = PlainAdam(self.head.parameters(), lr=o.server_lr)
        # client id -> its latest features, logits and labels (training split)
        self.knowledge: dict[int, dict[str, np.ndarray]] = {}

    @override
    def role_config(self, client_id: int, server_round: int) -> dict[str, Any]:
        return {"feature_dim": self.feature_dim}

    @override
    def personal_groups(self, client_id: int, server_round: int) -> list[str]:
        return list(self.model.schema(client_id).groups)  # no weights travel: the client keeps its model

    # ------------------------------------------------------------------ messages
    def head_arrays(self) -> dict[str, np.ndarray]:
        """The server model's arrays, sent to the clients for their distillation term."""
        return {SERVER + k: v.detach().cpu().numpy().copy() for k, v in self.head.state_dict().items()}

    @override
    def extra_downlinks(
        self, client_ids: Sequence[int], server_round: int, task: str = "train"
    ) -> dict[int, dict[str, np.ndarray]]:
        """The server model; for training also the server's logits of each client's stored features.
        The final evaluation runs every client's extractor through the server model (sent along)."""
        head = self.head_arrays()
        if task != "train":
            return {cid: dict(head) for cid in client_ids}
        out: dict[int, dict[str, np.ndarray]] = {}
        for cid in client_ids:
            out[cid] = dict(head)
            if cid in self.knowledge:  # the server's logits of the samples it has this client's features of
                out[cid][GKT + "z"] = head_logits(self.head, self.knowledge[cid]["h"])
        return out

    @override
    def uplink(self, client_id: int, server_round: int) -> Uplink:
        up = super().uplink(client_id, server_round)
        info = self.clients.get(client_id)
        if info is None:  # not discovered yet: nothing to size its features by (it cannot be sent a message either)
            return up
        n, nt, d, c = info.num_train, info.num_test, self.feature_dim, self.num_classes
        f32, i64 = np.dtype(np.float32), np.dtype(np.int64)
        knowledge = {
            GKT + "h": ((n, d), f32),
            GKT + "z": ((n, c), f32),
            GKT + "y": ((n,), i64),
            GKT + "ht": ((nt, d), f32),
            GKT + "yt": ((nt,), i64),
        }
        return replace(up, extra=knowledge)

    # ------------------------------------------------------------------ the round
    @override
    def aggregate(self, server_round: int, updates: Sequence[ClientUpdate]) -> dict[str, Any]:
        for u in updates:
            self.knowledge[u.client_id] = {k: u.extra[GKT + k] for k in ("h", "z", "y")}
        stored = [self.knowledge[c] for c in sorted(self.knowledge)]
        o = self.options
        loss = train_server_head(
            self.head,
            self.head_optimizer,
            np.concatenate([s["h"] for s in stored]),
            np.concatenate([s["y"] for s in stored]),
            np.concatenate([s["z"] for s in stored]),
            torch.Generator().manual_seed(int(self.run.seed) * 100_003 + server_round),
            epochs=o.server_epochs,
            batch_size=o.server_batch,
            alpha=o.alpha,
            temperature=o.temperature,
        )
        record: dict[str, Any] = {"server_loss": loss, "stored_clients": len(stored), "log_keys": ["server_acc"]}
        if updates:  # the server model, as trained now, on this round's clients' test features
            correct = sum(head_accuracy(self.head, u.extra[GKT + "ht"], u.extra[GKT + "yt"]) for u in updates)
            record["server_acc"] = correct / max(sum(len(u.extra[GKT + "yt"]) for u in updates), 1)
        return record

    @override
    def run_summary(self) -> dict[str, Any]:
        accs = [r["server_acc"] for r in self.run.history if "server_acc" in r]
        return {"server_acc_last": accs[-1] if accs else None, "feature_dim": self.feature_dim}
