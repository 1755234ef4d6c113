"""Issue 76 (4): the library API's defaults that silently changed results, and the strategies'
signatures: LG-FedAvg keeping nothing local, a method's total_rounds left at its default while
start(num_rounds=...) says otherwise, num_clients required where Flower's strategies count the
nodes, and `inspect.signature(FedCMD)` showing only (*args, **kwargs)."""

from __future__ import annotations

import inspect

import pytest
from torch import nn
from user_code import Net

from pflower.simulation.inprocess import InProcessGrid
from pflower.strategies import STRATEGIES, FedAvg, Felo, LGFedAvg, client_spec


class FlatNet(nn.Module):
    """A quickstart-shaped model for flat 64-feature vectors: no conv layer."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(64, 32), nn.Linear(32, 16), nn.Linear(16, 10)

    def forward(self, x):
        return self.fc3(self.fc2(self.fc1(x).relu()).relu())


def test_lgfedavg_refuses_to_keep_nothing_local_and_names_local_groups():
    with pytest.raises(ValueError, match=r"keeps no group local on this model.*local_groups=\[\.\.\.\]"):
        LGFedAvg(FlatNet(), client_spec(), num_clients=2)
    assert LGFedAvg(FlatNet(), client_spec(), num_clients=2, local_groups=["fc1"]).local_groups == ["fc1"]


def test_total_rounds_comes_from_start_when_not_given_and_stays_when_given():
    felo = Felo(Net(), client_spec(), num_clients=2)
    assert (felo.options.total_rounds, felo.warmup_rounds) == (100, 5)  # the option's default
    felo._take_from_start(InProcessGrid(2), num_rounds=3)
    assert (felo.options.total_rounds, felo.warmup_rounds) == (3, 1)  # 2 of 3 rounds distill, not 0
    assert felo.total_rounds == 3  # its last global evaluation at round 3, not 100
    given = Felo(Net(), client_spec(), num_clients=2, total_rounds=50)
    given._take_from_start(InProcessGrid(2), num_rounds=3)
    assert given.options.total_rounds == 50  # the user's word stands


@pytest.mark.heavy  # over 1 s of one core: not in the quick tier
def test_a_horizon_without_a_default_is_taken_from_start_too():
    """pFedSim's warm-up share and FedCMD's rho need total_rounds: built without it (it was a
    ValueError at construction), they plan on start()'s num_rounds."""
    from pflower.strategies import FedCMD, PFedSim

    pfedsim = PFedSim(Net(), client_spec(), num_clients=2)
    pfedsim._take_from_start(InProcessGrid(2), num_rounds=30)
    assert (pfedsim.options.total_rounds, pfedsim.warmup) == (30, 15)  # rho_general 0.5 of 30
    fedcmd = FedCMD(Net(), client_spec(), num_clients=2, rho=0.1)
    fedcmd._take_from_start(InProcessGrid(2), num_rounds=50)
    assert fedcmd.kp == 5
    with pytest.raises(ValueError, match="leaves no phase-2 round in a run of 3 rounds"):
        FedCMD(Net(), client_spec(), num_clients=2, kp=3)._take_from_start(InProcessGrid(2), num_rounds=3)


@pytest.mark.heavy  # over 1 s of one core: not in the quick tier
def test_num_clients_defaults_to_the_connected_nodes_at_start():
    strategy = FedAvg(Net(), client_spec(), fraction_train=1.0)
    strategy.start(InProcessGridWithData(3), num_rounds=1)
    assert strategy.run.num_clients == 3 and strategy.final_metrics["final_clients"] == 3


class InProcessGridWithData(InProcessGrid):
    """pflower's in-process grid whose nodes read digits as 3x32x32 images (user_code's data)."""

    def __init__(self, num_nodes: int) -> None:
        super().__init__(num_nodes)
        from user_code import client_digits32

        from pflower.client_app.runtime import handle_evaluate, handle_hello, handle_train
        from pflower.client_app.user_parts import ClientHooks

        hooks = ClientHooks(Net, client_digits32)
        self.handlers = {
            "query": lambda m, c: handle_hello(m, c, hooks),
            "train": lambda m, c: handle_train(m, c, hooks),
            "evaluate": lambda m, c: handle_evaluate(m, c, hooks),
        }

    def handle_all(self, tasks):
        return [self.handlers[m.metadata.message_type](m, self.contexts[n]) for m, n in tasks]


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_every_public_strategys_signature_shows_its_parameters_and_options(name):
    cls = STRATEGIES[name]
    params = inspect.signature(cls).parameters
    assert list(params)[:3] == ["model", "client_spec", "num_clients"], list(params)
    for name in cls.options_type.names():  # the options, not the values a strategy sends its role
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY, name
    assert not any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params.values())
