"""The arguments of each client role, as dataclasses both sides share.

A field that carries a method's option (FedProx's ``mu``) has no default: the option's one
declaration is the method's options dataclass, and the strategy sends its value in every message.
A field with a default is the role's own (``phase``) or a neutral value for the methods that
share the role without having the option (``SGDArgs.finetune_epochs`` 0 for FedPer).

A strategy's ``role_config`` returns one of these; its constructor builds the values once, so a
bad option fails before round 1 with the option's name. The message carries them as a JSON
object, and the client role reads them back with :meth:`RoleArgs.from_dict`, which rejects
unknown keys and re-checks the values (a client does not trust a message blindly). Constants a
role and its strategy must agree on (extra-array prefixes, metric names, allowed values) live
here too.
"""

from __future__ import annotations

from dataclasses import MISSING, Field, asdict, dataclass, field, fields
from typing import Any, ClassVar

import numpy as np

from .wire import unknown_fields

# ---------------------------------------------------------------------------- shared constants
CLOUD_PREFIX = "u/"  # FedAMP: the cloud model u_i travels as extra arrays "u/<key>"
FOMO_WEIGHT_METRIC = "fomo_w_"  # FedFomo: a client's raw weight of peer j is metric "fomo_w_<j>"
REGULARIZER_PREFIX = "s/"  # KAPC: the regularizer s_i travels as extra arrays "s/<key>" (never loaded into the model)
FINETUNE_PARTS = ("all", "head")  # FedBABU: what the pre-evaluation fine-tuning updates
SCORE_MODES = ("paper", "code")  # FedCMD layer score (FedCMD paper, layer score (Eq. 5/6))
W2_MODES = ("gaussian", "mean_only")
SELECTION_TIMINGS = ("during_training", "after_training")
GRANULARITIES = ("batch", "dataset")
SELECTORS = (
    "eq7",
    "fedcmd_code",
    "eq6",
)  # FedCPMD's layer score (FedCPMD paper, layer-wise knowledge representation (Eqs. 6-11))
DISTANCES = ("js", "w2", "hellinger", "bhattacharyya", "w2_mean")  # d between two 1-D Gaussians
LABEL_FITS = ("minmax", "scaled")  # z^y: per-batch min-max (FedCMD) or y / (C - 1) (FedCPMD)


class RoleArgsError(ValueError):
    """Role arguments that cannot work; the message names the option."""


def check_choice(owner: str, option: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise RoleArgsError(f"{owner} {option} must be one of {list(allowed)}, got {value!r}")


def check_min(owner: str, option: str, value: float | None, low: float, strict: bool = False) -> None:
    if value is None:
        return
    ok = value > low if strict else value >= low
    if not ok:
        raise RoleArgsError(f"{owner} {option} must be {'>' if strict else '>='} {low}, got {value}")


def check_phase(
    owner: str, phase: int, phases: tuple[int, ...], voting: tuple[int, ...], candidates: list[str]
) -> None:
    """A layer-voting role's phase is one of ``phases``; the ``voting`` ones need candidate layers."""
    if phase not in phases:
        raise RoleArgsError(f"{owner} phase must be one of {list(phases)}, got {phase}")
    if phase in voting and not candidates:
        raise RoleArgsError(f"{owner} phase {phase} votes for a layer: it needs candidate layers")


def has_default(f: Field) -> bool:
    return f.default is not MISSING or f.default_factory is not MISSING


# every role's arguments, by role name: a RoleArgs subclass with its own ``role`` joins it
ROLE_ARGS: dict[str, type[RoleArgs]] = {}


@dataclass(frozen=True, kw_only=True)
class RoleArgs:
    """Base of every role's arguments. ``role`` names the client role they are for; a subclass
    that sets its own registers itself."""

    role: ClassVar[str] = "sgd"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "role" in cls.__dict__ and cls.__module__ == __name__:
            ROLE_ARGS[cls.role] = cls

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any] | None) -> RoleArgs:
        values = dict(values or {})
        unknown, known = unknown_fields(cls, values)
        if unknown:
            raise RoleArgsError(
                f"role {cls.role!r} got unknown argument(s) {unknown} (valid: {known}); the SuperNode "
                "runs another pflower version than the ServerApp"
            )
        missing = [f.name for f in fields(cls) if f.name not in values and not has_default(f)]
        if missing:
            raise RoleArgsError(
                f"role {cls.role!r} got no {missing} (a method's options travel with every message); the "
                "ServerApp runs another pflower version than the SuperNode, or a hand-made message left them out"
            )
        return cls(**values)


@dataclass(frozen=True, kw_only=True)
class SGDArgs(RoleArgs):
    """Plain SGD (FedAvg, FedPer, Local...). ``finetune_epochs > 0``: a copy is fine-tuned before
    every evaluation (FedAvg-FT)."""

    role: ClassVar[str] = "sgd"
    finetune_epochs: int = 0

    def __post_init__(self) -> None:
        check_min(self.role, "finetune_epochs", self.finetune_epochs, 0)


@dataclass(frozen=True, kw_only=True)
class ProximalArgs(SGDArgs):
    """FedProx: F(w) + mu/2 ||w - w_received||^2."""

    role: ClassVar[str] = "proximal"
    mu: float  # an option: the strategy sends it

    def __post_init__(self) -> None:
        super().__post_init__()
        check_min(self.role, "mu", self.mu, 0)


@dataclass(frozen=True, kw_only=True)
class FedAMPArgs(ProximalArgs):
    """FedAMP: the proximal pull toward the cloud model u_i (``mu`` = FedAMP's lam)."""

    role: ClassVar[str] = "fedamp"


@dataclass(frozen=True, kw_only=True)
class FedRepArgs(RoleArgs):
    """FedRep: E - body_epochs head epochs, then body_epochs body epochs. ``head``: its groups
    (empty: the message's personal groups)."""

    role: ClassVar[str] = "fedrep"
    head: list[str] = field(default_factory=list)
    body_epochs: int  # an option: the strategy sends it

    def __post_init__(self) -> None:
        check_min(self.role, "body_epochs", self.body_epochs, 0)


@dataclass(frozen=True, kw_only=True)
class FedBabuArgs(RoleArgs):
    """FedBABU: only the body trains; a copy is fine-tuned before each evaluation."""

    role: ClassVar[str] = "fedbabu"
    head: list[str] = field(default_factory=list)
    finetune_epochs: int  # an option: the strategy sends it
    finetune_part: str  # an option: the strategy sends it

    def __post_init__(self) -> None:
        check_min(self.role, "finetune_epochs", self.finetune_epochs, 0)
        check_choice("FedBabu", "finetune_part", self.finetune_part, FINETUNE_PARTS)


@dataclass(frozen=True, kw_only=True)
class DittoArgs(RoleArgs):
    """Ditto: a personal model v trained on F(v) + lam/2 ||v - w_global||^2 (``personal_epochs``:
    None = the run's local epochs)."""

    role: ClassVar[str] = "ditto"
    lam: float  # an option: the strategy sends it
    personal_epochs: int | None  # an option: the strategy sends it

    def __post_init__(self) -> None:
        check_min(self.role, "lam", self.lam, 0)
        check_min(self.role, "personal_epochs", self.personal_epochs, 0)


@dataclass(frozen=True, kw_only=True)
class FedDynArgs(RoleArgs):
    """FedDyn: CE - <g_i, w> + alpha/2 ||w - w_global||^2."""

    role: ClassVar[str] = "feddyn"
    alpha: float  # an option: the strategy sends it

    def __post_init__(self) -> None:
        check_min(self.role, "alpha", self.alpha, 0, strict=True)


@dataclass(frozen=True, kw_only=True)
class FedFomoArgs(RoleArgs):
    """FedFomo: the first ``val_ratio`` of the training split scores the downloaded models."""

    role: ClassVar[str] = "fedfomo"
    val_ratio: float  # an option: the strategy sends it

    def __post_init__(self) -> None:
        if not 0.0 <= self.val_ratio < 1.0:
            raise RoleArgsError(f"FedFomo val_ratio must be in [0, 1), got {self.val_ratio}")


@dataclass(frozen=True, kw_only=True)
class MOONArgs(RoleArgs):
    """MOON: CE + mu * contrastive term at temperature tau."""

    role: ClassVar[str] = "moon"
    mu: float  # an option: the strategy sends it
    tau: float  # an option: the strategy sends it

    def __post_init__(self) -> None:
        check_min(self.role, "mu", self.mu, 0)
        check_min(self.role, "tau", self.tau, 0, strict=True)


@dataclass(frozen=True, kw_only=True)
class FedAPArgs(SGDArgs):
    """FedAP: ``bn_stats`` asks for the BN input statistics; ``epochs`` overrides the local epochs."""

    role: ClassVar[str] = "fedap"
    bn_stats: bool = False
    epochs: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check_min(self.role, "epochs", self.epochs, 0)


@dataclass(frozen=True, kw_only=True)
class FedCMDArgs(RoleArgs):
    """FedCMD: phase 1 scores candidate layers and votes (FedCMD paper, algorithm); phase 2 is SGD."""

    role: ClassVar[str] = "fedcmd"
    phase: int = 2
    candidates: list[str]  # an option: the strategy sends it
    score_mode: str  # an option: the strategy sends it
    w2_mode: str  # an option: the strategy sends it
    selection_timing: str  # an option: the strategy sends it
    granularity: str  # an option: the strategy sends it
    tie_prior: str | None  # an option: the strategy sends it
    personal_layer: str | None = None
    has_phi_init: bool = False

    def __post_init__(self) -> None:
        check_phase("FedCMD", self.phase, (1, 2), (1,), self.candidates)
        if self.tie_prior is not None and self.phase == 1 and self.tie_prior not in self.candidates:
            raise ValueError(f"FedCMD tie_prior={self.tie_prior!r} is not a candidate {self.candidates}")
        check_choice("FedCMD", "score_mode", self.score_mode, SCORE_MODES)
        check_choice("FedCMD", "w2_mode", self.w2_mode, W2_MODES)
        check_choice("FedCMD", "selection_timing", self.selection_timing, SELECTION_TIMINGS)
        check_choice("FedCMD", "granularity", self.granularity, GRANULARITIES)


@dataclass(frozen=True, kw_only=True)
class FedCPMDArgs(RoleArgs):
    """FedCPMD (FedCPMD paper, algorithm): ``phase`` 1 trains and votes for a candidate layer, 2 trains,
    0 is a vote-only probe (a no-grad scoring pass over the training split, no update). The
    score: ``distance`` between 1-D Gaussian fits, ``selector`` (Eq. 7, FedCMD's code form, or
    Eq. 6), labels fitted as y / (C - 1) (``label_fit``), sigma floored, exact ties at the minimum
    to ``tie_prior``."""

    role: ClassVar[str] = "fedcpmd"
    phase: int = 2
    candidates: list[str]  # an option: the strategy sends it
    distance: str  # an option: the strategy sends it
    selector: str  # an option: the strategy sends it
    label_fit: str  # an option: the strategy sends it
    sigma_floor: float  # an option: the strategy sends it
    tie_prior: str | None  # an option: the strategy sends it
    granularity: str  # an option: the strategy sends it
    selection_timing: str  # an option: the strategy sends it

    def __post_init__(self) -> None:
        check_phase("FedCPMD", self.phase, (0, 1, 2), (0, 1), self.candidates)
        check_choice("FedCPMD", "distance", self.distance, DISTANCES)
        check_choice("FedCPMD", "selector", self.selector, SELECTORS)
        check_choice("FedCPMD", "label_fit", self.label_fit, LABEL_FITS)
        check_choice("FedCPMD", "granularity", self.granularity, GRANULARITIES)
        check_choice("FedCPMD", "selection_timing", self.selection_timing, SELECTION_TIMINGS)
        check_min("FedCPMD", "sigma_floor", self.sigma_floor, 0)


KAPC_MASKED_REGS = ("start", "none")  # what a layer the server did not send is pulled toward


@dataclass(frozen=True, kw_only=True)
class KAPCArgs(RoleArgs):
    """KAPC (KAPC paper, algorithm): train the own model on CE + lam * sum_l ||w^l - target^l||^2, the
    target being the server's s_i^l where ``mask[l]`` is 1 (all layers when empty). A layer not sent
    (``mask[l]`` 0) is pulled toward the client's own round-start layer (``masked_reg`` "start") or
    trains on CE alone ("none"). ``bls``: choose the upload prefix Omega by the generalization-bound
    rule (ALG4), at least ``omega_min`` layers; ``first``: the client's first participation."""

    role: ClassVar[str] = "kapc"
    lam: float  # an option: the strategy sends it
    mask: list[int] = field(default_factory=list)
    bls: bool  # an option: the strategy sends it
    omega_min: int  # an option: the strategy sends it
    first: bool = False
    masked_reg: str  # an option: the strategy sends it

    def __post_init__(self) -> None:
        check_min("KAPC", "lam", self.lam, 0)
        check_min("KAPC", "omega_min", self.omega_min, 1)
        check_choice("KAPC", "masked_reg", self.masked_reg, KAPC_MASKED_REGS)
        if any(m not in (0, 1) for m in self.mask):
            raise RoleArgsError(f"KAPC mask must hold 0/1 per layer, got {self.mask}")


@dataclass(frozen=True, kw_only=True)
class FeloArgs(RoleArgs):
    """Felo / Velo / FedHe (Felo/Velo paper, Algorithm 1, client side): CE + alpha * (mse_weight * feature MSE + KL of
    the
    logits) against the server's class knowledge (extra arrays ``knowledge/S|P|M``; none sent: CE
    only, the warm-up). The client uploads its per-class mean features and logits and counts
    (``knowledge/s|p|n``) of width ``feature_dim``. FedHe: ``mse_weight`` 0 (logits only).
    ``feature_samples`` N > 0 (Felo/Velo paper, the authors' code's per-sample feature upload, the "samples" upload):
    instead of the class
    means ``s`` the client sends its last N per-sample training features ``knowledge/f`` [N, D]
    and their labels ``knowledge/y`` [N] (-1 pads the rows of a round that saw fewer)."""

    role: ClassVar[str] = "felo"
    alpha: float  # an option: the strategy sends it
    mse_weight: float = 1.0
    temperature: float  # an option: the strategy sends it
    feature_dim: int = 0
    feature_samples: int  # an option: the strategy sends it

    def __post_init__(self) -> None:
        check_min(self.role, "alpha", self.alpha, 0)
        check_min(self.role, "mse_weight", self.mse_weight, 0)
        check_min(self.role, "temperature", self.temperature, 0, strict=True)
        check_min(self.role, "feature_dim", self.feature_dim, 0)  # 0: not checked
        check_min(self.role, "feature_samples", self.feature_samples, 0)  # 0: class means


@dataclass(frozen=True, kw_only=True)
class HeteroFLArgs(RoleArgs):
    """HeteroFL (HeteroFL paper, client side): SGD on the client's width-scaled sub-model.
    ``label_split``: the masked cross-entropy of the paper's non-IID training (the logits of the
    classes the client has no sample of are zeroed) and the class presence uploaded as
    ``heterofl/classes`` [C] (the server averages a classifier row over the clients that have its
    class). ``static_bn``: static batch normalisation (sBN): statistics are not tracked in
    training but computed from the local training split before every evaluation."""

    role: ClassVar[str] = "heterofl"
    label_split: bool  # an option: the strategy sends it
    static_bn: bool  # an option: the strategy sends it


@dataclass(frozen=True, kw_only=True)
class FedGKTArgs(RoleArgs):
    """FedGKT (FedGKT paper, client side): the client trains its whole model with CE + alpha x the
    distillation loss against the server's logits of its training samples (extra array
    ``gkt/z`` [N, C], row i for training sample i; none in its first round: CE only), then sends
    the features, logits and labels of its training split and the features and labels of its
    test split (``gkt/h``, ``gkt/z``, ``gkt/y``, ``gkt/ht``, ``gkt/yt``). It is evaluated as its
    feature extractor followed by the server's model, whose tensors arrive as ``gkt/server/<key>``
    (an MLP of ``hidden`` widths on features of width ``feature_dim``)."""

    role: ClassVar[str] = "fedgkt"
    alpha: float  # an option: the strategy sends it
    temperature: float  # an option: the strategy sends it
    feature_dim: int = 0
    hidden: list[int]  # an option: the strategy sends it

    def __post_init__(self) -> None:
        check_min(self.role, "alpha", self.alpha, 0)
        check_min(self.role, "temperature", self.temperature, 0, strict=True)
        check_min(self.role, "feature_dim", self.feature_dim, 1)
        if any(int(h) < 1 for h in self.hidden):
            raise RoleArgsError(f"{self.role} hidden widths must be >= 1, got {self.hidden}")


FEDMD_DIGEST_LOSSES = ("l1", "kl")


@dataclass(frozen=True, kw_only=True)
class FedMDArgs(RoleArgs):
    """FedMD (FedMD paper, client side) on the labelled transfer split every party holds
    (``dataset.transfer_fraction``). At its first round a client trains ``transfer_epochs`` on
    that split (transfer learning); whenever the server sends a consensus (``md/consensus`` [P, C]
    and the round ``md/round`` [1] of the subset it was computed on) it first digests it,
    ``digest_epochs`` toward the consensus on that subset (``l1``: the mean absolute error of
    the logits, FedMD's code; ``kl``: the KL of the softmaxes), then revisits its private data
    (the usual local training), and uploads its logits on this round's subset (``md/scores``).
    A round's subset: ``subset`` indices of the transfer split drawn from (``seed``, round)
    alone, so every party draws the same without sending them."""

    role: ClassVar[str] = "fedmd"
    transfer_epochs: int  # an option: the strategy sends it
    digest_epochs: int  # an option: the strategy sends it
    digest_loss: str  # an option: the strategy sends it
    subset: int  # an option: the strategy sends it
    seed: int = 0

    def __post_init__(self) -> None:
        check_min(self.role, "transfer_epochs", self.transfer_epochs, 0)
        check_min(self.role, "digest_epochs", self.digest_epochs, 0)
        check_min(self.role, "subset", self.subset, 1)
        check_choice(self.role, "digest_loss", self.digest_loss, FEDMD_DIGEST_LOSSES)


FEDMD = "md/"  # FedMD's extra arrays: md/scores up; md/consensus and md/round down


def fedmd_subset(seed: int, server_round: int, size: int, population: int) -> list[int]:
    """The transfer-split indices of a round's consensus (sorted), from (seed, round) alone."""
    if size > population:
        raise RoleArgsError(
            f"fedmd subset {size} is larger than the transfer split ({population} samples): lower method.subset or "
            "raise dataset.transfer_fraction"
        )
    rng = np.random.default_rng([int(seed), int(server_round), 6007])
    return sorted(int(i) for i in rng.choice(population, size=size, replace=False))


GKT = "gkt/"  # FedGKT's extra arrays: gkt/<h|z|y|ht|yt> up, gkt/z and gkt/server/<key> down


HETEROFL_CLASSES = "heterofl/classes"  # the extra array of a HeteroFL reply: which classes the client has


def role_args(role: str, values: dict[str, Any] | None) -> RoleArgs:
    """The arguments of ``role`` from a message (validated)."""
    if role not in ROLE_ARGS:
        raise RoleArgsError(
            f"unknown client role {role!r}; this pflower knows {sorted(ROLE_ARGS)} (update pflower on the node)"
        )
    return ROLE_ARGS[role].from_dict(values)
