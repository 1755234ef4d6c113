"""What a method may override: the hooks of :class:`strategies.base.strategy.PersonalizedStrategy`, with
their defaults (plain FedAvg with the papers' evaluation protocol).

A method is a subclass of the base that sets a few class attributes and overrides the hooks that
say what is different about it (FedPer: :meth:`MethodHooks.personal_groups`). The base's machinery
(discovery, messages, replies, bytes, checkpoints, the run loop) calls these; docs/adding-a-method.md
shows each with an example.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pflower.protocol.roles import RoleArgs

from ..shared.aggregation import fedavg
from .diagnostics import Panel
from .options import MethodOptions
from .validation import ClientUpdate


class MethodHooks:
    """The hooks and class attributes a method overrides (mixed into the strategy base, whose
    ``schema``, ``keys``, ``arrays_of``, ``draw`` and ``arch_arrays`` they use)."""

    # the per-round diagnostics that show this method's mechanism (pflower report draws them)
    diagnostic_panels: tuple[Panel, ...] = ()

    name = "base"
    options_type: type[MethodOptions] = MethodOptions  # the method's options, declared once (strategies.base.options)
    # role arguments the strategy computes from several options rather than copying one (checked apart)
    derived_role_args: tuple[str, ...] = ()
    role = "sgd"
    client_keeps = "personal"  # "personal" | "model" (wire.KEEP_MODES)
    shared_buffers = False  # float BN buffers travel with their group and are averaged (off: they never leave)
    heterogeneous = False  # the method supports clients of different architectures
    # the method reads the model's last layer group as its classifier, which must end in an
    # nn.Linear (weight [classes, features]): refused at construction otherwise
    linear_head = False
    checkpoint_exclude: tuple[str, ...] = ()  # method attributes not checkpointed (rebuilt from the config)
    # the final evaluation also scores every client's model on the labelled global test set (the
    # runner switches it on with dataset.public=test|holdout for methods with clients_evaluate_on_public)
    clients_evaluate_on_public = False
    final_global_test = False
    # the runner hands the server the public split: its images (attach_public: FedTSDP clusters the
    # clients' outputs on them) and, when it is labelled, images and labels (attach_public_test:
    # Felo/Velo score their group models on it)
    needs_public_data = False
    evaluates_on_public = False

    def attach_public(self, images: Any) -> None:
        """Receive the public images (only called when ``needs_public_data``)."""

    def attach_public_test(self, images: Any, labels: Any) -> None:
        """Receive the labelled public split (only called when ``evaluates_on_public``)."""

    # ------------------------------------------------------------------ method hooks
    def personal_groups(self, client_id: int, server_round: int) -> list[str]:
        """Layer groups that stay on the client this round (never sent either way)."""
        return []

    def shared_groups(self, client_id: int, server_round: int) -> list[str]:
        personal = set(self.personal_groups(client_id, server_round))
        return [g for g in self.schema(client_id).groups if g not in personal]

    def personal_keys(self, client_id: int, server_round: int) -> list[str]:
        """Keys that stay on the client although their group is shared (default none).

        The one key-level exception to the group split, for a personal part that cuts across
        groups (FedBN: the BN affine parameters inside the conv groups). These keys are left
        out of the downlink and the uplink, and the client persists them like personal groups.
        """
        return []

    def travelling_keys(self, groups: Iterable[str], client_id: int, server_round: int) -> list[str]:
        """Keys of ``groups`` (in ``client_id``'s architecture) that may travel: all but :meth:`personal_keys`."""
        stay = set(self.personal_keys(client_id, server_round))
        return [k for k in self.keys(groups, client_id) if k not in stay]

    def downlinks(self, client_ids: Sequence[int], server_round: int) -> dict[int, dict[str, np.ndarray]]:
        """The tensors each of a round's clients receives: by default the global values of its
        shared groups.

        The one downlink hook. A method whose clients receive models mixed from stored ones
        (pFedSim, FedAP, pFedLA) builds all of them here with one matrix product per block of
        parameters (:func:`strategies.shared.aggregation.mixing_average`).
        """
        out = {}
        for cid in client_ids:
            arrays = self.arrays_of(cid)
            out[cid] = {
                k: arrays[k] for k in self.travelling_keys(self.shared_groups(cid, server_round), cid, server_round)
            }
        return out

    def downlink(self, client_id: int, server_round: int) -> dict[str, np.ndarray]:
        """:meth:`downlinks` of one client (a convenience, not a hook)."""
        return self.downlinks([client_id], server_round)[client_id]

    def extra_downlinks(self, client_ids: Sequence[int], server_round: int) -> dict[int, dict[str, np.ndarray]]:
        """Arrays besides model tensors that each client receives with its train message (default none).

        Keys ``"<name>/<key>"`` travel as ``"extra/<name>/<key>"`` and count in ``bytes_down``;
        the client runtime does not load them into the model but hands them to the role
        (``RoleContext.received_extra``). FedFomo sends other clients' models this way.
        """
        return {cid: {} for cid in client_ids}

    def evaluate_extras(self, client_ids: Sequence[int], server_round: int) -> dict[int, dict[str, np.ndarray]]:
        """Arrays besides model tensors that the final evaluation's messages carry (default none;
        FedGKT sends its server model, through which its clients are evaluated)."""
        return {}

    def uplink_groups(self, client_id: int, server_round: int) -> list[str]:
        """Groups the client sends back after training (the most it may send)."""
        return self.shared_groups(client_id, server_round)

    def uplink_sets(self, client_id: int, server_round: int) -> list[list[str]] | None:
        """Key sets the client may choose from for its upload (None: exactly the travelling keys of
        :meth:`uplink_groups`). The role picks one after training (``RoleContext.upload_keys``);
        a reply holding any other set is rejected. BLS declares its layer prefixes here."""
        return None

    def role_config(self, client_id: int, server_round: int) -> RoleArgs | Mapping[str, Any]:
        """Arguments of the client role for this client and round (a ``protocol.roles`` dataclass)."""
        return {}

    def extra_uplink(self, client_id: int, server_round: int) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Shape and dtype of each extra array this client's train reply must carry (default none).

        The role fills ``RoleContext.upload_extra``; the arrays are validated like model tensors
        (keys, shapes, dtypes, finite values) and reach :meth:`aggregate` as ``ClientUpdate.extra``.
        """
        return {}

    def aggregate(self, server_round: int, updates: Sequence[ClientUpdate]) -> dict[str, Any]:
        """Server update from the round's valid replies (client-id order); returns method metrics to log.

        Default: FedAvg of what was uploaded, separately for each architecture (a heterogeneous
        federation never mixes tensors of different models).
        """
        by_arch: dict[str, list[ClientUpdate]] = {}
        for u in updates:
            if u.arrays:
                by_arch.setdefault(self.arch_of[u.client_id], []).append(u)
        for arch, ups in by_arch.items():
            self.arch_arrays[arch].update(fedavg([u.arrays for u in ups], [u.num_examples for u in ups]))
        return {}

    def run_summary(self) -> dict[str, Any]:
        """Method-specific values for ``summary.json`` (FedCMD: the selected layer)."""
        return {}

    def write_artifacts(self, run_dir: Path) -> list[Path]:
        """Files beside metrics.jsonl at the end of a run (KAPC: its cube as .npy and a picture)."""
        return []

    def sample(self, server_round: int) -> list[int]:
        """This round's client ids: a seeded uniform draw, the same stream for every method
        (so methods compare on one client sample stream). Override to sample differently (FedCPMD: per cluster, from
        :meth:`draw`)."""
        return self.draw(range(self.num_clients), self.sample_size())
