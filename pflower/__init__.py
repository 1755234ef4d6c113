"""pflower: personalized and heterogeneous federated learning on Flower.

The one import name pflower installs. Its parts (the public API is documented in docs/api.md):

- :mod:`pflower.strategies`: the methods as Flower strategies (``from pflower.strategies import FedCMD``)
- :mod:`pflower.client_app`: the client side, and :func:`pflower.client_app.build_clientapp` for your
  own model and data
- :mod:`pflower.models`: the model zoo and :func:`pflower.models.adapt` (any ``torch.nn.Module``)
- :mod:`pflower.federated_data`: datasets, partitioners and the data hooks
- :mod:`pflower.server_app`, :mod:`pflower.protocol`, :mod:`pflower.conf`: the ServerApp, the
  message contract's code and the Hydra configs
- :mod:`pflower.simulation`: ``pflower sim``'s engines (the one part that imports both the server
  and the client side); :mod:`pflower.reports`: reports, leaderboard and claims from finished runs
- :mod:`pflower.cli`: the ``pflower`` command

In the repository the parts are top-level folders (server_app/, strategies/, ...); the wheel maps
them under ``pflower/`` (pyproject.toml, ``package-dir``). In a checkout, and in the FAB that
``flwr run`` ships (the same files), this package finds them one folder up, so the code that runs
is the code beside this file: :data:`SOURCE_ROOT` names it and every run's provenance records it.
"""

from __future__ import annotations

from pathlib import Path

PARTS = (
    "server_app",
    "simulation",
    "reports",
    "client_app",
    "strategies",
    "models",
    "protocol",
    "federated_data",
    "conf",
)


def _checkout_root() -> Path | None:
    """The repository (or unpacked FAB) this file sits in, None in an installed wheel."""
    root = Path(__file__).resolve().parent.parent
    try:
        project = (root / "pyproject.toml").read_text()
    except OSError:
        return None
    if 'name = "pflower"' not in project or not all((root / part).is_dir() for part in PARTS):
        return None
    return root


_root = _checkout_root()
if _root is not None:
    __path__.append(str(_root))  # noqa: F821 - a package's __path__: pflower.strategies -> <root>/strategies
# where the running code lives: the checkout or FAB, or the installed package
SOURCE_ROOT: Path = _root if _root is not None else Path(__file__).resolve().parent

__all__ = ["PARTS", "SOURCE_ROOT"]
