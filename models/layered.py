"""The one abstraction every pflower model shares: an ordered list of named layer groups.

A model is a sequence of groups (``conv1, conv2, fc1, fc2, classifier``...). Running the
groups in order is the forward pass, so each group's output is available for
layer-wise statistics (FedCMD's W2 scores, FedCPMD's knowledge representation) and every
parameter belongs to exactly one group by construction: its state-dict key starts with
the group name. Strategies decouple models in group names only ("personalize fc2"),
never in hand-written key lists.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

import torch
from torch import nn


class LayeredNet(nn.Module):
    """A network made of named groups applied one after the other."""

    def __init__(self, groups: "OrderedDict[str, nn.Module]") -> None:
        super().__init__()
        if not groups:
            raise ValueError("a LayeredNet needs at least one layer group")
        for name in groups:
            if "." in name:
                raise ValueError(f"layer group names cannot contain '.': {name!r}")
        self.groups = nn.ModuleDict(groups)

    @property
    def group_names(self) -> list[str]:
        """Group names in forward order."""
        return list(self.groups.keys())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for module in self.groups.values():
            x = module(x)
        return x

    def forward_groups(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Return the output of every group, in forward order (the last one is the logits)."""
        outputs = []
        for module in self.groups.values():
            x = module(x)
            outputs.append(x)
        return outputs

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Output of the body: every group but the last (the classifier input)."""
        for module in list(self.groups.values())[:-1]:
            x = module(x)
        return x


def group_of(key: str) -> str:
    """Group that owns a state-dict key (``groups.fc1.0.weight`` -> ``fc1``)."""
    parts = key.split(".")
    if len(parts) < 2 or parts[0] != "groups":
        raise KeyError(f"{key!r} is not a LayeredNet state-dict key")
    return parts[1]


def trainable_keys(model: LayeredNet, groups: Iterable[str] | None = None) -> list[str]:
    """State-dict keys of the trainable parameters of ``groups`` (all groups if None), in forward order."""
    wanted = _check_groups(model, groups)
    return [name for name, p in model.named_parameters() if group_of(name) in wanted]


def buffer_keys(model: LayeredNet) -> list[str]:
    """State-dict keys of buffers (BN running statistics): these never leave a client."""
    return [name for name, _ in model.named_buffers()]


def keys_by_group(model: LayeredNet) -> "OrderedDict[str, list[str]]":
    """Trainable parameter keys of every group, in forward order."""
    out: OrderedDict[str, list[str]] = OrderedDict((g, []) for g in model.group_names)
    for name, _ in model.named_parameters():
        out[group_of(name)].append(name)
    return out


def _check_groups(model: LayeredNet, groups: Iterable[str] | None) -> set[str]:
    names = model.group_names
    if groups is None:
        return set(names)
    wanted = set(groups)
    unknown = wanted - set(names)
    if unknown:
        raise KeyError(f"unknown layer group(s) {sorted(unknown)}; this model has {names}")
    return wanted


def split_groups(model: LayeredNet, personal: Sequence[str]) -> tuple[list[str], list[str]]:
    """(shared, personal) group names in forward order for a set of personal groups."""
    _check_groups(model, personal)
    personal_set = set(personal)
    shared = [g for g in model.group_names if g not in personal_set]
    return shared, [g for g in model.group_names if g in personal_set]
