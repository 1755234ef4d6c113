"""FedProto (Tan et al., AAAI 2022): no weights travel; each client keeps its own model, of any
architecture ending in the shared feature width, and the server averages the class prototypes
of each round's replies into the global prototypes it sends to the next round's clients (its
role: :mod:`pflower.client_app.roles.fedproto`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from typing_extensions import override

from pflower.client_app.roles.fedproto import PROTO, FedProtoArgs
from pflower.protocol.options import option

from .base.hooks import MethodTraits, Uplink
from .base.strategy import PersonalizedStrategy
from .base.validation import ClientUpdate
from .felo import shared_feature_width

WEIGHTINGS = ("clients", "examples")


def aggregate_prototypes(
    protos: Sequence[np.ndarray], counts: Sequence[np.ndarray], weighting: str = "clients"
) -> tuple[np.ndarray, np.ndarray]:
    """The global prototypes [C, D] and the known-class mask [C] from the replies' class means
    ``protos`` (each [C, D]) and class counts ``counts`` (each [C]): per class, the mean over the
    replies holding it, each alike (``clients``: the three codes) or by its examples of the class
    (``examples``); zero rows, mask 0, for a class no reply holds."""
    s = np.stack([np.asarray(p, np.float64) for p in protos])  # [R, C, D]
    n = np.stack([np.asarray(c, np.float64) for c in counts])  # [R, C]
    w = (n > 0).astype(np.float64) if weighting == "clients" else n
    total = w.sum(0)  # [C]
    mean = np.einsum("rc,rcd->cd", w, s) / np.maximum(total, 1e-12)[:, None]
    known = total > 0
    return np.where(known[:, None], mean, 0.0).astype(np.float32), known.astype(np.uint8)


@dataclass(frozen=True)
class FedProtoOptions(FedProtoArgs):
    """FedProto's options (``method.<name>=``, keywords of ``FedProto(...)``); the client's are
    :class:`~pflower.client_app.roles.fedproto.FedProtoArgs`."""

    weighting: str = option(
        "clients",
        "clients: each reply holding a class alike (the authors' code, FL-bench, PFLlib) | examples: by its "
        "examples of the class",
        choices=WEIGHTINGS,
    )


class FedProto(PersonalizedStrategy):
    """Class prototypes instead of weights (options: :class:`FedProtoOptions`)."""

    name = "fedproto"
    options_type = FedProtoOptions
    traits = MethodTraits(
        role="fedproto",
        heterogeneous=True,
        linear_head=True,  # the features are the classifier's input
        # no group models: each client keeps its own, scored on the global test set at the end
        clients_evaluate_on_public=True,
        state=("prototypes", "known"),
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.feature_dim = shared_feature_width(self.model.schemas, self.name)
        schema = self.model.schema()
        self.num_classes = int(schema.template[schema.group_keys[schema.groups[-1]][0]][0][0])
        self.prototypes = np.zeros((self.num_classes, self.feature_dim), np.float32)
        self.known = np.zeros(self.num_classes, np.uint8)

    @override
    def personal_groups(self, client_id: int, server_round: int) -> list[str]:
        return list(self.model.schema(client_id).groups)  # every group stays on its client

    @override
    def role_config(self, client_id: int, server_round: int) -> dict[str, Any]:
        return {"feature_dim": self.feature_dim}

    @override
    def extra_downlinks(
        self, client_ids: Sequence[int], server_round: int, task: str = "train"
    ) -> dict[int, dict[str, np.ndarray]]:
        """The global prototypes, to train against and (``inference=prototype``) to predict with."""
        down = {PROTO + "S": self.prototypes, PROTO + "M": self.known} if self.known.any() else {}
        return {cid: dict(down) for cid in client_ids}

    @override
    def uplink(self, client_id: int, server_round: int) -> Uplink:
        c, d = self.num_classes, self.feature_dim
        extra = {PROTO + "s": ((c, d), np.dtype(np.float32)), PROTO + "n": ((c,), np.dtype(np.int64))}
        return replace(super().uplink(client_id, server_round), extra=extra)

    @override
    def aggregate(self, server_round: int, updates: Sequence[ClientUpdate]) -> dict[str, Any]:
        """This round's replies make the global prototypes (the last round's are replaced)."""
        record = super().aggregate(server_round, updates)
        if updates:
            ordered = sorted(updates, key=lambda u: u.client_id)
            self.prototypes, self.known = aggregate_prototypes(
                [u.extra[PROTO + "s"] for u in ordered], [u.extra[PROTO + "n"] for u in ordered], self.options.weighting
            )
        record.update({"known_classes": int(self.known.sum()), "log_keys": ["known_classes"]})
        return record
