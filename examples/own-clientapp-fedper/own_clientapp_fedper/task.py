"""The app's own model and data, as in Flower's quickstart-pytorch (task.py).

The model is the quickstart's ``Net`` unchanged. The quickstart downloads CIFAR-10 with
flwr-datasets; this copy reads scikit-learn's bundled digits instead (as 3x32x32 images, the
quickstart's normalisation), so it runs offline. Each partition is an IID share, 80/20 split.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import TensorDataset


class Net(nn.Module):
    """Model (simple CNN adapted from 'PyTorch: A 60 Minute Blitz')"""

    def __init__(self):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = x.view(-1, 16 * 5 * 5)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


def load_data(partition_id: int, num_partitions: int) -> tuple[TensorDataset, TensorDataset]:
    """This partition's (train, test) datasets."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    x = F.interpolate(x, size=(32, 32), mode="bilinear", align_corners=False).repeat(1, 3, 1, 1)
    x, y = (x - 0.5) / 0.5, torch.tensor(digits.target)
    order = np.random.default_rng(42).permutation(len(y))
    mine = order[partition_id::num_partitions]
    cut = int(0.8 * len(mine))
    return TensorDataset(x[mine[:cut]], y[mine[:cut]]), TensorDataset(x[mine[cut:]], y[mine[cut:]])
