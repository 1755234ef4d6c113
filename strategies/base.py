"""The strategy base every pflower method builds on.

It owns what all personalized methods share: client discovery (stable client ids, not
Flower node ids), seeded sampling, one Message per node with only the tensors that node
must receive, reply validation, byte accounting, the evaluation protocol and the
per-round record. A method overrides a few hooks that say what is different about it:

- :meth:`personal_groups`: layer groups that stay on the client (FedPer: the classifier);
- :meth:`personal_keys`: single keys of shared groups that stay too (FedBN: BN affine);
- :meth:`downlinks` / :meth:`extra_downlinks`: what a round's clients receive, all at once
  (default: the global values of each client's shared groups; pFedSim mixes stored models here);
- :meth:`uplink_groups`: the groups a client sends back (default: the shared ones);
  :meth:`uplink_sets`: the key sets a client may choose from instead (BLS's layer prefixes);
- :meth:`role_config`: arguments of the client role (a :class:`protocol.roles.RoleArgs`);
- :meth:`extra_uplink`: arrays besides model tensors a reply carries (FedAP: BN statistics);
- :meth:`sample`: this round's clients (default: a seeded uniform draw; FedCPMD: per cluster);
- :meth:`aggregate`: the server update (default: FedAvg of what was uploaded, per architecture);
- :meth:`run_summary`: values for ``summary.json``.
Class attributes say what the clients keep and what travels: ``client_keeps`` (``"personal"``:
personal groups, keys and BN buffers; ``"model"``: the whole model, so a tensor a round does not
send keeps the client's own last value), ``shared_buffers`` (float BN buffers travel with their
group and are averaged), ``heterogeneous`` (clients may run different architectures).

Architectures: the server holds a :class:`models.schema.ModelSchema` per architecture and looks
a client's up by its client id (:meth:`schema`); a homogeneous run is the one-architecture case.
Each architecture has its own global arrays (:attr:`arch_arrays`; :attr:`global_arrays` is the
one model of a homogeneous run).

Determinism: replies are aggregated in client-id order, never in arrival order, so a run's
numbers depend on its seed and config, not on which client answered first.

Checkpoint/resume (:meth:`state_dict` / :meth:`load_state_dict`, file format in
:mod:`strategies.checkpoint`). The base saves the last completed round, the global arrays,
the round history, the run token, the sampling RNG's state and torch's CPU RNG state, plus
the method's state from :meth:`extra_state`. By default that is *every instance attribute
the base does not own* (``vars(self)`` minus :data:`BASE_ATTRS`), so a method's server
state (per-client stores, similarity matrices, votes, clusters, dataclasses, torch modules,
NumPy generators created in ``__init__``...) is checkpointed and restored with no code in the
method. A method opts out with ``checkpoint_exclude = ("cache",)`` (attributes that a fresh
strategy rebuilds from the config), or overrides :meth:`extra_state` / :meth:`load_extra_state`
(call ``super()`` to keep the generic part) for objects created lazily or not encodable.
Values that cannot be encoded are refused before round 1.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from models import LayeredNet, group_of
from models.schema import ModelSchema, Template, assign_archs, initial_arrays
from protocol import wire
from protocol.roles import RoleArgs
from protocol.wire import WIRE_EXTRA_PREFIX, TaskSpec

from .aggregation import fedavg
from .client_directory import ClientDirectory, ClientInfo, ClientStateLost
from .diagnostics import Panel
from .evaluation import client_time_totals, weighted_test_metrics
from .messaging import TTL_MARGIN_S, send_and_receive
from .replies import collect_replies as collect_batch
from .round_ledger import RoundLedger
from .round_log import format_round, id_list, run_elapsed
from .schedule import LRSchedule
from .store import ClientStore
from .validation import ClientUpdate, record_bytes

RoundCallback = Callable[[dict[str, Any]], None]
EvaluateFn = Callable[[int, ArrayRecord], "MetricRecord | None"]

# instance attributes the base owns: saved explicitly by state_dict() or deliberately not at all
# (config-derived, or per-connection like ``clients``: node ids change when a SuperNode restarts)
BASE_ATTRS = frozenset({
    "schemas", "default_arch", "arch_of", "arch_arrays", "client_spec", "lr_schedule", "num_clients", "fraction",
    "min_clients", "min_available", "min_replies", "seed", "final_eval", "discover_timeout", "rng", "directory",
    "history", "final_metrics", "ledger", "_message_ttl", "_announced",
    "_round_timeout", "_store_mode", "_store_dir", "resume_force", "elapsed_before",
})

STORE_MODES = ("memory", "disk", "auto")
AUTO_DISK_BYTES = 2 * 2**30  # server_store=auto keeps a store on disk above this

# hooks that moved: a subclass defining one of these would be silently ignored
_RETIRED_HOOKS = {
    "downlink": "downlinks(client_ids, server_round) (a whole round at once)",
    "extra_downlink": "extra_downlinks(client_ids, server_round) (a whole round at once)",
}


class PersonalizedStrategy(Strategy):
    """Base of every pflower method: FedAvg-shaped rounds with per-client messages."""

    # the per-round diagnostics that show this method's mechanism (pflower report draws them)
    diagnostic_panels: tuple[Panel, ...] = ()

    name = "base"
    role = "sgd"
    client_keeps = "personal"  # "personal" | "model" (wire.KEEP_MODES)
    shared_buffers = False  # float BN buffers travel with their group and are averaged (off: they never leave)
    heterogeneous = False  # the method supports clients of different architectures
    checkpoint_exclude: tuple[str, ...] = ()  # method attributes not checkpointed (rebuilt from the config)
    # the final evaluation also scores every client's model on the labelled global test set (the
    # runner switches it on with dataset.public=test|holdout for methods with clients_evaluate_on_public)
    clients_evaluate_on_public = False
    final_global_test = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for hook, instead in _RETIRED_HOOKS.items():
            if hook in cls.__dict__:
                raise TypeError(f"{cls.__name__} defines {hook}(); override {instead} instead")
        if cls.client_keeps not in wire.KEEP_MODES:
            raise TypeError(f"{cls.__name__}.client_keeps must be one of {list(wire.KEEP_MODES)}")

    def __init__(
        self,
        model: LayeredNet | Mapping[str, LayeredNet],
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
        spec = dict(client_spec)
        arch_specs = spec.pop("archs", None)
        rule = spec.pop("assign", None) or "blocks"
        self.lr_schedule = LRSchedule.from_config(spec.pop("lr_schedule", None))
        store = spec.pop("server_store", None) or {}
        self._store_mode, self._store_dir = str(store.get("mode", "memory")), store.get("dir")
        if self._store_mode not in STORE_MODES:
            raise ValueError(f"server_store must be one of {list(STORE_MODES)}, got {self._store_mode!r}")
        if isinstance(model, LayeredNet):
            model_spec = dict(spec.get("model") or {"name": "model"})
            models = {str(model_spec.get("name", "model")): model}
            arch_specs = {next(iter(models)): model_spec}
        else:
            models = dict(model)
            if not models:
                raise ValueError("a federation needs at least one architecture")
            arch_specs = dict(arch_specs or {})
            missing = sorted(set(models) - set(arch_specs))
            if missing:
                raise ValueError(f"client_spec['archs'] lacks the model spec of architecture(s) {missing}")
        if len(models) > 1 and not self.heterogeneous:
            raise ValueError(
                f"method {self.name!r} runs one architecture on every client, but the config names {sorted(models)}: "
                "use a method for heterogeneous clients (fedavg averages each architecture apart, felo, velo, fedhe, local)"
            )
        self.schemas = {arch: ModelSchema.of(m, arch, arch_specs[arch]) for arch, m in models.items()}
        self.default_arch = next(iter(self.schemas))
        self.arch_of: dict[int, str] = assign_archs(rule, list(self.schemas), num_clients)
        self._announced: dict[int, str] = {}  # client id -> the architecture its node announced
        self.arch_arrays: dict[str, dict[str, np.ndarray]] = {
            arch: initial_arrays(m, self.schemas[arch].keys(buffers=self.shared_buffers)) for arch, m in models.items()
        }
        spec["model"] = dict(self.schemas[self.default_arch].spec)
        self.client_spec = spec
        self.num_clients = num_clients
        self.fraction = fraction
        self.min_clients = min_clients
        self.min_available = num_clients if min_available is None else min_available
        self.min_replies = min_replies
        self.seed = seed
        self.final_eval = final_eval
        self.discover_timeout = discover_timeout
        self.rng = np.random.default_rng(seed)
        self.directory = ClientDirectory(num_clients, discover_timeout, self._check_announced)
        self.history: list[dict[str, Any]] = []
        self.final_metrics: dict[str, Any] = {}
        self.ledger = RoundLedger()  # the messages of the batch under way (one reset() per batch)
        self._message_ttl: float | None = None  # set by start(): the round timeout + TTL_MARGIN_S
        self._round_timeout: float | None = None  # set by start(): the wait for a round's replies
        # a resumed run goes on although clients lost their state (config resume_force): they are
        # recorded in the round's ``client_state_lost``; without it the resume is refused
        self.resume_force = False
        self.elapsed_before = 0.0  # seconds of the rounds run before this process's segment (set by start)

    # ------------------------------------------------------------------ architectures
    @property
    def round_timeout(self) -> float | None:
        """Seconds a round waits for its replies (None before the run starts): what a method that
        sends a batch of its own waits for it."""
        return self._round_timeout

    def schema(self, client_id: int | None = None) -> ModelSchema:
        """The model schema of ``client_id`` (the default architecture's if None)."""
        return self.schemas[self.default_arch if client_id is None else self.arch_of[client_id]]

    def arrays_of(self, client_id: int) -> dict[str, np.ndarray]:
        """The global arrays of ``client_id``'s architecture."""
        return self.arch_arrays[self.arch_of[client_id]]

    def client_store(self, name: str, bytes_per_client: int = 0) -> ClientStore:
        """A per-client array store for the method's server state (stored bodies, models).

        ``server_store``: ``memory``, ``disk`` (``<run dir>/server_store/<name>``, memory-mapped) or
        ``auto``: on disk when ``bytes_per_client`` for every client would exceed
        :data:`AUTO_DISK_BYTES` (100 VGG11 bodies are about 50 GiB)."""
        disk = self._store_mode == "disk" or (
            self._store_mode == "auto" and bytes_per_client * self.num_clients > AUTO_DISK_BYTES
        )
        if disk and not self._store_dir:
            log(WARNING, "%s: no run directory for an on-disk server store; %s stays in memory", self.name, name)
            disk = False
        if disk:
            log(INFO, "%s keeps %s on disk under %s", self.name, name, self._store_dir)
        return ClientStore(f"{self._store_dir}/{name}" if disk else None)

    def _single_arch(self) -> str:
        if len(self.schemas) > 1:
            raise AttributeError(
                f"{type(self).__name__} asked for the one global model, but this federation runs {sorted(self.schemas)}: "
                "use arch_arrays[arch] / arrays_of(client_id)"
            )
        return self.default_arch

    @property
    def global_arrays(self) -> dict[str, np.ndarray]:
        """The global model of a homogeneous run (every travelling tensor, by key)."""
        return self.arch_arrays[self._single_arch()]

    @global_arrays.setter
    def global_arrays(self, value: dict[str, np.ndarray]) -> None:
        self.arch_arrays[self._single_arch()] = value

    @property
    def groups(self) -> list[str]:
        """Layer groups of the default architecture, in forward order."""
        return list(self.schema().groups)

    @property
    def group_keys(self) -> dict[str, list[str]]:
        return {g: list(k) for g, k in self.schema().group_keys.items()}

    @property
    def template(self) -> Template:
        """Shape and dtype of every tensor of the default architecture that may travel."""
        return self.template_of(None)

    def template_of(self, client_id: int | None) -> Template:
        schema = self.schema(client_id)
        return {k: schema.template[k] for k in schema.keys(buffers=self.shared_buffers)}

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
        parameters (:func:`strategies.aggregation.mixing_average`).
        """
        out = {}
        for cid in client_ids:
            arrays = self.arrays_of(cid)
            out[cid] = {k: arrays[k] for k in self.travelling_keys(self.shared_groups(cid, server_round), cid, server_round)}
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

    # ------------------------------------------------------------------ helpers
    def keys(self, groups: Iterable[str] | None = None, client_id: int | None = None) -> list[str]:
        """Keys of ``groups`` that belong to the model on the wire (trainable tensors, and float
        buffers with ``shared_buffers``), in forward order, in ``client_id``'s architecture."""
        return self.schema(client_id).keys(groups, buffers=self.shared_buffers)

    def summary(self) -> None:
        log(INFO, "\t├── method: %s (client role %s)", self.name, self.role)
        log(INFO, "\t├── clients: %d, fraction %.2f, seed %d", self.num_clients, self.fraction, self.seed)
        if len(self.schemas) > 1:
            counts = {a: sum(1 for v in self.arch_of.values() if v == a) for a in self.schemas}
            log(INFO, "\t├── architectures: %s", ", ".join(f"{a} ({n} clients)" for a, n in counts.items()))
        log(INFO, "\t└── layer groups: %s", ", ".join(self.groups))

    def sample_size(self) -> int:
        return max(self.min_clients, int(self.fraction * self.num_clients))

    def draw(self, population: Sequence[int], k: int) -> list[int]:
        """``k`` distinct client ids from ``population``, uniformly, from the run's seeded stream (sorted)."""
        pool = np.asarray(list(population), dtype=np.int64)
        if len(pool) == 0 or k <= 0:
            return []
        return sorted(int(c) for c in self.rng.choice(pool, size=min(k, len(pool)), replace=False))

    def sample(self, server_round: int) -> list[int]:
        """This round's client ids: a seeded uniform draw, the same stream for every method
        (fedcmd.md A13). Override to sample differently (FedCPMD: per cluster, from :meth:`draw`)."""
        return self.draw(range(self.num_clients), self.sample_size())

    def connected(self, client_ids: Iterable[int], server_round: int) -> list[int]:
        """The sampled clients that are connected now (sorted); the others are logged."""
        chosen = sorted(set(int(c) for c in client_ids))
        available = [c for c in chosen if c in self.clients]
        missing = [c for c in chosen if c not in self.clients]
        if missing:
            log(WARNING, "round %d: sampled clients %s are not connected; training without them", server_round, missing)
        return available

    def train_config(self, client_id: int, server_round: int) -> dict[str, Any]:
        """The local-training arguments of this round (the learning rate from ``lr_schedule``)."""
        train = dict(self.client_spec.get("train", {}))
        if "lr" in train and server_round > 0:
            train["lr"] = self.lr_schedule.lr(float(train["lr"]), server_round)
        return train

    def task_spec(self, client_id: int, server_round: int, task: str) -> TaskSpec:
        """What one message asks of its client (see :class:`protocol.wire.TaskSpec`)."""
        schema = self.schema(client_id)
        args = self.role_config(client_id, server_round) if task != "query" else {}
        base = self.client_spec
        return TaskSpec(
            run=str(base.get("run", "")),
            seed=int(base.get("seed", 0)),
            model=dict(schema.spec),
            arch=schema.arch,
            data=dict(base.get("data", {})),
            train=self.train_config(client_id, server_round),
            task=task,
            role=self.role,
            role_args=args.to_dict() if isinstance(args, RoleArgs) else dict(args),
            personal=list(self.personal_groups(client_id, server_round)) if task != "query" else [],
            personal_keys=list(self.personal_keys(client_id, server_round)) if task != "query" else [],
            upload=list(self.uplink_groups(client_id, server_round)) if task == "train" else [],
            keep=self.client_keeps,
            shared_buffers=self.shared_buffers,
            device=str(base.get("device", "auto")),
            deterministic=bool(base.get("deterministic", False)),
            client_state_dir=base.get("client_state_dir"),
            state_versions=int(base.get("state_versions", 1)),
            global_test=task == "evaluate" and self.final_global_test,
        )

    def _config(self, client_id: int, server_round: int, task: str) -> ConfigRecord:
        spec = self.task_spec(client_id, server_round, task)
        return ConfigRecord({wire.ROUND_KEY: server_round, wire.CLIENT_KEY: client_id, wire.SPEC_KEY: spec.to_json()})

    def build_message(
        self,
        client_id: int,
        server_round: int,
        task: str,
        message_type: str,
        down: Mapping[str, np.ndarray],
        extra: Mapping[str, np.ndarray],
    ) -> Message:
        """The message of ``task`` for ``client_id``: ``down`` (model tensors) and ``extra`` (method
        tensors) with the task spec, entered in the round's :class:`RoundLedger`. A method that
        sends a batch of its own (FedCPMD's probes) resets the ledger, builds its messages with
        this, and reads the replies with :meth:`collect_replies`."""
        arrays = ArrayRecord(array_dict={k: Array(np.ascontiguousarray(v)) for k, v in down.items()})
        for k, v in extra.items():
            arrays[WIRE_EXTRA_PREFIX + k] = Array(np.ascontiguousarray(v))
        template = self.template_of(client_id)
        groups = {group_of(k) for k in down} | {group_of(k.split("/", 1)[-1]) for k in extra if k.split("/", 1)[-1] in template}
        content = RecordDict({wire.ARRAYS_RECORD: arrays, wire.CONFIG_RECORD: self._config(client_id, server_round, task)})
        node = self.clients[client_id].node_id
        message = Message(content=content, message_type=message_type, dst_node_id=node, ttl=self._message_ttl)
        self.ledger.record(client_id, message, record_bytes(arrays), groups)
        return message

    def _ordered_groups(self, groups: set[str]) -> list[str]:
        """``groups`` in forward order (of the first architecture that has each)."""
        order = [g for s in self.schemas.values() for g in s.groups]
        return sorted(groups, key=order.index)

    # ------------------------------------------------------------------ discovery
    @property
    def clients(self) -> dict[int, ClientInfo]:
        """The connected clients by client id (the directory's; kept current by :meth:`discover`)."""
        return self.directory.clients

    def discover(self, grid: Grid, wait_for: int | None = None, timeout: float | None = None) -> None:
        """Map connected nodes to stable client ids (a restarted SuperNode gets a new node id);
        waits until ``wait_for`` (default ``min_available``) clients are known or ``timeout``
        (default ``discover_timeout``) passes."""
        hello = TaskSpec(
            run=str(self.client_spec.get("run", "")), seed=int(self.client_spec.get("seed", 0)),
            model=dict(self.schema().spec), arch=self.default_arch, data=dict(self.client_spec.get("data", {})),
            train=dict(self.client_spec.get("train", {})), task="query",
            client_state_dir=self.client_spec.get("client_state_dir"),
        )
        self.directory.discover(
            grid, hello, self.min_available if wait_for is None else wait_for,
            self.discover_timeout if timeout is None else timeout,
        )

    # ------------------------------------------------------------------ resume: the clients' state
    def trained_rounds(self) -> dict[int, int]:
        """Client id -> the last round it trained in (from the round history)."""
        last: dict[int, int] = {}
        for record in self.history:
            for cid in record.get("clients", []):
                last[int(cid)] = int(record["round"])
        return last

    def clients_without_state(self) -> list[int]:
        """Connected clients that trained before and hold no state saved after their last round:
        their personal tensors and BN statistics are gone (a new simulation without a client state
        directory, a SuperNode restarted without ``state-dir``)."""
        trained = self.trained_rounds()
        return [c for c in sorted(self.clients) if self.clients[c].state_round < trained.get(c, 0)]

    def check_client_state(self, resumed_after: int) -> list[int]:
        """At a resume: refuse (``ClientStateLost``) when clients lost their state, unless
        ``resume_force``; then returns them (the next round records them as ``client_state_lost``)."""
        lost = self.clients_without_state()
        if not lost:
            return []
        where = self.client_spec.get("client_state_dir")
        how = (
            f"the run keeps client state under {where}; it holds none for these clients"
            if where else "the run kept client state only in its processes' memory (client_state_dir: null)"
        )
        message = (
            f"cannot resume after round {resumed_after} exactly: client(s) {id_list(lost)} trained before and hold no "
            f"state for this run ({how}; a deployed SuperNode keeps it across restarts only with --node-config "
            "\"state-dir='<dir>'\"). Continuing would restart their personal layers and BN statistics and change the "
            "results. Start the run again, bring back the nodes with their state, or pass resume_force=true to go on "
            "anyway (the run is marked: client_state_lost in its metrics and summary)"
        )
        if not self.resume_force:
            raise ClientStateLost(message)
        log(WARNING, "resume_force: %s", message)
        return lost

    def _check_announced(self, client_id: int, announced: str | None) -> str | None:
        """Take the architecture a node announced (node config ``model``); the refusal reason, if any."""
        if announced is None:
            return None
        if announced not in self.schemas:
            return (
                f"client {client_id} runs model {announced!r} (its node config), but this run's architectures are "
                f"{sorted(self.schemas)}: set the node's model to one of them, or add it to model.archs"
            )
        before = self._announced.get(client_id)
        if before is not None and before != announced:
            return f"client {client_id} ran {before!r} earlier in this run and now announces {announced!r}: one client, one model"
        if self.arch_of.get(client_id) != announced:
            log(INFO, "client %d runs %s (announced by its node; the config's rule gave %s)", client_id, announced, self.arch_of.get(client_id))
        self._announced[client_id] = announced
        self.arch_of[client_id] = announced
        return None

    # ------------------------------------------------------------------ Flower hooks
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self.discover(grid, wait_for=0, timeout=0)
        self.ledger.reset()
        ids = self.connected(self.sample(server_round), server_round)
        down, extra = self.downlinks(ids, server_round), self.extra_downlinks(ids, server_round)
        # pop: each client's arrays are freed once its message holds them (peak: one round of messages)
        return [self.build_message(cid, server_round, "train", MessageType.TRAIN, down.pop(cid), extra.pop(cid)) for cid in ids]

    def expected_uploads(self, client_id: int, server_round: int) -> list[Template]:
        """The key sets (with shapes) a train reply of ``client_id`` may carry (model tensors and extras)."""
        template = self.template_of(client_id)
        sets = self.uplink_sets(client_id, server_round)
        if sets is None:
            sets = [self.travelling_keys(self.uplink_groups(client_id, server_round), client_id, server_round)]
        extra = {WIRE_EXTRA_PREFIX + k: spec for k, spec in self.extra_uplink(client_id, server_round).items()}
        return [{**{k: template[k] for k in keys}, **extra} for keys in sets]

    def collect_replies(self, server_round: int, replies: Iterable[Message], task: str) -> tuple[list[ClientUpdate], list[dict]]:
        """The replies to the ledger's batch: valid updates in client-id order (never arrival
        order) and the dropped replies (errors, invalid ones, and clients that never answered)."""
        expected = (lambda cid: self.expected_uploads(cid, server_round)) if task == "train" else (lambda cid: [{}])
        return collect_batch(server_round, replies, task, self.ledger, self.clients, expected)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        updates, dropped = self.collect_replies(server_round, replies, "train")
        groups_up = {group_of(k) for u in updates for k in u.arrays}
        record: dict[str, Any] = {
            "round": server_round,
            "clients": [u.client_id for u in updates],
            "dropped": dropped,
            "bytes_down": self.ledger.bytes_down,
            "bytes_up": sum(u.bytes_up for u in updates) + sum(d.get("bytes", 0) for d in dropped),  # all that arrived
            "groups_down": self._ordered_groups(self.ledger.groups_down),
            "groups_up": self._ordered_groups(groups_up),
        }
        if len(updates) < self.min_replies:
            log(WARNING, "round %d: %d valid replies < min_replies=%d; model unchanged", server_round, len(updates), self.min_replies)
            record["skipped"] = True
        else:
            record.update(weighted_test_metrics([u.metrics for u in updates]))
            record.update(self._per_arch(updates, lambda ms: {k: v for k, v in weighted_test_metrics(ms).items() if k.startswith("test_")}))
            record.update(client_time_totals([u.metrics for u in updates]))
            record.update(self.aggregate(server_round, updates))
        self.history.append(record)
        scalars = {k: float(v) for k, v in record.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        return self.global_record(), MetricRecord(scalars)

    def _per_arch(self, updates: Sequence[ClientUpdate], summarize: Callable[[list[dict]], dict[str, float]]) -> dict[str, float]:
        """``summarize`` of each architecture's clients, as ``<key>@<arch>`` (heterogeneous runs only)."""
        if len(self.schemas) == 1:
            return {}
        out: dict[str, float] = {}
        for arch in self.schemas:
            ms = [u.metrics for u in updates if self.arch_of[u.client_id] == arch]
            if ms:
                out.update({f"{k}@{arch}": v for k, v in summarize(ms).items()})
        return out

    def global_record(self) -> ArrayRecord:
        """The default architecture's global arrays (what Flower's ``Result.arrays`` holds)."""
        return ArrayRecord(array_dict={k: Array(v) for k, v in self.arch_arrays[self.default_arch].items()})

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Final evaluation: every known client evaluates the model it would use now."""
        self.discover(grid, wait_for=0, timeout=0)
        self.ledger.reset()
        ids = sorted(self.clients)
        down = self.downlinks(ids, server_round)
        return [self.build_message(cid, server_round, "evaluate", MessageType.EVALUATE, down.pop(cid), {}) for cid in ids]

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        updates, dropped = self.collect_replies(server_round, replies, "evaluate")
        if not updates:
            return None
        total = sum(u.metrics[wire.TEST_SIZE] for u in updates)
        metrics = {
            "final_acc": sum(u.metrics["test_correct"] for u in updates) / total,
            "final_loss": sum(u.metrics["test_loss_sum"] for u in updates) / total,
            "final_clients": float(len(updates)),
        }
        metrics.update(self._per_arch(updates, lambda ms: {
            "final_acc": sum(m["test_correct"] for m in ms) / sum(m[wire.TEST_SIZE] for m in ms),
        }))
        if self.final_global_test and all(wire.GLOBAL_TEST_SIZE in u.metrics for u in updates):
            # the mean over the clients' models (each on the whole global test set)
            metrics["final_global_acc"] = float(np.mean([u.metrics["global_correct"] / u.metrics[wire.GLOBAL_TEST_SIZE] for u in updates]))
            metrics.update(self._per_arch(updates, lambda ms: {
                "final_global_acc": float(np.mean([m["global_correct"] / m[wire.GLOBAL_TEST_SIZE] for m in ms])),
            }))
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
            "global_arrays": self.arch_arrays[self.default_arch],
            "history": self.history,
            "rng": self.rng.bit_generator.state,
            "torch_rng": torch.get_rng_state(),
            "extra": self.extra_state(),
            # heterogeneous runs: the other architectures' global arrays, and who runs which
            "arch_arrays": {a: v for a, v in self.arch_arrays.items() if a != self.default_arch},
            "arch_of": {str(c): a for c, a in sorted(self.arch_of.items())},
            "announced": {str(c): a for c, a in sorted(self._announced.items())},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` (a :meth:`state_dict`, e.g. decoded from a checkpoint).

        The strategy must be built from the same config and run token; the arrays must fit
        the models. Clients are not restored: they are discovered again (new node ids).
        """
        if state["method"] != self.name:
            raise ValueError(f"the checkpoint is of method {state['method']!r}, this strategy is {self.name!r}")
        token = str(self.client_spec.get("run", ""))
        if state["run_token"] != token:
            raise ValueError(
                f"the checkpoint belongs to run {state['run_token']!r}, this strategy to {token!r}: build it with "
                "the checkpoint's run token, or the clients will not find their personal state"
            )
        saved = {self.default_arch: state["global_arrays"], **dict(state.get("arch_arrays") or {})}
        if set(saved) != set(self.schemas):
            raise ValueError(f"the checkpoint holds architectures {sorted(saved)}, this run {sorted(self.schemas)}: was the model changed?")
        restored = {}
        for arch, arrays in saved.items():
            template = {k: spec for k, spec in self.schemas[arch].template.items() if k in self.arch_arrays[arch]}
            bad = sorted(set(arrays) ^ set(template)) + sorted(
                k for k in set(arrays) & set(template) if (np.shape(arrays[k]), np.asarray(arrays[k]).dtype) != template[k]
            )
            if bad:
                raise ValueError(f"the checkpoint's global arrays do not fit the model {arch} (keys {bad[:5]}): was the model changed?")
            restored[arch] = {k: np.array(arrays[k], copy=True) for k in template}
        self.arch_arrays = restored
        self.history = [dict(r) for r in state["history"]]
        if self.last_round() != int(state["round"]):
            raise ValueError(f"the checkpoint says round {state['round']} but its history ends at round {self.last_round()}")
        self.rng.bit_generator.state = state["rng"]
        torch.set_rng_state(state["torch_rng"])
        self.arch_of.update({int(c): str(a) for c, a in (state.get("arch_of") or {}).items()})
        self._announced = {int(c): str(a) for c, a in (state.get("announced") or {}).items()}
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
        evaluate_fn: EvaluateFn | None = None,
        on_round: RoundCallback | None = None,
    ) -> Result:
        """Discover clients, run rounds ``last_round()+1 .. num_rounds``, then the final evaluation.

        A fresh strategy starts at round 1; one restored with :meth:`load_state_dict` goes on
        after its last round. ``evaluate_fn(round, arrays)`` (Flower's server-side evaluation)
        is called after each round with the default architecture's global arrays; its metrics
        join the round's record with a ``server_`` prefix. ``on_round`` receives each round's
        record as soon as it is aggregated, with the strategy's state complete for that round
        (the runner appends the record to metrics.jsonl, then writes the checkpoint, before the
        next round starts).
        """
        first = self.last_round() + 1
        if first > num_rounds + 1:
            raise ValueError(f"the strategy has already run {first - 1} rounds; num_rounds={num_rounds} is fewer")
        if first > 1:
            log(INFO, "Resuming %s after round %d (%d rounds)", self.name, first - 1, num_rounds)
        else:
            log(INFO, "Starting %s (%d rounds)", self.name, num_rounds)
        self.summary()
        self._message_ttl, self._round_timeout = timeout + TTL_MARGIN_S, timeout
        if initial_arrays is not None and first == 1:
            for k, arr in initial_arrays.items():
                self.arch_arrays[self.default_arch][k] = arr.numpy()
        started = time.perf_counter()
        self.elapsed_before = run_elapsed(self.history)
        self.discover(grid)
        lost = self.check_client_state(first - 1) if first > 1 else []
        result = Result()
        for rnd in range(first, num_rounds + 1):
            t0 = time.perf_counter()
            replies = send_and_receive(grid, self.configure_train(rnd, ArrayRecord(), ConfigRecord(), grid), timeout)
            arrays, metrics = self.aggregate_train(rnd, replies)
            record = self.history[-1]
            if lost:
                record["client_state_lost"], lost = lost, []
            if evaluate_fn is not None:
                server = evaluate_fn(rnd, self.global_record())
                if server is not None:
                    record.update({f"server_{k}": float(v) for k, v in server.items()})
                    result.evaluate_metrics_serverapp[rnd] = server
            record["round_time_s"] = time.perf_counter() - t0
            record["run_elapsed_s"] = self.elapsed_before + (time.perf_counter() - started)
            result.arrays = arrays
            if metrics is not None:
                result.train_metrics_clientapp[rnd] = metrics
            log(INFO, "%s", format_round(record, num_rounds))
            if on_round is not None:
                on_round(record)
        if self.final_eval:
            replies = send_and_receive(grid, self.configure_evaluate(num_rounds, ArrayRecord(), ConfigRecord(), grid), timeout)
            final = self.aggregate_evaluate(num_rounds, replies)
            if final is not None:
                result.evaluate_metrics_clientapp[num_rounds] = final
                log(INFO, "final evaluation over %d clients: acc %.4f", int(final["final_clients"]), final["final_acc"])
        return result
