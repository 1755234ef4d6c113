"""The strategy base every pflower method builds on.

It owns what all personalized methods share: client discovery (stable client ids, not
Flower node ids), seeded sampling, one Message per node with only the tensors that node
must receive, reply validation, byte accounting, the evaluation protocol and the
per-round record. A method overrides a few hooks that say what is different about it:

- :meth:`personal_groups`: layer groups that stay on the client (FedPer: the classifier);
- :meth:`personal_keys`: single trainable keys of shared groups that stay too (FedBN: BN affine);
- :meth:`downlink`: the tensors one client receives (default: the shared groups' global values);
- :meth:`downlinks` / :meth:`extra_downlinks`: the same for a whole round at once (batched mixing);
- :meth:`uplink_groups`: the groups a client sends back (default: the shared ones);
- :meth:`role_config`: arguments of the client role (proximal mu, fine-tune epochs...);
- :meth:`extra_downlink` / :meth:`extra_uplink`: arrays besides model tensors in a train message
  and its reply, as ``extra/<name>/<key>`` (FedFomo: other clients' models; FedAP: BN statistics);
- :meth:`aggregate`: the server update (default: FedAvg of what was uploaded).

Checkpoint/resume (:meth:`state_dict` / :meth:`load_state_dict`, file format in
:mod:`strategies.checkpoint`). The base saves the last completed round, the global arrays,
the round history, the run token, the sampling RNG's state and torch's CPU RNG state, plus
the method's state from :meth:`extra_state`. By default that is *every instance attribute
the base does not own* (``vars(self)`` minus :data:`BASE_ATTRS`), so a method's server
state (per-client stores, similarity matrices, votes, clusters, dataclasses, torch modules
created in ``__init__``...) is checkpointed and restored with no code in the method.
A method opts out with ``checkpoint_exclude = ("cache",)`` (attributes that a fresh
strategy rebuilds from the config), or overrides :meth:`extra_state` /
:meth:`load_extra_state` (call ``super()`` to keep the generic part) for objects created
lazily or not encodable. Values that cannot be encoded are refused before round 1.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from logging import INFO, WARNING
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, Metadata, MetricRecord, RecordDict
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from client_app.roles.base import EXTRA_PREFIX
from models import LayeredNet, group_of, keys_by_group, trainable_keys

from .aggregation import fedavg
from .evaluation import client_time_totals, weighted_test_metrics
from .validation import ClientUpdate, InvalidReply, record_bytes, validate_reply

RoundCallback = Callable[[dict[str, Any]], None]

# instance attributes the base owns: saved explicitly by state_dict() or deliberately not at all
# (config-derived, or per-connection like ``clients``: node ids change when a SuperNode restarts)
BASE_ATTRS = frozenset({
    "groups", "group_keys", "global_arrays", "template", "client_spec", "num_clients", "fraction",
    "min_clients", "min_available", "min_replies", "seed", "final_eval", "discover_timeout", "rng",
    "clients", "history", "final_metrics", "_inflight", "_sent", "_bytes_down", "_groups_down",
    "_message_ttl",
})

# seconds a message outlives the wait for its reply: the SuperLink then drops it, so a SuperNode
# that reconnects after its round closed is not handed training whose reply would be discarded
TTL_MARGIN_S = 60.0


@dataclass
class ClientInfo:
    """What the server knows of one client: where it is now and what it announced."""

    node_id: int
    num_train: int
    num_test: int


class PersonalizedStrategy(Strategy):
    """Base of every pflower method: FedAvg-shaped rounds with per-client messages."""

    name = "base"
    role = "sgd"
    checkpoint_exclude: tuple[str, ...] = ()  # method attributes not checkpointed (rebuilt from the config)

    def __init__(
        self,
        model: LayeredNet,
        client_spec: Mapping[str, Any],
        *,
        num_clients: int,
        fraction: float = 0.1,
        min_clients: int = 1,
        min_available: int | None = None,
        min_replies: int = 1,
        seed: int = 42,
        final_eval: bool = True,
        discover_timeout: float = 300.0,
    ) -> None:
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"fraction must be in (0, 1], got {fraction}")
        self.groups = model.group_names
        self.group_keys = keys_by_group(model)
        state = model.state_dict()
        self.global_arrays: dict[str, np.ndarray] = {
            k: state[k].detach().cpu().numpy().copy() for k in trainable_keys(model)
        }
        self.template = {k: (v.shape, v.dtype) for k, v in self.global_arrays.items()}
        self.client_spec = dict(client_spec)
        self.num_clients = num_clients
        self.fraction = fraction
        self.min_clients = min_clients
        self.min_available = num_clients if min_available is None else min_available
        self.min_replies = min_replies
        self.seed = seed
        self.final_eval = final_eval
        self.discover_timeout = discover_timeout
        self.rng = np.random.default_rng(seed)
        self.clients: dict[int, ClientInfo] = {}
        self.history: list[dict[str, Any]] = []
        self.final_metrics: dict[str, Any] = {}
        self._inflight: dict[int, int] = {}  # node id -> client id of this round's messages
        # client id -> metadata of the message sent to it: the grid fills in its message id when it
        # pushes, and an error reply the SuperLink writes itself ("Node Unavailable") names only that id
        self._sent: dict[int, Metadata] = {}
        self._bytes_down = 0
        self._groups_down: set[str] = set()
        self._message_ttl: float | None = None  # set by start(): the round timeout + TTL_MARGIN_S

    # ------------------------------------------------------------------ method hooks
    def personal_groups(self, client_id: int, server_round: int) -> list[str]:
        """Layer groups that stay on the client this round (never sent either way)."""
        return []

    def shared_groups(self, client_id: int, server_round: int) -> list[str]:
        personal = set(self.personal_groups(client_id, server_round))
        return [g for g in self.groups if g not in personal]

    def personal_keys(self, client_id: int, server_round: int) -> list[str]:
        """Trainable keys that stay on the client although their group is shared (default none).

        The one key-level exception to the group split, for a personal part that cuts across
        groups (FedBN: the BN affine parameters inside the conv groups). These keys are left
        out of the downlink and the uplink, and the client persists them like personal groups.
        """
        return []

    def travelling_keys(self, groups: Iterable[str], client_id: int, server_round: int) -> list[str]:
        """Trainable keys of ``groups`` that may travel: all but :meth:`personal_keys`."""
        stay = set(self.personal_keys(client_id, server_round))
        return [k for k in self.keys(groups) if k not in stay]

    def downlink(self, client_id: int, server_round: int) -> dict[str, np.ndarray]:
        """Tensors sent to one client: by default the global values of its shared groups."""
        shared = self.shared_groups(client_id, server_round)
        return {k: self.global_arrays[k] for k in self.travelling_keys(shared, client_id, server_round)}

    def uplink_groups(self, client_id: int, server_round: int) -> list[str]:
        """Groups the client sends back after training."""
        return self.shared_groups(client_id, server_round)

    def role_config(self, client_id: int, server_round: int) -> dict[str, Any]:
        """Arguments of the client role for this client and round (JSON-serialisable)."""
        return {}

    def extra_downlink(self, client_id: int, server_round: int) -> dict[str, np.ndarray]:
        """Arrays besides model tensors that a client receives with its train message (default none).

        Keys ``"<name>/<key>"`` travel as ``"extra/<name>/<key>"`` and count in ``bytes_down``;
        the client runtime does not load them into the model but hands them to the role
        (``RoleContext.received_extra``). FedFomo sends other clients' models this way.
        """
        return {}

    def downlinks(self, client_ids: Sequence[int], server_round: int) -> dict[int, dict[str, np.ndarray]]:
        """:meth:`downlink` of a round's clients at once: what the round's messages carry.

        A method whose clients receive models mixed from stored ones (pFedSim, FedAP, pFedLA)
        overrides this to build all of them with one matrix product per block of parameters
        (:func:`strategies.aggregation.mixing_average`) and lets :meth:`downlink` call it for one client.
        """
        return {cid: self.downlink(cid, server_round) for cid in client_ids}

    def extra_downlinks(self, client_ids: Sequence[int], server_round: int) -> dict[int, dict[str, np.ndarray]]:
        """:meth:`extra_downlink` of a round's clients at once (FedAMP builds every u_i together)."""
        return {cid: self.extra_downlink(cid, server_round) for cid in client_ids}

    def extra_uplink(self, client_id: int, server_round: int) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Shape and dtype of each extra array this client's train reply must carry (default none).

        The role fills ``RoleContext.upload_extra``; the arrays are validated like model tensors
        (keys, shapes, dtypes, finite values) and reach :meth:`aggregate` as ``ClientUpdate.extra``.
        """
        return {}

    def aggregate(self, server_round: int, updates: Sequence[ClientUpdate]) -> dict[str, Any]:
        """Server update from the round's valid replies; returns method metrics to log."""
        uploaded = [u.arrays for u in updates if u.arrays]
        if uploaded:
            self.global_arrays.update(fedavg(uploaded, [u.num_examples for u in updates if u.arrays]))
        return {}

    # ------------------------------------------------------------------ helpers
    def keys(self, groups: Iterable[str]) -> list[str]:
        """Trainable state-dict keys of ``groups``, in forward order."""
        wanted = set(groups)
        unknown = wanted - set(self.groups)
        if unknown:
            raise KeyError(f"unknown layer group(s) {sorted(unknown)}; model groups: {self.groups}")
        return [k for g in self.groups if g in wanted for k in self.group_keys[g]]

    def summary(self) -> None:
        log(INFO, "\t├── method: %s (client role %s)", self.name, self.role)
        log(INFO, "\t├── clients: %d, fraction %.2f, seed %d", self.num_clients, self.fraction, self.seed)
        log(INFO, "\t└── layer groups: %s", ", ".join(self.groups))

    def sample_size(self) -> int:
        return max(self.min_clients, int(self.fraction * self.num_clients))

    def sample(self, server_round: int) -> list[int]:
        """Seeded sample of client ids: the same stream for every method (fedcmd.md A13)."""
        m = self.sample_size()
        population = np.arange(self.num_clients)
        chosen = self.rng.choice(population, size=min(m, len(population)), replace=False)
        available = [int(c) for c in chosen if int(c) in self.clients]
        missing = sorted(set(int(c) for c in chosen) - set(available))
        if missing:
            log(WARNING, "round %d: sampled clients %s are not connected; training without them", server_round, missing)
        return sorted(available)

    def _config(self, client_id: int, server_round: int, task: str) -> ConfigRecord:
        spec = {
            **self.client_spec,
            "role": self.role,
            "role_args": self.role_config(client_id, server_round),
            "personal": self.personal_groups(client_id, server_round),
            "personal_keys": self.personal_keys(client_id, server_round),
            "upload": self.uplink_groups(client_id, server_round) if task == "train" else [],
            "task": task,
        }
        return ConfigRecord({"server-round": server_round, "client-id": client_id, "spec": json.dumps(spec)})

    def _message(
        self,
        client_id: int,
        server_round: int,
        task: str,
        message_type: str,
        down: Mapping[str, np.ndarray] | None = None,
        extra: Mapping[str, np.ndarray] | None = None,
    ) -> Message:
        down = self.downlink(client_id, server_round) if down is None else down
        if extra is None:
            extra = self.extra_downlink(client_id, server_round) if task == "train" else {}
        arrays = ArrayRecord(array_dict={k: Array(np.ascontiguousarray(v)) for k, v in down.items()})
        for k, v in extra.items():
            arrays[EXTRA_PREFIX + k] = Array(np.ascontiguousarray(v))
        self._bytes_down += record_bytes(arrays)
        self._groups_down.update(group_of(k) for k in down)
        self._groups_down.update(group_of(k.split("/", 1)[-1]) for k in extra if k.split("/", 1)[-1] in self.template)
        node = self.clients[client_id].node_id
        self._inflight[node] = client_id
        content = RecordDict({"arrays": arrays, "config": self._config(client_id, server_round, task)})
        message = Message(content=content, message_type=message_type, dst_node_id=node, ttl=self._message_ttl)
        self._sent[client_id] = message.metadata  # not the message: its arrays are freed once pushed
        return message

    # ------------------------------------------------------------------ discovery
    def discover(self, grid: Grid, wait_for: int | None = None, timeout: float | None = None) -> None:
        """Map connected nodes to stable client ids (a restarted SuperNode gets a new node id).

        New nodes are asked who they are with a query message; each replies with its client
        id and the sizes of its splits. Waits until ``wait_for`` clients are known.
        """
        wait_for = self.min_available if wait_for is None else wait_for
        deadline = time.monotonic() + (self.discover_timeout if timeout is None else timeout)
        errors: list[str] = []
        while True:
            nodes = set(grid.get_node_ids())
            for cid in [c for c, info in self.clients.items() if info.node_id not in nodes]:
                log(WARNING, "client %d (node %d) disconnected", cid, self.clients.pop(cid).node_id)
            known = {info.node_id for info in self.clients.values()}
            unknown = sorted(nodes - known)
            if unknown:
                new_errors = self._query(grid, unknown)
                errors += new_errors
                if not self.clients and len(new_errors) >= len(unknown):
                    # every node refused (a config or data error is the same on all): fail now
                    raise RuntimeError(f"no client could join the run: {new_errors[0]}")
            if len(self.clients) >= wait_for or time.monotonic() > deadline:
                break
            time.sleep(1.0)
        if not self.clients:
            reason = errors[0] if errors else "no node connected"
            raise RuntimeError(f"no client could join the run: {reason}")
        if len(self.clients) < wait_for:
            log(WARNING, "only %d of %d clients connected; going on", len(self.clients), wait_for)

    def _query(self, grid: Grid, node_ids: Sequence[int]) -> list[str]:
        config = ConfigRecord({"spec": json.dumps({**self.client_spec, "task": "hello"})})
        messages = [
            Message(
                RecordDict({"config": config}), message_type=MessageType.QUERY, dst_node_id=n,
                ttl=self.discover_timeout + TTL_MARGIN_S,
            )
            for n in node_ids
        ]
        errors = []
        replies = grid.send_and_receive(messages, timeout=self.discover_timeout)
        asked = {m.metadata.message_id: m.metadata.dst_node_id for m in messages}  # ids set by the push
        for reply in replies:
            # the SuperLink's own error replies come from node 0: name the node that was asked
            node = asked.get(reply.metadata.reply_to_message_id, reply.metadata.src_node_id)
            if reply.has_error():
                errors.append(f"node {node}: {reply.error.reason}")
                log(WARNING, "node %d could not join: %s", node, reply.error.reason)
                continue
            try:
                metrics = next(iter(reply.content.metric_records.values()))
                cid, n_train, n_test = (int(metrics[k]) for k in ("client-id", "num-train", "num-test"))
            except (StopIteration, KeyError, TypeError, ValueError) as exc:
                errors.append(f"node {node}: malformed hello ({exc!r})")
                continue
            if "num-partitions" in metrics and int(metrics["num-partitions"]) != self.num_clients:
                raise RuntimeError(
                    f"the simulation runs {int(metrics['num-partitions'])} SuperNodes but num_clients="
                    f"{self.num_clients}: run `flwr run . --federation-config \"num-supernodes="
                    f"{self.num_clients}\"` (or set num_clients={int(metrics['num-partitions'])})"
                )
            if not 0 <= cid < self.num_clients:
                errors.append(f"node {node}: client id {cid} outside 0..{self.num_clients - 1}")
                log(WARNING, "%s: set num_clients to the number of SuperNodes", errors[-1])
                continue
            if cid in self.clients:
                log(WARNING, "client %d moved from node %d to node %d", cid, self.clients[cid].node_id, node)
            self.clients[cid] = ClientInfo(node, n_train, n_test)
        return errors

    # ------------------------------------------------------------------ Flower hooks
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self.discover(grid, wait_for=0, timeout=0)
        self._inflight, self._sent, self._bytes_down, self._groups_down = {}, {}, 0, set()
        ids = self.sample(server_round)
        down, extra = self.downlinks(ids, server_round), self.extra_downlinks(ids, server_round)
        # pop: each client's arrays are freed once its message holds them (peak: one round of messages)
        return [self._message(cid, server_round, "train", MessageType.TRAIN, down.pop(cid), extra.pop(cid)) for cid in ids]

    def _collect(self, server_round: int, replies: Iterable[Message], task: str) -> tuple[list[ClientUpdate], list[dict]]:
        updates: list[ClientUpdate] = []
        dropped: list[dict[str, Any]] = []
        answered: set[int] = set()
        by_message = {meta.message_id: cid for cid, meta in self._sent.items() if meta.message_id}
        for msg in replies:
            node = msg.metadata.src_node_id
            cid = self._inflight.get(node)  # a node answers for itself only (its id is authenticated)
            if cid is None and msg.has_error():
                # the SuperLink answers for an unreachable node itself, from node 0: match the error to
                # the message it answers, so that client is named and dropped once
                cid = by_message.get(msg.metadata.reply_to_message_id)
            if cid is not None:
                answered.add(cid)
            if msg.has_error():
                dropped.append({"client": cid, "reason": f"client error: {msg.error.reason}"})
                continue
            if cid is None:
                dropped.append({"client": None, "reason": f"reply from unexpected node {node}"})
                continue
            keys = self.travelling_keys(self.uplink_groups(cid, server_round), cid, server_round) if task == "train" else []
            expected = {k: self.template[k] for k in keys}
            if task == "train":
                expected.update({EXTRA_PREFIX + k: spec for k, spec in self.extra_uplink(cid, server_round).items()})
            info = self.clients.get(cid)
            try:
                update = validate_reply(
                    msg.content,
                    node_id=node,
                    expected_client=cid,
                    expected_arrays=expected,
                    expected_train_size=info.num_train if info else None,
                    expected_test_size=info.num_test if info else None,
                )
                extra = [k for k in update.arrays if k.startswith(EXTRA_PREFIX)]
                update.extra = {k[len(EXTRA_PREFIX):]: update.arrays.pop(k) for k in extra}
                updates.append(update)
            except InvalidReply as exc:
                # a rejected reply's arrays crossed the network all the same: they count in bytes_up
                nbytes = sum(record_bytes(r) for r in msg.content.array_records.values())
                dropped.append({"client": cid, "reason": str(exc), **({"bytes": nbytes} if nbytes else {})})
        for cid in self._inflight.values():
            if cid not in answered:
                dropped.append({"client": cid, "reason": "no reply before the round timeout"})
        for d in dropped:
            log(WARNING, "round %d: dropped reply of client %s: %s", server_round, d["client"], d["reason"])
        return updates, dropped

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        updates, dropped = self._collect(server_round, replies, "train")
        groups_up = {group_of(k) for u in updates for k in u.arrays}
        record: dict[str, Any] = {
            "round": server_round,
            "clients": sorted(u.client_id for u in updates),
            "dropped": dropped,
            "bytes_down": self._bytes_down,
            "bytes_up": sum(u.bytes_up for u in updates) + sum(d.get("bytes", 0) for d in dropped),  # all that arrived
            "groups_down": [g for g in self.groups if g in self._groups_down],
            "groups_up": [g for g in self.groups if g in groups_up],
        }
        if len(updates) < self.min_replies:
            log(WARNING, "round %d: %d valid replies < min_replies=%d; model unchanged", server_round, len(updates), self.min_replies)
            record["skipped"] = True
        else:
            record.update(weighted_test_metrics([u.metrics for u in updates]))
            record.update(client_time_totals([u.metrics for u in updates]))
            record.update(self.aggregate(server_round, updates))
        self.history.append(record)
        scalars = {k: float(v) for k, v in record.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        return self.global_record(), MetricRecord(scalars)

    def global_record(self) -> ArrayRecord:
        return ArrayRecord(array_dict={k: Array(v) for k, v in self.global_arrays.items()})

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Final evaluation: every known client evaluates the model it would use now."""
        self.discover(grid, wait_for=0, timeout=0)
        self._inflight, self._sent, self._bytes_down, self._groups_down = {}, {}, 0, set()
        ids = sorted(self.clients)
        down = self.downlinks(ids, server_round)
        return [self._message(cid, server_round, "evaluate", MessageType.EVALUATE, down.pop(cid), {}) for cid in ids]

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        updates, dropped = self._collect(server_round, replies, "evaluate")
        if not updates:
            return None
        total = sum(u.metrics["test_size"] for u in updates)
        metrics = {
            "final_acc": sum(u.metrics["test_correct"] for u in updates) / total,
            "final_loss": sum(u.metrics["test_loss_sum"] for u in updates) / total,
            "final_clients": float(len(updates)),
        }
        self.final_metrics = {**metrics, "dropped": dropped}
        return MetricRecord(metrics)

    # ------------------------------------------------------------------ checkpoint/resume
    def last_round(self) -> int:
        """The last round aggregated (0 before the first)."""
        return int(self.history[-1]["round"]) if self.history else 0

    def extra_state(self) -> dict[str, Any]:
        """The method's server state to checkpoint: by default every instance attribute that
        the base does not own and ``checkpoint_exclude`` does not list (live references)."""
        skip = BASE_ATTRS | set(self.checkpoint_exclude)
        return {k: v for k, v in vars(self).items() if k not in skip}

    def load_extra_state(self, state: Mapping[str, Any]) -> None:
        """Inverse of :meth:`extra_state`: by default set each saved attribute."""
        for key, value in state.items():
            setattr(self, key, value)

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue the run after :meth:`last_round` (live references:
        :func:`strategies.checkpoint.save_checkpoint` encodes them at once)."""
        return {
            "method": self.name,
            "round": self.last_round(),
            "run_token": str(self.client_spec.get("run", "")),
            "global_arrays": self.global_arrays,
            "history": self.history,
            "rng": self.rng.bit_generator.state,
            "torch_rng": torch.get_rng_state(),
            "extra": self.extra_state(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` (a :meth:`state_dict`, e.g. decoded from a checkpoint).

        The strategy must be built from the same config and run token; the arrays must fit
        the model. Clients are not restored: they are discovered again (new node ids).
        """
        if state["method"] != self.name:
            raise ValueError(f"the checkpoint is of method {state['method']!r}, this strategy is {self.name!r}")
        token = str(self.client_spec.get("run", ""))
        if state["run_token"] != token:
            raise ValueError(
                f"the checkpoint belongs to run {state['run_token']!r}, this strategy to {token!r}: build it with "
                "the checkpoint's run token, or the clients will not find their personal state"
            )
        arrays = state["global_arrays"]
        bad = sorted(set(arrays) ^ set(self.template)) + sorted(
            k for k in set(arrays) & set(self.template)
            if (np.shape(arrays[k]), np.asarray(arrays[k]).dtype) != self.template[k]
        )
        if bad:
            raise ValueError(f"the checkpoint's global arrays do not fit this model (keys {bad[:5]}): was the model changed?")
        self.global_arrays = {k: np.array(arrays[k], copy=True) for k in self.template}
        self.history = [dict(r) for r in state["history"]]
        if self.last_round() != int(state["round"]):
            raise ValueError(f"the checkpoint says round {state['round']} but its history ends at round {self.last_round()}")
        self.rng.bit_generator.state = state["rng"]
        torch.set_rng_state(state["torch_rng"])
        self.load_extra_state(state["extra"])

    # ------------------------------------------------------------------ the run loop
    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord | None = None,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
        on_round: RoundCallback | None = None,
    ) -> Result:
        """Discover clients, run rounds ``last_round()+1 .. num_rounds``, then the final evaluation.

        A fresh strategy starts at round 1; one restored with :meth:`load_state_dict` goes on
        after its last round. ``on_round`` receives each round's record as soon as it is
        aggregated, with the strategy's state complete for that round (the runner appends the
        record to metrics.jsonl, then writes the checkpoint, before the next round starts).
        """
        first = self.last_round() + 1
        if first > num_rounds + 1:
            raise ValueError(f"the strategy has already run {first - 1} rounds; num_rounds={num_rounds} is fewer")
        if first > 1:
            log(INFO, "Resuming %s after round %d (%d rounds)", self.name, first - 1, num_rounds)
        else:
            log(INFO, "Starting %s (%d rounds)", self.name, num_rounds)
        self.summary()
        self._message_ttl = timeout + TTL_MARGIN_S
        if initial_arrays is not None and first == 1:
            for k, arr in initial_arrays.items():
                self.global_arrays[k] = arr.numpy()
        self.discover(grid)
        result = Result()
        for rnd in range(first, num_rounds + 1):
            t0 = time.perf_counter()
            replies = grid.send_and_receive(self.configure_train(rnd, ArrayRecord(), ConfigRecord(), grid), timeout=timeout)
            arrays, metrics = self.aggregate_train(rnd, replies)
            record = self.history[-1]
            record["round_time_s"] = time.perf_counter() - t0
            result.arrays = arrays
            if metrics is not None:
                result.train_metrics_clientapp[rnd] = metrics
            log(INFO, "%s", format_round(record, num_rounds))
            if on_round is not None:
                on_round(record)
        if self.final_eval:
            replies = grid.send_and_receive(
                self.configure_evaluate(num_rounds, ArrayRecord(), ConfigRecord(), grid), timeout=timeout
            )
            final = self.aggregate_evaluate(num_rounds, replies)
            if final is not None:
                result.evaluate_metrics_clientapp[num_rounds] = final
                log(INFO, "final evaluation over %d clients: acc %.4f", int(final["final_clients"]), final["final_acc"])
        return result


def format_round(record: Mapping[str, Any], num_rounds: int) -> str:
    """One human line per round, printed while the run goes."""
    def pct(key: str) -> str:
        return f"{100 * record[key]:6.2f}%" if key in record else "   n/a "

    extra = "".join(f" | {k} {record[k]}" for k in record.get("log_keys", []))
    return (
        f"[round {record['round']:>3}/{num_rounds}] test_before {pct('test_before_acc')} "
        f"test_after {pct('test_after_acc')} | clients {len(record['clients'])}"
        f"{' (-' + str(len(record['dropped'])) + ' dropped)' if record['dropped'] else ''} | "
        f"down {record['bytes_down'] / 2**20:.3f} MiB up {record['bytes_up'] / 2**20:.3f} MiB | "
        f"{record.get('round_time_s', 0):.1f}s{extra}"
    )
