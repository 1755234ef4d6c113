"""One client's tensors and the image conversion every data path shares (partitions and node-local directories)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch


@dataclass
class ClientData:
    """One client's normalized tensors (on CPU; the training loop moves batches)."""

    client_id: int
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def num_train(self) -> int:
        return len(self.y_train)

    @property
    def num_test(self) -> int:
        return len(self.y_test)


def is_image_batch(samples: np.ndarray) -> bool:
    """Images [N, C, H, W]; anything else (feature vectors [N, F]) is not normalized as pixels."""
    return samples.ndim == 4


def to_unit(images: np.ndarray) -> np.ndarray:
    """uint8 images scaled to [0, 1] float32; float images and feature vectors as they are."""
    if images.dtype == np.uint8:
        return images.astype(np.float32) / 255.0
    return images.astype(np.float32, copy=False)


def normalize(images: np.ndarray, mean: np.ndarray, std: np.ndarray) -> torch.Tensor:
    """(to_unit(images) - mean) / std per channel, as a contiguous float32 tensor; feature vectors
    are taken as they are (normalisation is an image step: tabular data keeps the user's scaling)."""
    x = torch.from_numpy(to_unit(images))
    if not is_image_batch(images):
        return x.contiguous()
    return ((x - torch.from_numpy(mean).view(1, -1, 1, 1)) / torch.from_numpy(std).view(1, -1, 1, 1)).contiguous()
