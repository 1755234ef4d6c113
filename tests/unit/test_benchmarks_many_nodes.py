"""benchmarks/many_nodes.py: how the SuperExecs are grouped and how their memory is split among nodes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import many_nodes  # noqa: E402


def test_warm_nodes_are_grouped_one_superexec_a_group_the_last_group_shorter():
    assert many_nodes.superexec_groups(5, 1) == [range(i, i + 1) for i in range(5)]
    assert many_nodes.superexec_groups(5, 2) == [range(0, 2), range(2, 4), range(4, 5)]
    assert many_nodes.superexec_groups(5, 50) == [range(0, 5)]
    assert many_nodes.superexec_groups(0, 10) == []


def test_a_shared_superexecs_memory_is_split_evenly_among_the_nodes_it_serves():
    # pid 100, 101: two SuperNodes; pid 200: one SuperExec serving both; pid 102: a node with its own
    owners = {100: [0], 101: [1], 200: [0, 1], 102: [2], 201: [2]}
    trees = {100: 100, 101: 120, 200: 400, 102: 90, 201: 410}  # KiB
    assert many_nodes.node_shares(owners, trees) == {0: 300.0, 1: 320.0, 2: 500.0}
    assert many_nodes.node_shares(owners, {100: 100}) == {0: 100.0, 1: 0.0, 2: 0.0}  # a tree gone: 0


def test_the_command_refuses_a_superexec_for_no_nodes():
    with pytest.raises(SystemExit, match="--per-superexec 0"):
        many_nodes.main(["--nodes", "2", "--per-superexec", "0"])


def test_the_memory_check_counts_a_shared_superexec_once_for_its_group():
    assert many_nodes.memory_needed_mib(30, 30, 1, 10) == 30 * 580  # a SuperExec each: as measured
    # 50 SuperNodes, 5 SuperExecs (fork server each), 10 ClientApps forked at once
    assert many_nodes.memory_needed_mib(50, 50, 10, 10) == 50 * 125 + 5 * (580 - 125) + 10 * 150 == 10025
    assert many_nodes.memory_needed_mib(50, 20, 10, 10) == 20 * 125 + 2 * 455 + 10 * 150 + 30 * 260
