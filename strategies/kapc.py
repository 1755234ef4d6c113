"""KAPC and KAPC+BLS (Zhi et al., IEEE TMC 2024; docs/methods/kapc.md): knowledge-aware parameter coaching.

The server keeps a relationship cube R (N x L x N, rows non-negative summing to 1; a "layer" is a
conv/linear with the BatchNorm affine after it, :func:`models.schema.parameter_layers`) and each
client's latest uploaded layers (stale-filled: a layer a client did not upload keeps its last
received value, the initial model's before). Every round (ALG5) the participants' slice of R takes
``cube_steps`` gradient steps from the layers' Gram matrices, is written back into R, and client
i receives its regularizer s_i^l = sum_j R[i, l, j] w_j^l (extra arrays, not loaded into its model).
The client trains its own model, kept across rounds, toward s_i and uploads it.

BLS (``bls``): the server leaves out layer l of s_i when the client's self-weight R[i, l, i] > mu
(ALG3; all layers at a client's first participation), and the client uploads only the first Omega
layers, Omega from the generalization-bound rule (ALG4, :mod:`client_app.roles.kapc`), at least
``omega_min`` (default L - 2, a calibrated guard the paper leaves open; ``omega_min=1`` is the literal rule).
The layers after a client's last Omega are not sent either: Eq. 20's partial regularizer coaches
them toward the client's own weights (the server never received them, so its s_i for them would be
the initial model's: a pull toward w^0). ``masked_reg=none`` drops that pull: a layer not sent
trains on CE alone.

Co-participants the server has not heard from (``unheard``): with client sampling (Scenario B,
10 of 100 a round) most of a round's participants are new in the early rounds, and the server's
copy of their layers is the untrained initial model. ``skip`` (the default) leaves them out of
s_i (the row renormalized over the heard ones; a layer with none is not sent); ``initial`` mixes
the initial model in for them, the literal reading of a server that stores w^0 for every client.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from typing_extensions import override

from pflower.client_app.roles.kapc import REGULARIZER_PREFIX, KAPCArgs
from pflower.protocol.options import option

from .base.diagnostics import Panel
from .base.hooks import MethodTraits, Uplink
from .base.strategy import PersonalizedStrategy
from .base.validation import ClientUpdate
from .kapc_math import (
    CUBE_INITS,
    CUBE_LRS,
    cube_step,
    downlink_mask,
    heard_mixing,
    initial_cube,
    slice_rows,
    write_back,
)
from .shared.aggregation import mixing_average
from .shared.model_distance import gram_matrix


@dataclass(frozen=True)
class KAPCOptions(KAPCArgs):
    """KAPC's options (``method.<name>=`` on the command line, keywords of ``KAPC(...)``),
    checked before round 1; ``pflower methods`` lists them."""

    beta: float = option(0.005, "pull of R toward uniform (the paper at alpha 0.1: 0.005)", low=0)
    cube_lr: float | str = option(
        "centered",
        "eta_r per layer: centered = 1 / (beta + 2 lam lambda_max(C G^l C)) on the Gram of the clients' "
        "deviations; theory = the same on the raw Gram; a number = a fixed step (the paper's 0.01)",
        choices=CUBE_LRS,
        above=0,
    )
    cube_steps: int = option(1, "E_r, cube iterations per round", low=0)
    cube_init: str = option(
        "random", "the cube's start: random (U[0,1), rows normalized) or uniform", choices=CUBE_INITS
    )
    write_back: str = option(
        "scaled", "scaled (mass-preserving) or literal (write, then renormalize)", choices=("scaled", "literal")
    )
    mu: float = option(0.7, "BLS downlink: skip layer l for client i when R[i,l,i] > mu", low=0, high=1)
    unheard: str = option(
        "skip",
        "co-participants the server has no upload of a layer from: skip (left out of s_i; a layer with none is "
        "not sent) or initial (the initial model stands in, the literal reading)",
        choices=("skip", "initial"),
    )


class KAPC(PersonalizedStrategy):
    """Knowledge-aware parameter coaching through the relationship cube (options:
    :class:`KAPCOptions`; the cube step sizes: :mod:`strategies.kapc_math`)."""

    name = "kapc"
    bls = False  # bidirectional layer selection: the method kapc_bls
    options_type = KAPCOptions
    traits = MethodTraits(
        diagnostic_panels=(
            Panel("cube_delta", "mean |ΔR| a round"),
            Panel("self_weight_by_layer", "mean self-weight r_ii, by layer"),
        ),
        role="kapc",
        # every client trains its own model across rounds (Eq. 17)
        client_keeps="model",
        state=("cube", "cube_rng", "models", "q", "omega_of", "masks"),
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        o = self.options
        self.layers = [list(keys) for keys in self.model.schema().layers]
        n_layers = len(self.layers)
        self.omega_min = max(1, n_layers - 2) if o.omega_min is None else o.omega_min
        if not 1 <= self.omega_min <= n_layers:
            raise ValueError(f"KAPC omega_min must be in 1..{n_layers} (the model's layers), got {o.omega_min}")
        self.lam, self.beta, self.cube_lr, self.cube_steps = o.lam, o.beta, o.cube_lr, o.cube_steps
        self.write_back, self.mu = o.write_back, o.mu
        self.cube_rng = np.random.default_rng([self.run.seed, 11])  # its own stream: sampling stays method-independent
        self.cube = initial_cube(self.run.num_clients, n_layers, self.cube_rng, o.cube_init)
        model_bytes = sum(v.nbytes for v in self.model.global_arrays.values())
        self.models = self.run.client_store("models", model_bytes)  # latest received layers of each client (stale fill)
        self.q = np.zeros(self.run.num_clients, dtype=np.int64)  # participations
        self.omega_of = np.full(
            self.run.num_clients, n_layers, dtype=np.int64
        )  # each client's last upload prefix (BLS)
        self.masks: dict[int, list[int]] = {}  # this round's downlink masks (ALG3 and Eq. 20's prefix)
        self._sent: dict[int, list[int]] = {}  # the layers actually sent: those masks, less the unheard ones
        self._unheard: dict[int, int] = {}  # per client, the layers left out for want of a heard co-participant

    # ------------------------------------------------------------------ hooks
    @override
    def personal_groups(self, client_id: int, server_round: int) -> list[str]:
        return list(self.model.groups)  # the client's model is its own; s_i travels as a regularizer

    @override
    def uplink(self, client_id: int, server_round: int) -> Uplink:
        """Every group; with BLS the client picks how many of the first layers it sends (omega)."""
        if not self.bls:
            return Uplink(self.model.groups)
        prefixes = [
            [k for keys in self.layers[:omega] for k in keys] for omega in range(self.omega_min, len(self.layers) + 1)
        ]
        return Uplink(self.model.groups, key_sets=prefixes)

    @override
    def role_config(self, client_id: int, server_round: int) -> dict[str, Any]:
        return {
            "omega_min": self.omega_min,  # null resolved: L - 2
            "bls": self.bls,
            "mask": self._sent.get(client_id, []),
            "first": bool(self.q[client_id] == 0),
        }

    def stored(self, client_id: int) -> dict[str, np.ndarray]:
        """Client ``client_id``'s latest layers as the server knows them (the initial model's if none)."""
        return {**self.model.global_arrays, **self.models.get(client_id, {})}

    @override
    def extra_downlinks(
        self, client_ids: Sequence[int], server_round: int, task: str = "train"
    ) -> dict[int, dict[str, np.ndarray]]:
        """ALG5 lines 6-16: slice, cube steps, write back, the regularizers, the BLS downlink masks."""
        if task != "train":  # the final evaluation needs none (and moves no cube)
            return {cid: {} for cid in client_ids}
        if not client_ids:
            return {}
        ids = list(client_ids)
        models = [self.stored(c) for c in ids]
        before = slice_rows(self.cube, ids)
        block = before
        if self.cube_steps:
            grams = np.stack([gram_matrix(models, keys) for keys in self.layers])
            block = cube_step(block, grams, self.lam, self.beta, self.cube_lr, self.cube_steps)
        self._cube_delta = np.abs(block - before).mean(axis=(0, 2))  # per layer: how far this round moved R
        write_back(self.cube, ids, block, self.write_back)
        mask = downlink_mask(
            block,
            self.mu if self.bls else None,
            [self.q[c] == 0 for c in ids],
            prefix=[int(self.omega_of[c]) for c in ids] if self.bls else None,
        )
        out: dict[int, dict[str, np.ndarray]] = {c: {} for c in ids}
        sent = mask.copy()  # ALG3's mask (recorded as BLS's saving) and the layers nobody heard can coach
        received = [set(self.models.keys_of(c)) for c in ids] if self.options.unheard == "skip" else []
        for layer, keys in enumerate(self.layers):
            weights = block[:, layer, :]
            if self.options.unheard == "skip":
                heard = [all(k in got for k in keys) for got in received]
                weights, sendable = heard_mixing(weights, heard)
                sent[:, layer] &= sendable
            for c, s in zip(ids, mixing_average(models, weights, keys=keys)):
                out[c].update({REGULARIZER_PREFIX + k: v for k, v in s.items()})
        self._unheard = {c: int((mask[row] & ~sent[row]).sum()) for row, c in enumerate(ids)}
        for row, c in enumerate(ids):
            self.masks[c] = [int(m) for m in mask[row]]
            self._sent[c] = [int(m) for m in sent[row]]
            for layer in np.flatnonzero(~sent[row]):
                for k in self.layers[layer]:
                    del out[c][REGULARIZER_PREFIX + k]
        self._self_weights = block[np.arange(len(ids)), :, np.arange(len(ids))]  # M x L, for the record
        return out

    def aggregate(self, server_round: int, updates: Sequence[ClientUpdate]) -> dict[str, Any]:
        """Store each client's uploaded layers (the rest stays stale); no global model."""
        for u in updates:
            if u.arrays:
                self.models[u.client_id] = {
                    **self.models.get(u.client_id, {}),
                    **u.arrays,
                }  # the reply's arrays, not a copy
            self.q[u.client_id] += 1
        # mean_client_acc, the paper's round metric (unweighted, trained models), is in every method's record
        record: dict[str, Any] = {"log_keys": ["mean_client_acc", "cube_delta"]}
        if self.options.unheard == "skip":  # regularizer layers not sent for want of a heard co-participant
            record["unheard_layers"] = sum(self._unheard.get(u.client_id, 0) for u in updates)
        omegas = [u.metrics.get("omega", len(self.layers)) for u in updates]
        for u, omega in zip(updates, omegas):
            self.omega_of[u.client_id] = int(omega)
        if omegas:
            record["omega_mean"] = float(np.mean(omegas))
            record["omega"] = {u.client_id: int(o) for u, o in zip(updates, omegas)}
        if self.bls:
            # who decided Omega: the floor omega_min (the walk down stopped at it), ALG4's reset to
            # L - 1 (first participation, or Omega_prev = L), or the generalization bound
            floor = int(sum(u.metrics.get("omega_floor", 0.0) for u in updates))
            reset = int(sum(u.metrics.get("omega_reset", 0.0) for u in updates))
            record["omega_floor_bound"] = floor
            record["omega_reset"] = reset
            record["omega_by_bound"] = len(updates) - floor - reset
            masks = np.array([self.masks[u.client_id] for u in updates if self.masks.get(u.client_id)], dtype=int)
            record["masked_layers"] = int((masks == 0).sum())
            if len(masks):
                record["masked_by_layer"] = [int(v) for v in (masks == 0).sum(axis=0)]
            record["log_keys"] += ["omega_mean", "masked_layers"]
        weights = getattr(self, "_self_weights", None)
        if weights is not None and len(weights):
            record["self_weight_by_layer"] = [float(v) for v in weights.mean(axis=0)]
        delta = getattr(self, "_cube_delta", None)
        if delta is not None:
            record["cube_delta"] = float(delta.mean())  # mean |R_new - R_old| over the round's block
            record["cube_delta_by_layer"] = [float(v) for v in delta]
        self.masks, self._sent, self._unheard = {}, {}, {}
        return record

    # ------------------------------------------------------------------ reporting
    def run_summary(self) -> dict[str, Any]:
        """The cube's mean self-weight per layer and how far it moved; the BLS counts. (The paper's
        headline, ``best_mean_acc``, every method's summary has.)"""
        out: dict[str, Any] = {"layers": len(self.layers), "bls": self.bls}
        out["cube_self_weight_by_layer"] = [float(v) for v in np.mean(np.einsum("ili->il", self.cube), axis=0)]
        deltas = [r["cube_delta"] for r in self.run.history if "cube_delta" in r]
        if deltas:
            out["cube_delta_mean"] = float(np.mean(deltas))
        if self.bls:
            for key in ("omega_floor_bound", "omega_by_bound", "omega_reset", "masked_layers"):
                out[key] = int(sum(r.get(key, 0) for r in self.run.history))
        return out

    def write_artifacts(self, run_dir: Path) -> list[Path]:
        """``cube.npy`` and ``cube.png`` (clients x clients per layer, the paper's Fig. 7 analogue)."""
        np.save(run_dir / "cube.npy", self.cube)
        names = [keys[0].removeprefix("groups.").rsplit(".", 1)[0] for keys in self.layers]
        return [run_dir / "cube.npy", plot_cube(self.cube, run_dir / "cube.png", names)]


def plot_cube(cube: np.ndarray, path: Path, layer_names: Sequence[str]) -> Path:
    """One heatmap per layer: row i = client i's weights R[i, l, :] over the clients (deterministic bytes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n_layers = cube.shape[1]
    cols = min(n_layers, 6)
    rows = -(-n_layers // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(2.4 * cols, 2.4 * rows + 0.4), squeeze=False)
    for layer in range(rows * cols):
        ax = axes[layer // cols][layer % cols]
        ax.set_xticks([])
        ax.set_yticks([])
        if layer >= n_layers:
            ax.axis("off")
            continue
        image = ax.imshow(cube[:, layer, :], vmin=0.0, vmax=max(float(cube.max()), 1e-9), cmap="viridis")
        ax.set_title(f"{layer + 1}: {layer_names[layer]}", fontsize=7)
    fig.colorbar(image, ax=axes, shrink=0.6, label="R[i, l, j]")
    fig.suptitle("KAPC relationship cube: client i (rows) -> client j (columns), per layer", fontsize=9)
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)
    return path


class KAPCBLS(KAPC):
    """KAPC with bidirectional layer selection (the same options; ``bls`` on)."""

    name = "kapc_bls"
    bls = True
    traits = dataclasses.replace(
        KAPC.traits,
        diagnostic_panels=(
            *KAPC.traits.diagnostic_panels,
            Panel("masked_by_layer", "clients not sent layer l"),
            Panel("omega_by_bound", "clients whose Ω came from the bound"),
            Panel("omega_floor_bound", "clients whose Ω came from the floor"),
        ),
    )
