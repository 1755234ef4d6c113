"""The reproduction groups (conf/experiment/repro_*) cover every method of the paper's table
that pflower implements, so `pflower sim -m experiment=<group>` reproduces the whole column."""

import pytest
import yaml

from server_app.config import compose_config, conf_dir
from strategies import STRATEGIES


@pytest.mark.parametrize("alpha", ["0.1", "0.5", "1.0"])
def test_fedcmd_fmnist_groups_sweep_every_method_of_the_table(alpha: str) -> None:
    group = yaml.safe_load((conf_dir() / "experiment" / f"repro_fedcmd_fmnist_a{alpha}.yaml").read_text())
    swept = group["hydra"]["sweeper"]["params"]["method"].split(",")
    paper = yaml.safe_load((conf_dir() / "paper_results" / "fedcmd.yaml").read_text())["fmnist"][float(alpha)]
    assert sorted(swept) == sorted(m for m in paper if m in STRATEGIES)
    cfg = compose_config([f"experiment=repro_fedcmd_fmnist_a{alpha}", f"method={swept[-1]}"])
    assert (cfg.alpha, cfg.num_clients, cfg.rounds, cfg.dataset.name) == (float(alpha), 100, 200, "fmnist")
    assert cfg.output_dir == f"docs/results/fedcmd_fmnist_a{alpha}"
