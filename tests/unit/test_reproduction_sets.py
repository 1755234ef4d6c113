"""The reproduction groups (conf/experiment/repro_*) cover every method of the paper's table
that pflower implements, so `pflower sim -m experiment=<group>` reproduces the whole column."""

import pytest
import yaml

from pflower.reports.report import paper_tables, setup_differences
from pflower.server_app.config import compose_config, conf_dir
from pflower.strategies import STRATEGIES


@pytest.mark.parametrize("alpha", ["0.1", "0.5", "1.0"])
def test_fedcmd_fmnist_groups_sweep_every_method_of_the_table(alpha: str) -> None:
    group = yaml.safe_load((conf_dir() / "experiment" / f"repro_fedcmd_fmnist_a{alpha}.yaml").read_text())
    swept = group["hydra"]["sweeper"]["params"]["method"].split(",")
    (table,) = [t for t in paper_tables() if t.home == "fedcmd"]
    paper = {m for (m, _, d, a) in table.numbers if (d, a) == ("fmnist", float(alpha))}
    assert sorted(swept) == sorted(m for m in paper if m in STRATEGIES)
    cfg = compose_config([f"experiment=repro_fedcmd_fmnist_a{alpha}", f"method={swept[-1]}"])
    assert (cfg.alpha, cfg.num_clients, cfg.rounds, cfg.dataset.name) == (float(alpha), 100, 200, "fmnist")
    assert cfg.output_dir == "outputs"  # a user's re-run never lands among the committed runs


def test_no_experiment_file_writes_into_the_committed_results():
    """A reproduction's maintainers name docs/results/... on their command line; the files leave
    output_dir at its default, so a user's run goes to outputs/ and `pflower report` over a
    committed folder never picks it up."""
    for path in sorted((conf_dir() / "experiment").glob("*.yaml")):
        assert (yaml.safe_load(path.read_text()) or {}).get("output_dir") is None, path.name


def composed_setup(cfg) -> dict:
    return {
        "model": cfg.model.name,
        "num_clients": cfg.num_clients,
        "fraction": cfg.fraction,
        "rounds": cfg.rounds,
        "partition": cfg.partition.name,
        "subsample": cfg.dataset.subsample,
    }


@pytest.mark.parametrize(
    "group, methods, home",
    [
        ("repro_fedcpmd_fmnist_a0.1", ["fedcpmd"], "fedcpmd"),
        ("repro_kapc_fmnist_a0.1_a", ["kapc", "kapc_bls", "local", "fedavg"], "kapc"),
        ("repro_kapc_fmnist_a0.1_b", ["kapc", "kapc_bls"], "kapc"),
        ("repro_kapc_fmnist_a0.1_a_ablation", ["kapc"], "kapc"),
        ("repro_kapc_fmnist_a0.1_a_lam", ["kapc"], "kapc"),
    ],
)
def test_new_method_groups_run_the_set_up_of_a_paper_table_with_a_number_for_each_run(group, methods, home):
    """Each run of the group has the set-up of one of its paper's tables, so `pflower report` prints the paper's
    number."""
    params = yaml.safe_load((conf_dir() / "experiment" / f"{group}.yaml").read_text())["hydra"]["sweeper"]["params"]
    for method in methods:
        for distance in params.get("method.distance", "js").split(","):
            cfg = compose_config(
                [f"experiment={group}", f"method={method}", f"method.distance={distance}"]
                if "method.distance" in params
                else [f"experiment={group}", f"method={method}"]
            )
            option = frozenset() if distance == "js" else frozenset({("distance", distance)})
            tables = [
                t
                for t in paper_tables()
                if t.home == home and (method, option, cfg.dataset.name, cfg.alpha) in t.numbers
            ]
            assert any(not setup_differences(t.setup, composed_setup(cfg)) for t in tables), (
                method,
                distance,
                [t.setup for t in tables],
            )


@pytest.mark.parametrize("paper", ["fedcmd", "fedcpmd"])
@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_a_papers_dataset_files_differ_from_its_set_up_in_the_dataset_alone(paper: str) -> None:
    """One file per paper set-up (<paper>_paper.yaml), one line per dataset: composing
    <paper>_<dataset> gives the paper's config with that dataset, nothing else changed."""
    from omegaconf import OmegaConf

    files = sorted(p.stem for p in (conf_dir() / "experiment").glob(f"{paper}_*.yaml"))
    datasets = [f.split("_", 1)[1] for f in files if f != f"{paper}_paper" and "vgg11" not in f]
    assert len(datasets) >= 9
    for dataset in datasets:
        assert len((conf_dir() / "experiment" / f"{paper}_{dataset}.yaml").read_text().splitlines()) <= 8
        mine = OmegaConf.to_container(compose_config([f"experiment={paper}_{dataset}"]))
        base = OmegaConf.to_container(compose_config([f"experiment={paper}_paper", f"dataset={dataset}"]))
        assert mine == base, dataset
        assert mine["dataset"]["name"] == dataset
