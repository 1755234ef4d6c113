"""LG-FedAvg (Liang et al., 2020): local representations, global upper layers.

The reverse of FedPer's split: the lower groups (by default the body's feature extractor:
every group before the first FC group) stay on each client; the upper groups are FedAvg'd.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from typing_extensions import override

from pflower.protocol.options import MethodOptions, option

from .base.strategy import PersonalizedStrategy


def lower_groups(groups: Sequence[str]) -> list[str]:
    """The groups before the first ``fc*`` / ``classifier`` group (all but the last if none is named so)."""
    first_fc = next((i for i, g in enumerate(groups) if g.startswith("fc") or g == "classifier"), len(groups) - 1)
    return list(groups[:first_fc])


@dataclass(frozen=True)
class LGFedAvgOptions(MethodOptions):
    """LGFedAvg's options (``method.<name>=`` on the command line, keywords of ``LGFedAvg(...)``),
    checked before round 1; ``pflower methods`` lists them."""

    local_groups: list[str] | None = option(
        None, "the personal (local) groups (null: the lower groups, e.g. LeNet-5's conv1, conv2)"
    )


class LGFedAvg(PersonalizedStrategy):
    """The lower groups personal, the upper ones FedAvg'd (options: :class:`LGFedAvgOptions`;
    the default personal groups: :func:`lower_groups`, e.g. LeNet-5's conv1, conv2)."""

    name = "lgfedavg"
    options_type = LGFedAvgOptions

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        o = self.options
        local_groups = o.local_groups
        chosen = list(local_groups) if local_groups else lower_groups(self.model.groups)
        unknown = sorted(set(chosen) - set(self.model.groups))
        if unknown:
            raise ValueError(f"LG-FedAvg local_groups {unknown} are not groups of the model {self.model.groups}")
        if not chosen:  # silently FedAvg otherwise
            raise ValueError(
                f"LG-FedAvg keeps no group local on this model: its groups {self.model.groups} have none before the "
                "first fc*/classifier group, which would make it FedAvg; name the local ones with local_groups=[...]"
            )
        self.local_groups = [g for g in self.model.groups if g in chosen]

    @override
    def personal_groups(self, client_id: int, server_round: int) -> list[str]:
        return list(self.local_groups)
