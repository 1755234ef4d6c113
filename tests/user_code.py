"""A user's own code, as tests import it by dotted path (model=custom, dataset=custom, build_clientapp).

Nothing here knows pflower: Flower's quickstart-pytorch model, torchvision's MobileNetV3 and a
map-style dataset, the shapes a user brings.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset


class Net(nn.Module):
    """Flower's quickstart-pytorch model (LeNet-like, 3x32x32 inputs), unchanged."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = x.view(-1, 16 * 5 * 5)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


def mobilenet(num_classes: int) -> nn.Module:
    from torchvision.models import mobilenet_v3_small

    return mobilenet_v3_small(num_classes=num_classes)


class Digits32(Dataset):
    """scikit-learn's digits as 3x32x32 float tensors in [-1, 1] (the quickstart's normalisation)."""

    def __init__(self, indices: np.ndarray | None = None) -> None:
        from sklearn.datasets import load_digits

        bunch = load_digits()
        x = torch.tensor(bunch.images, dtype=torch.float32).unsqueeze(1) / 16.0
        x = F.interpolate(x, size=(32, 32), mode="bilinear", align_corners=False).repeat(1, 3, 1, 1)
        self.x, self.y = (x - 0.5) / 0.5, torch.tensor(bunch.target)
        if indices is not None:
            self.x, self.y = self.x[indices], self.y[indices]

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.x[i], int(self.y[i])


def load_digits32(size: int = 400) -> Digits32:
    """One map-style dataset, for pflower to partition (dataset.options.target=user_code:load_digits32)."""
    return Digits32(np.arange(size))


def client_digits32(client_id: int, num_clients: int | None) -> tuple[Digits32, Digits32]:
    """This client's (train, test) split of the first 400 digits (the client builder's data function)."""
    mine = np.arange(400)[client_id :: num_clients or 4]
    cut = int(len(mine) * 0.8)
    return Digits32(mine[:cut]), Digits32(mine[cut:])


class MLP(nn.Module):
    """A user's MLP for feature vectors: the shape tabular and sensor data come in."""

    def __init__(self, in_shape: tuple[int, ...] = (64,), num_classes: int = 10) -> None:
        super().__init__()
        self.fc1 = nn.Linear(int(in_shape[0]), 64)
        self.fc2 = nn.Linear(64, 32)
        self.classifier = nn.Linear(32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(F.relu(self.fc2(F.relu(self.fc1(x)))))


def load_digit_vectors(size: int = 400) -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits as 64-value feature vectors scaled to [0, 1] and their labels: an
    (samples, labels) pair of a table, no image anywhere."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    return (x[:size] / 16.0).astype(np.float64), y[:size]
