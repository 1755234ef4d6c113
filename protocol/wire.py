"""What crosses the wire between the ServerApp and a ClientApp: record keys, prefixes, the task spec.

Both sides import this module (the server never imports client code, the client never imports
strategies), so a key is spelled in one place. The spec is the JSON a train/evaluate message
carries in ``config["spec"]``: everything a client needs to rebuild its model and data and to run
its role, since a SuperNode knows only its own node config.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

# ---------------------------------------------------------------------------- record keys
CONFIG_RECORD = "config"  # the ConfigRecord of a server message
SPEC_KEY = "spec"  # ... its JSON task spec (TaskSpec)
ROUND_KEY = "server-round"
CLIENT_KEY = "client-id"  # also a reply metric: who answers
# ... and, for a ClientApp of the user's own (docs/api.md), the spec's essentials as plain keys
PLAIN_LR, PLAIN_EPOCHS, PLAIN_BATCH_SIZE = "lr", "local-epochs", "batch-size"
PLAIN_TASK = "task"  # discovery: "query" (it arrives as a train message: docs/api.md, the message contract)
PLAIN_UPLOAD_KEYS = "upload-keys"  # train messages: the state-dict keys the reply's ArrayRecord must hold
ARRAYS_RECORD = "arrays"
METRICS_RECORD = "metrics"
HELLO_RECORD = "hello"  # the ConfigRecord of a discovery reply (strings: the announced model)

NUM_EXAMPLES = "num-examples"  # training samples (FedAvg weight), checked against NUM_TRAIN
NUM_TRAIN, NUM_TEST = "num-train", "num-test"  # announced at discovery
NUM_PARTITIONS = "num-partitions"  # simulation only: lets the server check the node count
# announced at discovery: the newest round whose state the client holds for this run (0: none), so a
# resumed server can tell a client that kept its personal state from one that lost it
STATE_ROUND = "state-round"
# hello record (a JSON string): where a node's own data came from (dataset=local: meta.json's
# name and exported_from), so the run records the partition the nodes really hold
DATA_ORIGIN = "data-origin"
TEST_SIZE = "test_size"
GLOBAL_TEST_SIZE = "global_test_size"  # evaluate replies with spec.global_test: the global test set's size

# node config keys a SuperNode may set (--node-config "client-id=3 data-dir='...' model='resnet18'")
NODE_CLIENT_ID = "client-id"
NODE_PARTITION_ID = "partition-id"  # what Flower's simulation sets
NODE_DATA_DIR = "data-dir"
NODE_STATE_DIR = "state-dir"
NODE_MODEL = "model"  # the architecture this device runs (a key of the run's model.archs)

# Arrays that are not the model's own tensors travel under this prefix in a message
# ("extra/<name>/<key>"); roles see them without it (RoleContext.received_extra / upload_extra).
WIRE_EXTRA_PREFIX = "extra/"
# A role's own tensors kept between rounds are saved in the client state under this prefix
# ("extra.<key>"); they never travel.
STATE_EXTRA_PREFIX = "extra."

TASKS = ("query", "train", "evaluate")
KEEP_MODES = ("personal", "model", "none")  # what a client persists: see TaskSpec.keep
OPTIMIZERS = ("sgd", "adam")  # TaskSpec.train["optimizer"]: the local optimizer
# TaskSpec.train["optimizer_state"]: the local optimizer's state starts afresh every round
# (the papers' protocol) or runs on from the client's last round (the authors' Felo/Velo code);
# only "kept" travels, so a spec without it is one every pflower client reads
OPTIMIZER_STATES = ("fresh", "kept")


def unknown_fields(cls: type, values: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(keys of ``values`` that are no field of the dataclass ``cls``, its field names), sorted."""
    known = sorted(f.name for f in fields(cls))
    return sorted(set(values) - set(known)), known


class SpecError(ValueError):
    """A message spec this ClientApp cannot run; the message says what to fix (usually: update pflower)."""


@dataclass(frozen=True)
class TaskSpec:
    """The per-message task: built by the strategy base, read by the client runtime.

    ``model``: the architecture *this* client builds (name + options; per client in a
    heterogeneous federation), ``arch`` its name in the run's config (a node that announced its
    model checks it). ``personal``/``personal_keys``: groups and single keys that stay
    on the client. ``upload``: the groups to send back (the role may upload a declared subset,
    see the strategy's ``uplink_sets``). ``keep``: ``personal`` persists personal groups and keys
    and BN buffers; ``none`` only the role's own tensors (HeteroFL: a client whose width may
    change between rounds, its BN statistics recomputed before every evaluation); ``model``
    persists the whole model, so a tensor a round does not send keeps
    the client's own last value. ``shared_buffers``: float BN buffers travel with their group.
    ``global_test`` (evaluate tasks): the client also evaluates its model on the dataset's labelled
    public split, the global test set (FedHe: every client keeps its own model, so only the
    clients can evaluate them on it).
    """

    run: str
    seed: int
    model: dict[str, Any]
    data: dict[str, Any]
    train: dict[str, Any]
    task: str = "train"
    arch: str = ""
    role: str = "sgd"
    role_args: dict[str, Any] = field(default_factory=dict)
    personal: list[str] = field(default_factory=list)
    personal_keys: list[str] = field(default_factory=list)
    upload: list[str] = field(default_factory=list)
    keep: str = "personal"
    shared_buffers: bool = False
    device: str = "auto"
    deterministic: bool = False  # torch's deterministic kernels (config key deterministic)
    client_state_dir: str | None = None
    state_versions: int = 1
    global_test: bool = False

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise SpecError(f"spec task must be one of {list(TASKS)}, got {self.task!r}")
        if self.keep not in KEEP_MODES:
            raise SpecError(f"spec keep must be one of {list(KEEP_MODES)}, got {self.keep!r}")
        if self.state_versions < 1:
            raise SpecError(f"spec state_versions must be >= 1, got {self.state_versions}")

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TaskSpec:
        unknown, _ = unknown_fields(cls, values)
        if unknown:
            raise SpecError(
                f"the server's message has spec field(s) {unknown} this ClientApp does not know: "
                "the SuperNode runs an older pflower than the ServerApp (update pflower on the node)"
            )
        try:
            return cls(**values)
        except TypeError as exc:  # a required field missing
            raise SpecError(f"malformed pflower spec ({exc}); is the ServerApp a pflower ServerApp?") from exc

    @classmethod
    def from_json(cls, text: str) -> TaskSpec:
        try:
            values = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SpecError(f"the message's spec is not JSON ({exc})") from exc
        if not isinstance(values, dict):
            raise SpecError("the message's spec is not a JSON object")
        return cls.from_dict(values)
