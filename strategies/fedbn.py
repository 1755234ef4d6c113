"""FedBN (Li et al., ICLR 2021): FedAvg in which BatchNorm parameters and statistics never leave a client.

BN running statistics stay local for every pflower method; FedBN also keeps the BN affine
parameters (gamma, beta), which sit inside the conv groups, so they are personal *keys*
(:meth:`PersonalizedStrategy.personal_keys`), not a personal group. A model without BN
(VGG11) makes FedBN plain FedAvg.
"""

from __future__ import annotations

from logging import WARNING
from typing import Any

from flwr.common import log
from torch import nn

from models import LayeredNet

from .base import PersonalizedStrategy


def batchnorm_keys(model: LayeredNet) -> list[str]:
    """State-dict keys of the trainable parameters of every BatchNorm layer, in forward order."""
    return [
        f"{name}.{pname}"
        for name, module in model.named_modules()
        if isinstance(module, nn.modules.batchnorm._BatchNorm)
        for pname, p in module.named_parameters(recurse=False)
        if p.requires_grad
    ]


class FedBN(PersonalizedStrategy):
    name = "fedbn"

    def __init__(self, model: LayeredNet, *args: Any, **kwargs: Any) -> None:
        super().__init__(model, *args, **kwargs)
        self.bn_keys = batchnorm_keys(model)
        if not self.bn_keys:
            log(WARNING, "FedBN: the model has no BatchNorm layer; FedBN is FedAvg here")

    def personal_keys(self, client_id: int, server_round: int) -> list[str]:
        return list(self.bn_keys)
