"""FedGKT's server math (FedGKT paper, Algorithm 1, the server's part): train the server's model on the
clients' features with CE plus distillation toward the clients' logits, and score it.

Plain functions on arrays and one torch module, tested without Flower.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from pflower.models.gkt import kd_loss
from pflower.models.optim import Optimizer


def train_server_head(
    head: nn.Module,
    optimizer: Optimizer,
    features: np.ndarray,
    labels: np.ndarray,
    client_logits: np.ndarray,
    generator: torch.Generator,
    *,
    epochs: int,
    batch_size: int,
    alpha: float,
    temperature: float,
) -> float:
    """``epochs`` passes over the samples in an order drawn from ``generator``: each batch's loss is
    CE(head(h), y) + alpha x KD(head(h), the client's logits). Returns the mean batch loss."""
    h = torch.as_tensor(features, dtype=torch.float32)
    y = torch.as_tensor(labels, dtype=torch.int64)
    z = torch.as_tensor(client_logits, dtype=torch.float32)
    if len(y) == 0:
        return float("nan")
    head.train()
    total, batches = 0.0, 0
    for _ in range(int(epochs)):
        order = torch.randperm(len(y), generator=generator)
        for start in range(0, len(y), int(batch_size)):
            idx = order[start : start + int(batch_size)]
            logits = head(h[idx])
            loss = F.cross_entropy(logits, y[idx])
            if alpha > 0:
                loss = loss + alpha * kd_loss(logits, z[idx], temperature)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += float(loss.detach())
            batches += 1
    head.eval()
    return total / max(batches, 1)


@torch.no_grad()
def head_logits(head: nn.Module, features: np.ndarray) -> np.ndarray:
    """The server model's logits of ``features`` [N, D] (evaluation mode), float32 [N, C]."""
    head.eval()
    return head(torch.as_tensor(features, dtype=torch.float32)).numpy().astype(np.float32)


def head_accuracy(head: nn.Module, features: np.ndarray, labels: np.ndarray) -> int:
    """How many of ``features`` the server model classifies as ``labels``."""
    if len(labels) == 0:
        return 0
    return int((head_logits(head, features).argmax(1) == np.asarray(labels)).sum())
