"""What a method declares and overrides: :class:`MethodTraits` (what the method is) and the hooks of
:class:`MethodHooks` (what it does differently), with the defaults of plain FedAvg under the papers'
evaluation protocol.

A method is a subclass of the strategy base with a ``name``, an ``options_type``, its ``traits``
and the few hooks that say what is different about it (FedPer: :meth:`MethodHooks.personal_groups`).
It reaches the run through four parts: ``self.options`` (its options), ``self.run`` (clients,
seed, history, the sampling stream, per-client stores), ``self.model`` (schemas, global arrays,
keys) and ``self.clients`` (the connected clients, a batch of messages of its own). Those 20 names
are the whole
surface (tests/unit/test_method_surface.py counts them); docs/adding-a-method.md shows each with
an example.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pflower.protocol import wire
from pflower.protocol.options import MethodOptions

from ..shared.aggregation import fedavg
from .diagnostics import Panel
from .validation import ClientUpdate

ExtraSpec = Mapping[str, tuple[tuple[int, ...], np.dtype]]


@dataclass(frozen=True)
class MethodTraits:
    """What a method is, declared once on its class (``traits = MethodTraits(role="fedcmd", ...)``).

    The base, the runner and ``pflower report`` read these; nothing else about a method is
    inferred. A subclass of a method extends its parent's with ``dataclasses.replace``.
    """

    role: str = "sgd"  # the client role its ClientApps run (client_app.roles)
    # attributes that change across rounds: saved in every checkpoint and restored on resume. Any
    # other attribute is configuration a fresh strategy rebuilds from the same config; a private one
    # (``_name``) is per-round scratch. An attribute created after the run starts and not listed
    # here is refused at the first checkpoint, with its name.
    state: tuple[str, ...] = ()
    client_keeps: str = "personal"  # what a client keeps between rounds: wire.KEEP_MODES
    shared_buffers: bool = False  # float BN buffers travel with their group and are averaged (off: they never leave)
    heterogeneous: bool = False  # clients of different architectures are supported
    # the model's last layer group is the method's classifier and must end in an nn.Linear
    # (weight [classes, features]): refused at construction otherwise
    linear_head: bool = False
    # the runner hands the server the public split (attach_public): its images only (FedTSDP
    # clusters the clients' outputs on them), or labelled (Felo/Velo score their group models)
    needs_public_data: bool = False
    evaluates_on_public: bool = False
    # the final evaluation also scores every client's model on the labelled global test set (the
    # runner switches it on with dataset.public=test|holdout)
    clients_evaluate_on_public: bool = False
    # the per-round diagnostics that show the method's mechanism (pflower report draws them)
    diagnostic_panels: tuple[Panel, ...] = ()

    def __post_init__(self) -> None:
        if self.client_keeps not in wire.KEEP_MODES:
            raise TypeError(f"traits.client_keeps must be one of {list(wire.KEEP_MODES)}, got {self.client_keeps!r}")


@dataclass(frozen=True)
class Uplink:
    """What one client may send back after training (:meth:`MethodHooks.uplink`).

    ``groups``: the layer groups it sends (the most it may send; personal keys never travel).
    ``key_sets``: the key sets the client's role may choose from after training, a reply holding
    any other set is rejected (None: exactly the travelling keys of ``groups``; KAPC's BLS
    declares its layer prefixes here). ``extra``: the shape and dtype of each array the reply
    must carry besides model tensors; validated like them, they reach :meth:`MethodHooks.aggregate`
    as ``ClientUpdate.extra``.
    """

    groups: Sequence[str]
    key_sets: Sequence[Sequence[str]] | None = None
    extra: ExtraSpec = field(default_factory=dict)


# a relay round's absorber: each valid reply, before the next client's message is built
Absorb = Callable[[ClientUpdate], None]


class MethodHooks:
    """The declarations and hooks a method overrides (mixed into the strategy base, whose parts
    ``run``, ``model`` and ``clients`` the defaults use)."""

    name = "base"
    options_type: type[MethodOptions] = MethodOptions  # the method's options, declared once (strategies.base.options)
    traits = MethodTraits()

    # ------------------------------------------------------------------ the round
    def prepare_round(self, server_round: int, task: str) -> None:
        """Called before a round's clients are sampled (``task`` "train") and before the final
        evaluation ("evaluate"), after newly connected nodes are discovered. FedCPMD probes its
        new clients here with a batch of its own (``self.clients.exchange``); HeteroFL puts
        every client back on its static level before the evaluation."""

    def sample(self, server_round: int) -> list[int]:
        """This round's client ids: a seeded uniform draw, the same stream for every method (so
        methods compare on one client sample stream). FedCPMD draws per cluster with
        ``self.run.draw(members, k)``."""
        return self.run.draw(range(self.run.num_clients), self.run.sample_size())

    def personal_groups(self, client_id: int, server_round: int) -> list[str]:
        """Layer groups that stay on the client this round (never sent either way). FedPer:
        ``return ["classifier"]``."""
        return []

    def personal_keys(self, client_id: int, server_round: int) -> list[str]:
        """Keys that stay on the client although their group is shared (default none).

        The one key-level exception to the group split, for a personal part that cuts across
        groups (FedBN: the BN affine parameters inside the conv groups). These keys are left
        out of the downlink and the uplink, and the client persists them like personal groups.
        """
        return []

    def downlinks(self, client_ids: Sequence[int], server_round: int) -> dict[int, dict[str, np.ndarray]]:
        """The model tensors each of a round's clients receives: by default the global values of
        its shared groups' travelling keys.

        A method whose clients receive models mixed from stored ones (pFedSim, FedAP, pFedLA)
        builds all of them here with one matrix product per block of parameters
        (:func:`strategies.shared.aggregation.mixing_average`).
        """
        out = {}
        for cid in client_ids:
            arrays = self.model.arrays_of(cid)
            out[cid] = {
                k: arrays[k] for k in self.travelling_keys(self.shared_groups(cid, server_round), cid, server_round)
            }
        return out

    def extra_downlinks(
        self, client_ids: Sequence[int], server_round: int, task: str = "train"
    ) -> dict[int, dict[str, np.ndarray]]:
        """Arrays besides model tensors that each client receives with its ``task`` message
        ("train", or "evaluate" for the final evaluation); default none.

        Keys ``"<name>/<key>"`` travel as ``"extra/<name>/<key>"`` and count in ``bytes_down``;
        the client runtime does not load them into the model but hands them to the role
        (``RoleContext.received_extra``). FedFomo sends other clients' models this way, FedGKT
        its server model with the evaluation.
        """
        return {cid: {} for cid in client_ids}

    def uplink(self, client_id: int, server_round: int) -> Uplink:
        """What the client may send back after training: by default its shared groups."""
        return Uplink(self.shared_groups(client_id, server_round))

    def role_config(self, client_id: int, server_round: int) -> Mapping[str, Any]:
        """What this client's role gets this round besides the method's options: the values of its
        arguments declared with ``sent`` (FedCMD: ``{"phase": 2, "personal_layer": "fc2", ...}``),
        and an option in its resolved form (FedCMD's ``candidates``: null becomes the FC groups).
        The options its role declares travel by themselves (:func:`.task_messages.role_args`)."""
        return {}

    def relay(self, server_round: int) -> Absorb | None:
        """None (the default): the round sends one batch of messages. A function: the round trains
        its clients one after another, each message built after the previous client's reply was
        handed to that function (FedCMD's phase 2 as the authors' code runs it)."""
        return None

    def aggregate(self, server_round: int, updates: Sequence[ClientUpdate]) -> dict[str, Any]:
        """Server update from the round's valid replies (client-id order); returns method metrics to log.

        Default: FedAvg of what was uploaded, separately for each architecture (a heterogeneous
        federation never mixes tensors of different models).
        """
        by_arch: dict[str, list[ClientUpdate]] = {}
        for u in updates:
            if u.arrays:
                by_arch.setdefault(self.model.arch_of[u.client_id], []).append(u)
        for arch, ups in by_arch.items():
            self.model.arrays[arch].update(fedavg([u.arrays for u in ups], [u.num_examples for u in ups]))
        return {}

    # ------------------------------------------------------------------ data and results
    def attach_public(self, images: Any, labels: Any = None) -> None:
        """Receive the public split before round 1: its images (``traits.needs_public_data``), or
        images and labels (``traits.evaluates_on_public``)."""

    def run_summary(self) -> dict[str, Any]:
        """Method-specific values for ``summary.json`` (FedCMD: the selected layer)."""
        return {}

    def write_artifacts(self, run_dir: Path) -> list[Path]:
        """Files beside metrics.jsonl at the end of a run (KAPC: its cube as .npy and a picture)."""
        return []

    # ------------------------------------------------------------------ the base's, from the hooks
    def shared_groups(self, client_id: int, server_round: int) -> list[str]:
        """The groups that are not personal this round (the base's, not a hook)."""
        personal = set(self.personal_groups(client_id, server_round))
        return [g for g in self.model.schema(client_id).groups if g not in personal]

    def travelling_keys(self, groups: Sequence[str], client_id: int, server_round: int) -> list[str]:
        """Keys of ``groups`` (in ``client_id``'s architecture) that may travel: all but
        :meth:`personal_keys` (the base's, not a hook)."""
        stay = set(self.personal_keys(client_id, server_round))
        return [k for k in self.model.keys(groups, client_id) if k not in stay]
