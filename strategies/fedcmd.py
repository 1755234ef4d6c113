"""FedCMD (Chen et al., IEEE TC 2024): a data-chosen personal layer l* (docs/methods/fedcmd.md).

Phase 1 (rounds 1..Kp): FedAvg of the whole model; every client votes for the candidate
layer of lowest feature-distribution-transfer score; the server keeps each round's
majority. After round Kp, l* = the layer that won most rounds.
Phase 2 (rounds Kp+1..K): l* stays on each client (initialised once from the phase-1
global model); the groups before l* are FedAvg'd; the groups after l* are averaged per
client, weighted by the clipped cosine similarity of the clients' l* parameters (Eq. 7-8).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.common import log
from typing_extensions import override

from pflower.client_app.roles.fedcmd import FedCMDArgs
from pflower.protocol.options import option

from .base.hooks import Absorb, MethodTraits, Uplink
from .base.phases import phase_rounds
from .base.strategy import PersonalizedStrategy
from .base.validation import ClientUpdate
from .fedcmd_math import personal_layer_index, personalized_posts, round_winner
from .shared.model_distance import copy_arrays, gram_matrix
from .shared.similarity import EQ8_EPS, cosine_from_gram


def default_candidates(groups: Sequence[str]) -> list[str]:
    """The FC groups: every group from the first one named ``fc*`` or ``classifier`` (FedCMD paper)."""
    for i, g in enumerate(groups):
        if g.startswith("fc") or g == "classifier":
            return list(groups[i:])
    return [groups[-1]]


@dataclass
class FedCMDState:
    """Everything the server must keep to resume a FedCMD run (besides the base's global arrays).

    ``votes[r][client]`` and ``round_winners[r]`` are layer names; ``phi_init``/``post_init``
    are θ_G^{Kp}'s values of l* and of the groups after it; ``post_store[client]`` is that
    client's Eq. 7 post(l*) (absent: ``post_init``); ``phi_seen`` are the clients known to
    hold their own φ (a phase-2 reply of theirs was accepted).
    """

    candidates: list[str]
    votes: dict[int, dict[int, str]] = field(default_factory=dict)
    round_winners: dict[int, str] = field(default_factory=dict)
    personal_layer: str | None = None
    phi_init: dict[str, np.ndarray] = field(default_factory=dict)
    post_init: dict[str, np.ndarray] = field(default_factory=dict)
    post_store: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)
    phi_seen: set[int] = field(default_factory=set)

    def total_client_votes(self) -> list[int]:
        """Client votes per candidate over all of phase 1 (l*'s first tie-break)."""
        counts = Counter(v for per_round in self.votes.values() for v in per_round.values())
        return [counts.get(c, 0) for c in self.candidates]

    def winners_in_order(self) -> list[str]:
        """Each phase-1 round's majority layer, oldest first (the tally that fixes l*)."""
        return [self.round_winners[r] for r in sorted(self.round_winners)]

    def to_dict(self) -> dict[str, Any]:
        """Plain lists/strings/ints plus numpy arrays (copies), JSON-safe but for the arrays."""
        return {
            "candidates": list(self.candidates),
            "votes": [[r, c, v] for r in sorted(self.votes) for c, v in sorted(self.votes[r].items())],
            "round_winners": [[r, self.round_winners[r]] for r in sorted(self.round_winners)],
            "personal_layer": self.personal_layer,
            "phi_init": copy_arrays(self.phi_init),
            "post_init": copy_arrays(self.post_init),
            "post_store": {str(c): copy_arrays(a) for c, a in sorted(self.post_store.items())},
            "phi_seen": sorted(self.phi_seen),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FedCMDState:
        """The state a checkpoint's :meth:`to_dict` wrote."""
        votes: dict[int, dict[int, str]] = {}
        for r, c, v in d.get("votes", []):
            votes.setdefault(int(r), {})[int(c)] = str(v)
        return cls(
            candidates=list(d["candidates"]),
            votes=votes,
            round_winners={int(r): str(w) for r, w in d.get("round_winners", [])},
            personal_layer=d.get("personal_layer"),
            phi_init=copy_arrays(d.get("phi_init", {})),
            post_init=copy_arrays(d.get("post_init", {})),
            post_store={int(c): copy_arrays(a) for c, a in d.get("post_store", {}).items()},
            phi_seen={int(c) for c in d.get("phi_seen", [])},
        )


@dataclass(frozen=True)
class FedCMDOptions(FedCMDArgs):
    """FedCMD's options (``method.<name>=`` on the command line, keywords of ``FedCMD(...)``),
    checked before round 1; ``pflower methods`` lists them."""

    kp: int = option(20, "Kp, the rounds of phase 1 (layer selection); the paper: 20 of 200", low=0)
    rho: float | None = option(None, "Kp as a share of total_rounds (overrides kp)", low=0, high=1)
    total_rounds: int | None = option(None, "K, the run's rounds (the method config sets it to rounds)", low=1)
    weighted_aggregation: bool = option(
        True, "phase 2 weighs the personal layers by Eq. 8's similarities (false: the clients' own)"
    )
    force_layer: str | None = option(None, "skip the vote and personalize this group (a candidate)")
    relay_phase2: bool = option(
        False,
        "phase 2 trains a round's clients one after another, each from the model the previous one uploaded "
        "(its own l* kept): what the authors' code does through parameter aliasing; false: the paper's algorithm",
    )


class FedCMD(PersonalizedStrategy):
    """FedCMD on the strategy base (options: :class:`FedCMDOptions`). ``kp=0`` needs ``force_layer``;
    ``weighted_aggregation=False`` is the paper's "w/o WA" ablation (post(l*) FedAvg'd like pre(l*));
    ``force_layer`` fixes l* while phase 1 still runs and its votes are logged. The scoring options go
    to the client role."""

    name = "fedcmd"
    options_type = FedCMDOptions
    traits = MethodTraits(
        # the last layer group is the method's classifier
        linear_head=True,
        role="fedcmd",
        state=("state",),
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        o = self.options
        self.kp = phase_rounds("FedCMD kp", None if o.rho is not None else o.kp, o.rho, o.total_rounds, "round", "rho")
        if o.total_rounds is not None and self.kp >= o.total_rounds:  # it would never personalize anything
            raise ValueError(
                f"FedCMD kp={self.kp} leaves no phase-2 round in a run of {o.total_rounds} rounds (l* would be chosen "
                f"after the last round): set method.kp below rounds (the paper: kp=20 of 200) or method.rho=0.1"
            )
        self.weighted_aggregation = o.weighted_aggregation
        cands = list(o.candidates) if o.candidates else default_candidates(self.model.groups)
        unknown = [c for c in cands if c not in self.model.groups]
        if unknown or len(set(cands)) != len(cands):
            raise ValueError(f"FedCMD candidates {cands} must be distinct groups of the model {self.model.groups}")
        cands = [g for g in self.model.groups if g in cands]  # forward order: the last tie-break
        if o.force_layer is not None and o.force_layer not in cands:
            raise ValueError(f"FedCMD force_layer={o.force_layer!r} is not a candidate; candidates: {cands}")
        if o.tie_prior is not None and o.tie_prior not in cands:
            raise ValueError(f"FedCMD tie_prior={o.tie_prior!r} is not a candidate; candidates: {cands}")
        if self.kp == 0 and o.force_layer is None:
            raise ValueError("FedCMD kp=0 skips layer selection: set force_layer to the personal layer")
        self.force_layer = o.force_layer
        self.relay_phase2 = o.relay_phase2
        self.state = FedCMDState(candidates=cands)

    # ------------------------------------------------------------------ phases and groups
    def phase(self, server_round: int) -> int:
        """1 while the clients vote for a layer (rounds 1..Kp), then 2."""
        return 1 if server_round <= self.kp else 2

    def personal_layer(self) -> str:
        """l*, fixed at the end of round Kp (or on first need, if that round was skipped or Kp=0)."""
        if self.state.personal_layer is None:
            self._fix_personal_layer()
        return self.state.personal_layer  # type: ignore[return-value]

    def pre_groups(self) -> list[str]:
        """The groups before l*: FedAvg'd over the round's clients."""
        return self.model.groups[: self.model.groups.index(self.personal_layer())]

    def post_groups(self) -> list[str]:
        """The groups after l*: averaged per client with Eq. 8's similarity weights."""
        return self.model.groups[self.model.groups.index(self.personal_layer()) + 1 :]

    def _fix_personal_layer(self) -> None:
        st = self.state
        if self.force_layer is not None:
            layer = self.force_layer
        else:
            if not st.round_winners:
                log(WARNING, "FedCMD: no phase-1 votes were collected; l* falls to the tie rule")
            winners = [st.candidates.index(w) for w in st.winners_in_order()]
            layer = st.candidates[personal_layer_index(winners, st.total_client_votes(), len(st.candidates))]
        st.personal_layer = layer
        st.phi_init = copy_arrays({k: self.model.global_arrays[k] for k in self.model.keys([layer])})
        st.post_init = copy_arrays({k: self.model.global_arrays[k] for k in self.model.keys(self.post_groups())})
        log(INFO, "FedCMD: personal layer l* = %s (round winners %s)", layer, st.winners_in_order())

    # ------------------------------------------------------------------ hooks
    @override
    def personal_groups(self, client_id: int, server_round: int) -> list[str]:
        return [] if self.phase(server_round) == 1 else [self.personal_layer()]

    @override
    def relay(self, server_round: int) -> Absorb | None:
        """With ``relay_phase2``, phase 2 as the authors' code runs it: the next client starts
        from everything the previous one uploaded."""
        if self.relay_phase2 and self.phase(server_round) == 2:
            return lambda update: self.model.global_arrays.update(update.arrays)
        return None

    def downlinks(self, client_ids: Sequence[int], server_round: int) -> dict[int, dict[str, np.ndarray]]:
        """Phase 1: everything. Phase 2: global pre(l*), the client's own post(l*), φ_init once
        (relay: the previous client's pre and post, φ_init once)."""
        out = super().downlinks(client_ids, server_round)
        if self.phase(server_round) == 2:
            for cid, down in out.items():
                if self.weighted_aggregation and not self.relay_phase2:
                    down.update(self.state.post_store.get(cid, self.state.post_init))
                if cid not in self.state.phi_seen:
                    down.update(self.state.phi_init)
        return out

    @override
    def uplink(self, client_id: int, server_round: int) -> Uplink:
        """Phase 2 with Eq. 7: all groups, since the server needs each client's φ for Eq. 8."""
        if self.phase(server_round) == 2 and self.weighted_aggregation and not self.relay_phase2:
            return Uplink(self.model.groups)
        return super().uplink(client_id, server_round)

    @override
    def role_config(self, client_id: int, server_round: int) -> dict[str, Any]:
        resolved = {"candidates": list(self.state.candidates)}  # null: the FC groups, in forward order
        if self.phase(server_round) == 1:
            return {**resolved, "phase": 1}
        return {
            **resolved,
            "phase": 2,
            "personal_layer": self.personal_layer(),
            "has_phi_init": client_id not in self.state.phi_seen,
        }

    @override
    def aggregate(self, server_round: int, updates: Sequence[ClientUpdate]) -> dict[str, Any]:
        record: dict[str, Any] = {"phase": self.phase(server_round)}
        if self.relay(server_round):  # the global model is the last relayed client's (absorb_relay)
            self.state.phi_seen.update(u.client_id for u in updates)
            record.update(personal_layer=self.personal_layer(), relay=True, log_keys=["phase", "personal_layer"])
            return record
        super().aggregate(server_round, updates)  # FedAvg of what was uploaded (phase 2: pre; φ/post diagnostics)
        if record["phase"] == 1:
            record.update(self._count_votes(server_round, updates))
            record["log_keys"] = ["phase", "round_winner"]
            if server_round == self.kp:
                record["personal_layer"] = self.personal_layer()
                record["log_keys"].append("personal_layer")
            return record
        if self.weighted_aggregation and updates:
            record.update(self._weighted_posts(updates))
        self.state.phi_seen.update(u.client_id for u in updates)
        record["personal_layer"] = self.personal_layer()
        record["log_keys"] = ["phase", "personal_layer"]
        return record

    def _count_votes(self, server_round: int, updates: Sequence[ClientUpdate]) -> dict[str, Any]:
        """Record the clients' votes and the round winner; returns the round's vote histogram."""
        cands = self.state.candidates
        votes: dict[int, int] = {}
        for u in updates:
            v = u.metrics.get("vote", -1.0)
            if v == int(v) and 0 <= int(v) < len(cands):
                votes[u.client_id] = int(v)
            elif v != -1.0:
                log(
                    WARNING,
                    "round %d: client %d sent vote %s outside 0..%d; ignored",
                    server_round,
                    u.client_id,
                    v,
                    len(cands) - 1,
                )
        batch_votes = [sum(u.metrics.get(f"votes_{c}", 0.0) for u in updates if u.client_id in votes) for c in cands]
        winner = round_winner(list(votes.values()), batch_votes, len(cands))
        if votes:
            self.state.votes[server_round] = {cid: cands[v] for cid, v in votes.items()}
        if winner is not None:
            self.state.round_winners[server_round] = cands[winner]
        out: dict[str, Any] = {"round_winner": None if winner is None else cands[winner]}
        for c, name in enumerate(cands):
            out[f"client_votes_{name}"] = sum(1 for v in votes.values() if v == c)
            out[f"votes_{name}"] = batch_votes[c]
            scores = [
                u.metrics[f"s_mean_{name}"] for u in updates if u.client_id in votes and f"s_mean_{name}" in u.metrics
            ]
            if scores:
                out[f"s_mean_{name}"] = float(np.mean(scores))
        return out

    def _weighted_posts(self, updates: Sequence[ClientUpdate]) -> dict[str, Any]:
        """Eq. 8 on the uploaded l* parameters, Eq. 7 for each participant's post(l*)."""
        phi_keys = self.model.keys([self.personal_layer()])
        phi = cosine_from_gram(gram_matrix([u.arrays for u in updates], phi_keys), EQ8_EPS, lo=0.0)  # Eq. 8, blockwise
        m = len(updates)
        out = {"phi_offdiag_mean": float((phi.sum() - np.trace(phi)) / (m * (m - 1)))} if m > 1 else {}
        post_keys = self.model.keys(self.post_groups())
        if post_keys:  # l* = last group: post is empty and Phi has no effect (logged anyway)
            posts = personalized_posts([{k: u.arrays[k] for k in post_keys} for u in updates], phi)
            for u, post in zip(updates, posts):
                self.state.post_store[u.client_id] = post
        return out

    # ------------------------------------------------------------------ reporting

    def run_summary(self) -> dict[str, Any]:
        """For summary.json: the selected layer and the phase-1 round winners."""
        return {
            "personal_layer": self.state.personal_layer,
            "round_winners": self.state.winners_in_order(),
            "kp": self.kp,
        }
