"""pFedLA (Ma et al., CVPR 2022): layer-wised personalized FL with a hypernetwork per client.

The server stores the latest trained model w_j of every client (the initial model until the
client trains) and, for every client i, a small hypernetwork: an embedding e_i -> 3-layer MLP
-> one head per layer group l whose softmax over the N clients is alpha_i^l. Client i receives
the personalized model w~_i with, for every group l, w~_i^l = sum_j alpha_ij^l w_j^l, trains it
and sends it back (w_new). The hypernetwork of i then takes one SGD step (``hn_lr``) along
the reference algorithm's gradient <w~_i - w_new, d w~_i / d phi_i> (pFedHN's update; the
linearization of 1/2 ||w_new - w~_i(phi_i)||^2, so alpha moves toward the combination that
explains the trained model), and w_new becomes the stored w_i. BN statistics stay on the
clients. Hyper-parameters are FL-bench's defaults (hn_lr 5e-3, embedding 100, hidden 100).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from typing_extensions import override

from pflower.protocol.options import MethodOptions, option

from .base.hooks import MethodTraits
from .base.strategy import PersonalizedStrategy
from .base.validation import ClientUpdate
from .shared.aggregation import column_blocks, distinct_columns, layerwise_mix, mixing_average, normalized_weights

Arrays = Mapping[str, np.ndarray]


class HyperNetwork(nn.Module):
    """embedding -> MLP -> for each of ``num_layers`` groups a softmax over ``num_clients``."""

    def __init__(self, num_clients: int, num_layers: int, embedding_dim: int = 100, hidden_dim: int = 100) -> None:
        super().__init__()
        self.num_clients, self.num_layers = num_clients, num_layers
        self.embedding = nn.Parameter(torch.randn(embedding_dim))
        self.mlp = nn.Sequential(
            nn.Linear(embedding_dim, hidden_dim),
            nn.ReLU(),
            nn.Linear(hidden_dim, hidden_dim),
            nn.ReLU(),
            nn.Linear(hidden_dim, hidden_dim),
            nn.ReLU(),
        )
        self.heads = nn.Linear(hidden_dim, num_layers * num_clients)

    def forward(self) -> torch.Tensor:
        """alpha: [num_layers, num_clients], every row a softmax (sums to 1)."""
        logits = self.heads(self.mlp(self.embedding)).view(self.num_layers, self.num_clients)
        return torch.softmax(logits, dim=1)


def hypernet_coefficients(
    models: Sequence[Arrays], trained: Sequence[Arrays], alphas: np.ndarray, layer_keys: Sequence[Sequence[str]]
) -> tuple[np.ndarray, np.ndarray]:
    """What the hypernetwork steps of k clients need, without building their w~:
    ``coef[c, l, j] = <w~_c^l - w_new_c^l, w_j^l>`` (k x L x N) and ``||w~_c - w_new_c||^2``.

    Client c trained w~_c = layerwise_mix(models, alphas[c]) (float32, as :func:`~.shared.aggregation.layerwise_mix`
    returns it) into ``trained[c]``. One matrix product per block of parameters for all k
    clients together: O(k x N x params) in BLAS, bounded scratch.
    """
    alphas = np.asarray(alphas, dtype=np.float64)
    k, n = len(trained), len(models)
    coef, gap = np.zeros((k, len(layer_keys), n)), np.zeros(k)
    for layer, keys in enumerate(layer_keys):
        if not keys:
            continue
        rows = np.stack([normalized_weights(a) for a in alphas[:, layer]])
        columns, rows, index = distinct_columns(models, rows)
        m = len(columns)
        dtype = np.asarray(trained[0][keys[0]]).dtype
        part = np.zeros((k, m))
        for *_, block in column_blocks([*columns, *trained], list(keys), extra_rows=k):
            w = block[:m]
            diff = ((rows @ w).astype(dtype) - block[m:].astype(dtype)).astype(np.float64)
            part += diff @ w.T
            gap += np.einsum("ij,ij->i", diff, diff)
        coef[:, layer] = part[:, index]
    return coef, gap


def hypernet_update(hypernet: HyperNetwork, coef: np.ndarray, lr: float) -> None:
    """One SGD step of the loss sum_{l,j} alpha[l, j] * coef[l, j] (coef held fixed)."""
    alpha = hypernet()
    hypernet.zero_grad()
    (alpha * torch.from_numpy(np.asarray(coef)).to(alpha.dtype)).sum().backward()
    with torch.no_grad():
        for p in hypernet.parameters():
            if p.grad is not None:
                p -= lr * p.grad


def hypernet_step(
    hypernet: HyperNetwork, models: Sequence[Arrays], trained: Arrays, layer_keys: Sequence[Sequence[str]], lr: float
) -> dict[str, np.ndarray]:
    """One SGD step of ``hypernet`` for a client that trained w~ into ``trained``; returns w~.

    The loss is <w~ - w_new, w~(phi)> with the first factor held fixed: per group l,
    sum_j alpha[l, j] * <w~^l - w_new^l, w_j^l>, so only N x L inner products are needed.
    The server runs this for all of a round's clients at once (:func:`hypernet_coefficients`).
    """
    with torch.no_grad():
        alpha = hypernet().numpy()
    coef, _ = hypernet_coefficients(models, [trained], alpha[None], layer_keys)
    hypernet_update(hypernet, coef[0], lr)
    return layerwise_mix(models, alpha, layer_keys)


@dataclass(frozen=True)
class PFedLAOptions(MethodOptions):
    """PFedLA's options (``method.<name>=`` on the command line, keywords of ``PFedLA(...)``),
    checked before round 1; ``pflower methods`` lists them."""

    hn_lr: float = option(5e-3, "the hypernetwork's SGD step", above=0)
    embedding_dim: int = option(100, "width of a client's embedding", low=1)
    hidden_dim: int = option(100, "width of the hypernetwork's hidden layers", low=1)


class PFedLA(PersonalizedStrategy):
    """Per-client hypernetworks on the server weigh every client's stored model layer by layer
    (options: :class:`PFedLAOptions`)."""

    name = "pfedla"
    options_type = PFedLAOptions
    traits = MethodTraits(
        state=("models", "hypernets"),
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        o = self.options
        self.hn_lr = o.hn_lr
        self.layer_keys = [self.model.keys([g]) for g in self.model.groups]
        with torch.random.fork_rng():  # seeded, and the server's torch RNG stream is left alone
            torch.manual_seed(self.run.seed)
            self.hypernet = HyperNetwork(self.run.num_clients, len(self.model.groups), o.embedding_dim, o.hidden_dim)
            self.embeddings = torch.randn(self.run.num_clients, o.embedding_dim).numpy()  # e_i at init
        self.initial_hypernet = {k: v.detach().numpy().copy() for k, v in self.hypernet.state_dict().items()}
        self.hypernets: dict[int, dict[str, np.ndarray]] = {}  # each client's hypernetwork, once updated
        self.models: dict[int, dict[str, np.ndarray]] = {}  # latest trained model of each client

    def load_hypernet(self, client_id: int) -> HyperNetwork:
        """The shared module holding client ``client_id``'s hypernetwork parameters."""
        state = self.hypernets.get(client_id)
        if state is None:
            state = {**self.initial_hypernet, "embedding": self.embeddings[client_id]}
        self.hypernet.load_state_dict({k: torch.from_numpy(np.array(v, copy=True)) for k, v in state.items()})
        return self.hypernet

    def alpha(self, client_id: int) -> np.ndarray:
        """The client's layer-wise mixing weights over all clients' models, from its hypernetwork."""
        with torch.no_grad():
            return self.load_hypernet(client_id)().numpy()

    def all_models(self) -> list[dict[str, np.ndarray]]:
        """Every client's stored model (the global one for a client not yet trained), in client order."""
        return [self.models.get(j, self.model.global_arrays) for j in range(self.run.num_clients)]

    def downlinks(self, client_ids: Sequence[int], server_round: int) -> dict[int, dict[str, np.ndarray]]:
        """Every client's w~ = per-group mix of all stored models, one matrix product per block and group."""
        models = self.all_models()
        alphas = np.stack([self.alpha(c) for c in client_ids])
        out: dict[int, dict[str, np.ndarray]] = {c: {} for c in client_ids}
        for layer, keys in enumerate(self.layer_keys):
            if keys:
                for c, mixed in zip(client_ids, mixing_average(models, alphas[:, layer], keys=keys)):
                    out[c].update(mixed)
        return {c: {k: out[c][k] for k in self.model.keys(client_id=c)} for c in client_ids}

    @override
    def aggregate(self, server_round: int, updates: Sequence[ClientUpdate]) -> dict[str, Any]:
        models = self.all_models()  # what the round's clients were personalized from
        trained = [u for u in updates if u.arrays]
        record: dict[str, Any] = {}
        if trained:
            alphas = np.stack([self.alpha(u.client_id) for u in trained])
            coef, gap = hypernet_coefficients(models, [u.arrays for u in trained], alphas, self.layer_keys)
            for u, c in zip(trained, coef):
                hypernet = self.load_hypernet(u.client_id)
                hypernet_update(hypernet, c, self.hn_lr)
                self.hypernets[u.client_id] = {k: v.detach().numpy().copy() for k, v in hypernet.state_dict().items()}
            record["local_update_norm"] = float(np.mean(np.sqrt(gap)))
            record["self_alpha_mean"] = float(
                np.mean([self.alpha(u.client_id)[:, u.client_id].mean() for u in updates])
            )
        for u in trained:
            self.models[u.client_id] = u.arrays
        return {"stored_models": len(self.models), **record}
