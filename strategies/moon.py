"""MOON (Li et al., CVPR 2021): FedAvg whose clients add a model-contrastive term (client_app.roles.moon).

The server is FedAvg; the client keeps its previous local model between rounds.
"""

from __future__ import annotations

from pflower.client_app.roles.moon import MOONArgs

from .base.hooks import MethodTraits
from .base.strategy import PersonalizedStrategy


class MOON(PersonalizedStrategy):
    """FedAvg with a model-contrastive term in the local loss.
    Its options are its client's: :class:`~pflower.client_app.roles.moon.MOONArgs`."""

    name = "moon"
    options_type = MOONArgs
    traits = MethodTraits(
        # the last layer group is the method's classifier
        linear_head=True,
        role="moon",
    )
