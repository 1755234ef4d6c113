"""FedCMD through the in-process Grid (no Ray): phases, routing of l*, Eq. 7, FedPer equivalence."""

import json

import numpy as np
import pytest
from method_helpers import role_args_of

from pflower.server_app.config import ConfigError
from pflower.server_app.runner import build
from pflower.simulation.inprocess import InProcessGrid, personal_state
from pflower.strategies.base.validation import ClientUpdate
from pflower.strategies.fedcmd import FedCMD, FedCMDState
from pflower.strategies.fedcmd_math import flat_vector, personalized_posts, similarity_matrix


def make(compose, tiny_overrides, *extra):
    return build(compose(*tiny_overrides, *extra), run_token="test-run")


def run(strategy, grid, rounds):
    records = []
    strategy.start(grid, num_rounds=rounds, on_round=records.append)
    return records


def train_messages(grid):
    """(round, client id, {key: array}, spec) of every train message the server sent."""
    out = []
    for m in grid.sent:
        if m.metadata.message_type != "train":
            continue
        cfg = m.content.config_records["config"]
        arrays = {k: v.numpy() for k, v in m.content.array_records["arrays"].items()}
        out.append((int(cfg["server-round"]), int(cfg["client-id"]), arrays, json.loads(cfg["spec"])))
    return out


def train_replies(grid, strategy):
    """{round: [(client id, {key: array})]} of the train replies, in reply order."""
    rounds = {}
    sent = {m.metadata.message_id: m for m in grid.sent}
    for r in grid.replies:
        if r.metadata.message_type != "train" or r.has_error():
            continue
        cfg = sent[r.metadata.reply_to_message_id].content.config_records["config"]
        arrays = {k: v.numpy() for k, v in r.content.array_records["arrays"].items()}
        rounds.setdefault(int(cfg["server-round"]), []).append((int(cfg["client-id"]), arrays))
    return rounds


def test_two_phases_and_the_routing_of_the_personal_layer(compose, tiny_overrides):
    strategy = make(compose, tiny_overrides, "method=fedcmd", "method.kp=2", "rounds=5")
    grid = InProcessGrid(4)
    records = run(strategy, grid, rounds=5)
    layer = strategy.state.personal_layer
    assert [r["phase"] for r in records] == [1, 1, 2, 2, 2]  # round kp+1 is the first phase-2 round
    assert layer in ["fc1", "fc2", "classifier"] == strategy.state.candidates
    assert records[1]["personal_layer"] == layer and all(r["personal_layer"] == layer for r in records[2:])
    assert "personal_layer" not in records[0]
    assert all(r["round_winner"] in strategy.state.candidates for r in records[:2])
    assert all(sum(r[f"client_votes_{c}"] for c in strategy.state.candidates) == len(r["clients"]) for r in records[:2])
    assert strategy.run_summary() == {
        "personal_layer": layer,
        "round_winners": [r["round_winner"] for r in records[:2]],
        "kp": 2,
    }

    phi_keys = set(strategy.model.keys([layer]))
    pre_keys = set(strategy.model.keys(strategy.pre_groups()))
    post_keys = set(strategy.model.keys(strategy.post_groups()))
    everything = set(strategy.model.global_arrays)
    replies = train_replies(grid, strategy)
    seen: set[int] = set()
    post_of: dict[int, dict] = {}  # what each client must receive as post(l*): Eq. 7 of its last round
    cases: set[str] = set()
    for rnd in range(1, 6):
        msgs = [m for m in train_messages(grid) if m[0] == rnd]
        if rnd <= 2:
            assert all(set(a) == everything and s["role_args"]["phase"] == 1 for _, _, a, s in msgs)
            assert all(s["role_args"]["candidates"] == strategy.state.candidates for *_, s in msgs)
            continue
        for _, cid, arrays, spec in msgs:
            assert spec["personal"] == [layer] and spec["upload"] == strategy.model.groups
            args = spec["role_args"]
            assert (args["phase"], args["personal_layer"], args["has_phi_init"]) == (2, layer, cid not in seen)
            if cid in seen:  # l* never travels down after the first phase-2 contact
                assert set(arrays) == pre_keys | post_keys
            else:
                assert set(arrays) == everything
                assert all(np.array_equal(arrays[k], strategy.state.phi_init[k]) for k in phi_keys)
            want = post_of.get(cid, strategy.state.post_init)
            cases.add(f"{'seen' if cid in seen else 'first'}-{'eq7' if cid in post_of else 'init'}")
            assert all(np.array_equal(arrays[k], want[k]) for k in post_keys)
        first = msgs[0][2]
        assert all(np.array_equal(a[k], first[k]) for _, _, a, _ in msgs for k in pre_keys)  # one global pre
        # Eq. 7-8 over this round's participants, from what they uploaded
        ups = replies[rnd]
        phi = similarity_matrix([flat_vector(a, strategy.model.keys([layer])) for _, a in ups])
        if post_keys:
            for (cid, _), post in zip(ups, personalized_posts([{k: a[k] for k in post_keys} for _, a in ups], phi)):
                post_of[cid] = post
        seen.update(cid for cid, _ in ups)
        assert records[rnd - 1]["phi_offdiag_mean"] < 1.0
    assert cases == {"first-init", "seen-eq7"}  # the seed's sample exercises both paths
    # the personalised posts differ between clients (Phi is not all ones)
    stores = list(strategy.state.post_store.values())
    if post_keys:
        assert len(stores) >= 2 and not all(np.array_equal(stores[0][k], stores[1][k]) for k in post_keys)
    # BN running statistics never travel, either way
    for m in grid.sent + grid.replies:
        if m.has_content() and "arrays" in m.content.array_records:
            assert not any("running" in k or "num_batches" in k for k in m.content.array_records["arrays"].keys())


def test_a_client_keeps_its_own_personal_layer(compose, tiny_overrides):
    strategy = make(compose, tiny_overrides, "method=fedcmd", "method.kp=1", "method.force_layer=fc2", "fraction=1.0")
    grid = InProcessGrid(4)
    run(strategy, grid, rounds=3)
    fc2 = strategy.model.keys(["fc2"])
    for cid, arrays in train_replies(grid, strategy)[3]:
        saved = personal_state(grid.contexts[grid.node_of_client[cid]])
        assert all(np.array_equal(saved[k], arrays[k]) for k in fc2)  # persisted = uploaded
    round3 = [a for r, _, a, _ in train_messages(grid) if r == 3]
    assert round3 and not any(set(fc2) & set(a) for a in round3)  # never overwritten by the server


def test_force_layer_classifier_without_wa_and_kp0_equals_fedper(compose, tiny_overrides):
    common = ("rounds=3",)
    fedper = make(compose, tiny_overrides, "method=fedper", *common)
    fedcmd = make(
        compose,
        tiny_overrides,
        "method=fedcmd",
        "method.kp=0",
        "method.force_layer=classifier",
        "method.weighted_aggregation=false",
        *common,
    )
    rec_p = run(fedper, InProcessGrid(4), rounds=3)
    rec_c = run(fedcmd, InProcessGrid(4), rounds=3)
    for a, b in zip(rec_p, rec_c):
        assert a["clients"] == b["clients"]
        for key in ("test_before_acc", "test_after_acc", "test_before_loss", "train_loss"):
            assert a[key] == b[key], key
        assert a["groups_up"] == b["groups_up"] == fedper.model.groups[:-1] and b["phase"] == 2
    body = fedper.model.keys(fedper.model.groups[:-1])
    assert all(np.array_equal(fedper.model.global_arrays[k], fedcmd.model.global_arrays[k]) for k in body)
    assert fedper.final_metrics["final_acc"] == fedcmd.final_metrics["final_acc"]
    assert fedcmd.run_summary()["personal_layer"] == "classifier"


def test_without_wa_the_post_groups_are_fedavg_and_phi_stays_home(compose, tiny_overrides):
    strategy = make(
        compose,
        tiny_overrides,
        "method=fedcmd",
        "method.kp=1",
        "method.force_layer=fc1",
        "method.weighted_aggregation=false",
    )
    grid = InProcessGrid(4)
    records = run(strategy, grid, rounds=2)
    assert records[0]["round_winner"] in strategy.state.candidates and strategy.state.personal_layer == "fc1"
    assert records[1]["groups_up"] == ["conv1", "conv2", "fc2", "classifier"]
    post = strategy.model.keys(["fc2", "classifier"])
    msgs = [a for r, _, a, _ in train_messages(grid) if r == 2]
    assert all(np.array_equal(a[k], msgs[0][k]) for a in msgs for k in post)  # one global post
    assert not strategy.state.post_store


def test_after_training_dataset_granularity_code_scores(compose, tiny_overrides):
    strategy = make(
        compose,
        tiny_overrides,
        "method=fedcmd",
        "method.kp=1",
        "method.selection_timing=after_training",
        "method.granularity=dataset",
        "method.score_mode=code",
        "method.w2_mode=mean_only",
        "method.candidates=[fc2,classifier]",
    )
    records = run(strategy, InProcessGrid(4), rounds=1)
    cands = ["fc2", "classifier"]
    assert strategy.state.candidates == cands and strategy.state.personal_layer in cands
    assert sum(records[0][f"votes_{c}"] for c in cands) == len(records[0]["clients"])  # one vote per client
    assert all(np.isfinite(records[0][f"s_mean_{c}"]) for c in cands)


def test_phi_init_is_resent_until_a_phase2_reply_is_accepted(compose, tiny_overrides):
    strategy = make(compose, tiny_overrides, "method=fedcmd", "method.kp=0", "method.force_layer=fc2")
    fc2 = set(strategy.model.keys(["fc2"]))
    assert fc2 <= set(strategy.downlinks([1], 1)[1])
    upd = ClientUpdate(0, 0, {k: v.copy() for k, v in strategy.model.global_arrays.items()}, 10, {})
    strategy.aggregate(1, [upd])  # client 1 crashed; client 0 replied
    assert fc2 <= set(strategy.downlinks([1], 2)[1]) and not fc2 & set(strategy.downlinks([0], 2)[0])


def test_state_is_enough_to_resume(compose, tiny_overrides):
    strategy = make(compose, tiny_overrides, "method=fedcmd", "method.kp=1")
    run(strategy, InProcessGrid(4), rounds=3)
    fresh = make(compose, tiny_overrides, "method=fedcmd", "method.kp=1")
    fresh.state = FedCMDState.from_dict(strategy.state.to_dict())
    fresh.model.global_arrays = {k: v.copy() for k, v in strategy.model.global_arrays.items()}
    for cid in range(4):
        a, b = strategy.downlinks([cid], 4)[cid], fresh.downlinks([cid], 4)[cid]
        assert set(a) == set(b) and all(np.array_equal(a[k], b[k]) for k in a)
        assert strategy.role_config(cid, 4) == fresh.role_config(cid, 4)


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_options_are_checked_before_round_1(compose, tiny_overrides):
    assert make(compose, tiny_overrides, "method=fedcmd", "method.rho=0.5", "rounds=10").kp == 5
    with pytest.raises(ValueError, match="no phase-2 round in a run of 3 rounds"):  # it would never personalize
        make(compose, tiny_overrides, "method=fedcmd", "method.kp=20", "rounds=3")
    with pytest.raises(ValueError, match="force_layer"):
        make(compose, tiny_overrides, "method=fedcmd", "method.kp=0")
    with pytest.raises(ValueError, match="score_mode"):
        make(compose, tiny_overrides, "method=fedcmd", "method.kp=1", "method.score_mode=kl")
    with pytest.raises(ValueError, match="not a candidate"):
        make(compose, tiny_overrides, "method=fedcmd", "method.kp=1", "method.force_layer=conv1")
    with pytest.raises(ValueError, match="candidates"):
        make(compose, tiny_overrides, "method=fedcmd", "method.kp=1", "method.candidates=[fc9]")
    with pytest.raises(ConfigError, match="no option"):
        compose(*tiny_overrides, "method=fedcmd", "+method.sim_scope=all_seen")
    assert isinstance(make(compose, tiny_overrides, "method=fedcmd", "method.kp=1"), FedCMD)


def test_relay_phase2_starts_each_client_from_the_previous_clients_upload(compose, tiny_overrides):
    """The authors' code's phase 2 (parameter aliasing): client k+1 of a round receives exactly the
    tensors client k uploaded (the round's first, the previous round's last), l* never travels
    after φ_init, and the global model after the round is the last client's."""
    strategy = make(
        compose, tiny_overrides, "method=fedcmd", "method.kp=1", "method.force_layer=fc2", "method.relay_phase2=true"
    )
    grid = InProcessGrid(4)
    records = run(strategy, grid, rounds=3)
    assert [strategy.relay(r) is not None for r in (1, 2, 3)] == [False, True, True]
    fc2, shared = (
        set(strategy.model.keys(["fc2"])),
        [k for k in strategy.model.keys() if k not in strategy.model.keys(["fc2"])],
    )
    sent, replies = train_messages(grid), train_replies(grid, strategy)
    order = [(r, cid) for r, cid, _, _ in sent]
    assert [c for r, c in order if r == 2] == records[1]["clients"] and len(records[1]["clients"]) > 1
    down = {(r, cid): a for r, cid, a, _ in sent}
    up = {(r, cid): a for r in replies for cid, a in replies[r]}
    chain = [(r, c) for r, c in order if r >= 2]
    for before, after in zip(chain, chain[1:]):
        assert all(np.array_equal(down[after][k], up[before][k]) for k in shared), (before, after)
        assert not fc2 & set(up[before])
    again = [k for k in chain if k[0] == 3 and k[1] in records[1]["clients"]]  # φ_init went down in round 2
    assert all(fc2 <= set(down[k]) for k in chain if k[0] == 2) and all(not fc2 & set(down[k]) for k in again)
    assert all(np.array_equal(strategy.model.global_arrays[k], up[chain[-1]][k]) for k in shared)
    assert records[2]["bytes_down"] > 0 and records[2]["phase"] == 2
    assert [r.get("relay") for r in records] == [None, True, True]  # the rounds say how they ran


def test_tie_prior_sends_exact_ties_to_its_candidate_and_must_be_a_candidate(compose, tiny_overrides):
    from pflower.client_app.roles.fedcmd import FedCMDArgs, FedCMDRole
    from pflower.client_app.roles.layer_stats import batch_vote
    from pflower.models import build_model

    strategy = make(compose, tiny_overrides, "method=fedcmd", "method.kp=1", "method.tie_prior=fc2")
    from pflower.strategies.base.task_messages import role_args

    args = role_args(strategy, 0, 1)
    assert args.tie_prior == "fc2"
    model = build_model("lenet5", (1, 28, 28), 10, fc_layers=3)
    assert FedCMDRole(args).scorer(model, None).prior == 1  # fc1, fc2, classifier: fc2 is index 1
    assert (
        FedCMDRole(FedCMDArgs(**role_args_of("fedcmd", phase=1, candidates=args.candidates))).scorer(model, None).prior
        is None
    )
    assert batch_vote([0.5, 0.5, 0.5], prior=1) == 1 and batch_vote([0.5, 0.5, 0.5]) == 0
    assert batch_vote([0.4, 0.5, 0.5], prior=1) == 0  # a prior only breaks ties at the minimum
    with pytest.raises(ValueError, match=r"tie_prior='conv1' is not a candidate"):
        make(compose, tiny_overrides, "method=fedcmd", "method.kp=1", "method.tie_prior=conv1")
    with pytest.raises(ValueError, match=r"tie_prior='fc9' is not a candidate"):
        FedCMDArgs(**role_args_of("fedcmd", phase=1, candidates=["fc1", "fc2"], tie_prior="fc9"))
