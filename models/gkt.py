"""FedGKT's two sides (He, Annavaram, Avestimehr: "Group Knowledge Transfer: Federated Learning of
Large CNNs at the Edge", NeurIPS 2020): the server's model on the clients' features, the
knowledge-distillation loss both sides train with, and the model a client is evaluated with
(its own feature extractor, then the server's model).

In the paper the clients' features are feature maps and the server's model a deep ResNet on
them; a pflower client's features are its classifier input (a vector of the width every
architecture shares, ``model.feature_dim``), so the server's model is a multi-layer perceptron
on that vector (``server_head``), larger than the client's one linear classifier.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn


def server_head(feature_dim: int, num_classes: int, hidden: Sequence[int], seed: int) -> nn.Sequential:
    """The server's model: Linear-ReLU for each ``hidden`` width, then the classes; initial weights
    from ``seed`` alone (the global torch stream is left as it was)."""
    state = torch.get_rng_state()
    torch.manual_seed(int(seed))
    try:
        layers: list[nn.Module] = []
        width = int(feature_dim)
        for h in hidden:
            layers += [nn.Linear(width, int(h)), nn.ReLU()]
            width = int(h)
        layers.append(nn.Linear(width, int(num_classes)))
        return nn.Sequential(*layers)
    finally:
        torch.set_rng_state(state)


def kd_loss(student: torch.Tensor, teacher: torch.Tensor, temperature: float) -> torch.Tensor:
    """T² · KL(softmax(teacher/T) ‖ softmax(student/T)), the mean over the batch (FedGKT's
    ``KL_Loss``, without its 1e-7 added to the teacher's probabilities); no gradient to the teacher."""
    t = float(temperature)
    target = F.softmax(teacher.detach() / t, dim=1)
    log_p = F.log_softmax(student / t, dim=1)
    return t * t * F.kl_div(log_p, target, reduction="batchmean")


class ExtractorThenHead(nn.Module):
    """A client's feature extractor (every group of its model but the classifier) followed by the
    server's model: what FedGKT evaluates."""

    def __init__(self, client_model: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.client_model, self.head = client_model, head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.client_model.features(x).flatten(1))
