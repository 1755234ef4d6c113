"""Felo, Velo and FedHe ("Federated Learning with Heterogeneous Models" family; docs/methods/felo_velo.md): clients of
different architectures share class knowledge.

Felo (Felo/Velo paper): FedAvg only among clients of the same architecture (the base's per-architecture
aggregation); every reply's per-class mean features and logits go into a per-class store over
all past rounds (strategies/felo_math.py), whose means S [C, D] and P [C, C] (with the mask M of
known classes) every client receives after the warm-up (the first ceil(warmup * rounds) rounds
train on CE alone). Velo (Felo/Velo paper): a conditional VAE (models/cvae.py), trained on the stored
features every ``cvae_interval`` rounds from the end of the warm-up (its weights kept, Adam
re-created), replaces S by one decoded feature per class drawn with the round's seed (the same
for every client). ``feature_upload="samples"`` (what the authors' code does): clients
send their last ``feature_samples`` per-sample training features instead of the class means, so
the feature store (and Velo's CVAE) holds real samples. ``averaging="none"`` (also the authors'
code): no weights are averaged, every client keeps its own model and only knowledge travels.
FedHe (Felo/Velo paper): logits only (the feature term off, no features sent either way) and no
weight averaging at all: every client keeps its own model.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from typing_extensions import override

from pflower.client_app.roles.felo import KNOWLEDGE, FeloArgs
from pflower.models import adapt
from pflower.models.cvae import CVAE, CVAE_LOSSES, train_cvae
from pflower.protocol.options import option

from .base.diagnostics import Panel
from .base.evaluation import global_test_numbers
from .base.hooks import MethodTraits, Uplink
from .base.strategy import PersonalizedStrategy
from .base.validation import ClientUpdate
from .felo_math import WINDOWS, KnowledgeStore, class_feature_distance

AVERAGINGS = ("architecture", "none")


def feature_width(template: Mapping[str, tuple[tuple[int, ...], Any]], classifier_keys: Sequence[str]) -> int:
    """D: the input width of the classifier, the last group, which must be one linear layer (its
    weight [K, D] and bias [K]: the class-wise logits are computed from the features with it)."""
    shapes = [tuple(template[key][0]) for key in classifier_keys]
    if sorted(len(s) for s in shapes) not in ([2], [1, 2]):
        raise ValueError(
            f"Felo, Velo and FedHe need the last layer group to be one linear classifier (weight [classes, features] "
            f"and bias); this model's last group holds {list(classifier_keys)}: make the last nn.Linear a group of "
            "its own (model.groups, or build_clientapp(groups=...))"
        )
    return int(next(s for s in shapes if len(s) == 2)[1])


def shared_feature_width(schemas: Mapping[str, Any], method: str) -> int:
    """D, the classifier input width every architecture of the federation shares (the method
    exchanges features of that width)."""
    widths = {arch: feature_width(s.template, s.group_keys[s.groups[-1]]) for arch, s in schemas.items()}
    if len(set(widths.values())) > 1:
        raise ValueError(
            f"{method} shares class features, but the architectures end in different widths {widths}: "
            "give them one model.feature_dim (the ResNets project to it)"
        )
    return next(iter(widths.values()))


@dataclass(frozen=True)
class FeloOptions(FeloArgs):
    """Felo's options (``method.<name>=`` on the command line, keywords of ``Felo(...)``),
    checked before round 1; ``pflower methods`` lists them."""

    warmup: float = option(0.05, "share of the rounds trained on CE alone (knowledge still uploaded)", low=0, below=1)
    total_rounds: int = option(100, "K, the run's rounds (the method config sets it to rounds)", low=1)
    feature_cap: int = option(5000, "stored feature vectors per class (FIFO)", low=1)
    logit_cap: int = option(50000, "stored logit vectors per class (FIFO)", low=1)
    window: str = option(
        "all", "all: every past report | latest_per_client: one entry per (client, class)", choices=WINDOWS
    )
    global_eval_every: int = option(
        1, "with dataset.public=test|holdout: rounds between evaluations of the group models on it", low=1
    )
    averaging: str = option(
        "architecture",
        "architecture: FedAvg within each architecture (the paper) | none: every client keeps its own model "
        "and only knowledge travels (the authors' released code)",
        choices=AVERAGINGS,
    )


class Felo(PersonalizedStrategy):
    """Features and logits per class shared between clients of different architectures (options:
    :class:`FeloOptions`)."""

    name = "felo"
    options_type = FeloOptions
    traits = MethodTraits(
        role="felo",
        heterogeneous=True,
        # step 5: BN running statistics are averaged within the architecture too
        shared_buffers=True,
        evaluates_on_public=True,
        state=("class_features", "class_logits", "known", "store"),
    )
    mse_weight = 1.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        o = self.options
        self.samples = o.feature_upload == "samples"
        if self.samples and (self.mse_weight == 0 or o.window != "all"):
            raise ValueError(
                f"{self.name} feature_upload=samples needs a method that uses features (not fedhe) and window=all "
                f"(a FIFO per class); got window={o.window!r}"
            )
        self.own_models = o.averaging == "none"
        if self.own_models:  # no group models: the clients score their own at the end, as FedHe's do
            self.traits = replace(self.traits, evaluates_on_public=False, clients_evaluate_on_public=True)
        model = args[0] if args else kwargs.get("model")
        models = {arch: adapt(m) for arch, m in (model.items() if isinstance(model, Mapping) else [(None, model)])}
        models = {self.model.default if arch is None else arch: m for arch, m in models.items()}
        self._probes = {
            arch: copy.deepcopy(m) for arch, m in models.items()
        }  # the server runs the group models in these
        self.public_test: tuple[torch.Tensor, torch.Tensor] | None = None
        self.global_eval_every, self.total_rounds = o.global_eval_every, o.total_rounds
        self.feature_dim = shared_feature_width(self.model.schemas, self.name)
        self.num_classes = int(
            self.model.schema().template[self.model.schema().group_keys[self.model.schema().groups[-1]][0]][0][0]
        )
        self.warmup_rounds = math.ceil(o.warmup * o.total_rounds)
        self.store = KnowledgeStore(self.num_classes, self.feature_dim, o.feature_cap, o.logit_cap, o.window)
        self.class_features = np.zeros((self.num_classes, self.feature_dim), np.float32)
        self.class_logits = np.zeros((self.num_classes, self.num_classes), np.float32)
        self.known = np.zeros(self.num_classes, np.uint8)

    def personal_groups(self, client_id: int, server_round: int) -> list[str]:
        """``averaging=none``: every group stays on its client (nothing is averaged)."""
        return list(self.model.schema(client_id).groups) if self.own_models else []

    # ------------------------------------------------------------------ messages
    @override
    def role_config(self, client_id: int, server_round: int) -> dict[str, Any]:
        return {"mse_weight": self.mse_weight, "feature_dim": self.feature_dim}

    def distilling(self, server_round: int) -> bool:
        """After the warm-up, once some class knowledge exists: only then do clients get it."""
        return server_round > self.warmup_rounds and bool(self.known.any())

    def knowledge_down(self) -> dict[str, np.ndarray]:
        """The class-wise features, logits and known-class mask every client is sent."""
        return {KNOWLEDGE + "S": self.class_features, KNOWLEDGE + "P": self.class_logits, KNOWLEDGE + "M": self.known}

    @override
    def extra_downlinks(
        self, client_ids: Sequence[int], server_round: int, task: str = "train"
    ) -> dict[int, dict[str, np.ndarray]]:
        down = self.knowledge_down() if task == "train" and self.distilling(server_round) else {}
        return {cid: dict(down) for cid in client_ids}

    @override
    def uplink(self, client_id: int, server_round: int) -> Uplink:
        c, d = self.num_classes, self.feature_dim
        up = {KNOWLEDGE + "p": ((c, c), np.dtype(np.float32)), KNOWLEDGE + "n": ((c,), np.dtype(np.int64))}
        if self.samples:
            n = self.options.samples_sent()
            up.update({KNOWLEDGE + "f": ((n, d), np.dtype(np.float32)), KNOWLEDGE + "y": ((n,), np.dtype(np.int64))})
        elif self.mse_weight > 0:
            up[KNOWLEDGE + "s"] = ((c, d), np.dtype(np.float32))
        return replace(super().uplink(client_id, server_round), extra=up)

    # ------------------------------------------------------------------ the round
    @override
    def aggregate(self, server_round: int, updates: Sequence[ClientUpdate]) -> dict[str, Any]:
        distilled = self.distilling(server_round)  # what this round's clients trained with (before the new knowledge)
        record = super().aggregate(server_round, updates)
        for u in sorted(updates, key=lambda u: u.client_id):
            if self.samples:
                self.store.add(u.client_id, None, u.extra[KNOWLEDGE + "p"], u.extra[KNOWLEDGE + "n"])
                self.store.add_samples(u.client_id, u.extra[KNOWLEDGE + "f"], u.extra[KNOWLEDGE + "y"])
            else:
                s = u.extra.get(KNOWLEDGE + "s", np.zeros((self.num_classes, self.feature_dim), np.float32))
                self.store.add(u.client_id, s, u.extra[KNOWLEDGE + "p"], u.extra[KNOWLEDGE + "n"])
        self.known = self.store.mask()
        self.class_logits = self.store.class_logits()
        self.class_features = self.next_class_features(server_round)
        record.update(
            {
                "distill": int(distilled),
                "known_classes": int(self.known.sum()),
                "log_keys": ["known_classes"],
            }
        )
        if self.public_test is not None and (
            server_round % self.global_eval_every == 0 or server_round == self.total_rounds
        ):
            accs = {arch: self.global_accuracy(arch, arch) for arch in self.model.schemas}
            record.update({f"global_acc@{a}": v for a, v in accs.items()})
            record["global_acc"] = float(np.mean(list(accs.values())))
            record["log_keys"] = ["known_classes", "global_acc"]
        return record

    # ------------------------------------------------------------------ the global test set
    @override
    def attach_public(self, images: torch.Tensor, labels: torch.Tensor | None = None) -> None:
        """The labelled global test set (``dataset.public=test``) the group models are evaluated on."""
        if labels is None:
            raise ValueError(f"{self.name} scores its group models on a labelled public split; it got images only")
        if len(images) < 1:
            raise ValueError(f"{self.name}: the public split is empty")
        self.public_test = (images, labels.to(torch.int64))

    def _group_model(self, arch: str) -> torch.nn.Module:
        model = self._probes[arch]
        model.load_state_dict({k: torch.as_tensor(v) for k, v in self.model.arrays[arch].items()}, strict=False)
        return model.eval()

    @torch.no_grad()
    def global_accuracy(self, extractor_arch: str, classifier_arch: str, batch: int = 1000) -> float:
        """Accuracy on the global test set of ``extractor_arch``'s features through
        ``classifier_arch``'s classifier (the same architecture: its group model; two different
        ones: the transfer check, which only aligned features pass)."""
        assert self.public_test is not None
        images, labels = self.public_test
        extractor = self._group_model(extractor_arch)
        classifier = (
            extractor if classifier_arch == extractor_arch else self._group_model(classifier_arch)
        )  # one load per model
        head = list(classifier.groups.values())[-1]
        correct = 0
        for start in range(0, len(labels), batch):
            z = extractor.features(images[start : start + batch]).flatten(1)
            correct += int((head(z).argmax(1) == labels[start : start + batch]).sum())
        return correct / len(labels)

    def transfer_matrix(self) -> dict[str, dict[str, float]]:
        """Global-test accuracy of every (extractor architecture, classifier architecture) pair."""
        return {a: {b: self.global_accuracy(a, b) for b in self.model.schemas} for a in self.model.schemas}

    def next_class_features(self, server_round: int) -> np.ndarray:
        """S for the next round: Felo sends the stores' class means."""
        return self.store.class_features()

    @override
    def run_summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "warmup_rounds": self.warmup_rounds,
            "feature_dim": self.feature_dim,
            "known_classes": int(self.known.sum()),
        }
        out.update(global_test_numbers(self.run.history))  # the paper's numbers: final, and the second half's mean
        if self.public_test is not None:
            matrix = self.transfer_matrix()
            out["transfer_acc"] = matrix
            cross = [v for a, row in matrix.items() for b, v in row.items() if a != b]
            if cross:
                out["transfer_acc_mean"] = float(np.mean(cross))
        return out

    # ------------------------------------------------------------------ checkpoint


class FedHe(Felo):
    """FedHe (Chan & Ngai 2021, Felo/Velo paper, baselines): class logits only, every client keeps its model."""

    name = "fedhe"
    traits = dataclasses.replace(
        Felo.traits,
        # no group models: each client keeps its own, scored on the global test set at the end
        evaluates_on_public=False,
        clients_evaluate_on_public=True,
    )
    mse_weight = 0.0

    @override
    def personal_groups(self, client_id: int, server_round: int) -> list[str]:
        return list(self.model.schema(client_id).groups)

    @override
    def knowledge_down(self) -> dict[str, np.ndarray]:
        return {KNOWLEDGE + "P": self.class_logits, KNOWLEDGE + "M": self.known}

    @override
    def next_class_features(self, server_round: int) -> np.ndarray:
        return self.class_features  # never sent


@dataclass(frozen=True)
class VeloOptions(FeloOptions):
    """Velo's options (``method.<name>=`` on the command line, keywords of ``Velo(...)``),
    checked before round 1; ``pflower methods`` lists them."""

    cvae_interval: int = option(1, "rounds between CVAE trainings (Table 4: 1-10 all similar)", low=1)
    cvae_epochs: int = option(10, "epochs over the stored features per training", low=1)
    cvae_batch: int = option(50, "the CVAE's batch size", low=2)
    cvae_lr: float = option(1e-3, "the CVAE's Adam step", above=0)
    cvae_loss: str = option(
        "elbo", "elbo: per-sample sums, batch mean | code: the paper's code (MSE mean + KL sum)", choices=CVAE_LOSSES
    )
    cvae_label_dim: int = option(512, "label embedding width", low=1)
    cvae_hidden: int = option(1024, "hidden width", low=1)
    cvae_latent: int = option(512, "latent width", low=1)


class Velo(Felo):
    """Felo whose class features come from a conditional VAE trained on the stored features (options:
    :class:`VeloOptions`: Felo's and the CVAE's)."""

    name = "velo"
    options_type = VeloOptions
    traits = dataclasses.replace(
        Felo.traits,
        diagnostic_panels=(Panel("s_rel_dist", "distance of S to the class means (relative)"),),
        state=(*Felo.traits.state, "cvae_trained", "cvae_history", "cvae", "cvae_gen"),
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        o = self.options
        self.cvae_interval, self.cvae_epochs, self.cvae_batch = o.cvae_interval, o.cvae_epochs, o.cvae_batch
        self.cvae_lr, self.cvae_loss = o.cvae_lr, o.cvae_loss
        self.cvae_device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        torch_state = torch.get_rng_state()
        torch.manual_seed(
            int(self.run.seed) + 7177
        )  # the CVAE's initial weights: from the run's seed, not the global stream
        self.cvae = CVAE(self.feature_dim, self.num_classes, o.cvae_label_dim, o.cvae_hidden, o.cvae_latent)
        torch.set_rng_state(torch_state)
        self.cvae_gen = torch.Generator().manual_seed(int(self.run.seed) + 7919)
        self.cvae_trained = 0
        self.cvae_history: list[float] = []

    @override
    def next_class_features(self, server_round: int) -> np.ndarray:
        if server_round >= self.warmup_rounds and (server_round - self.warmup_rounds) % self.cvae_interval == 0:
            feats, labels = self.store.labelled_features()
            if len(labels) >= 2:
                self.cvae.to(self.cvae_device)
                losses = train_cvae(
                    self.cvae,
                    torch.from_numpy(feats),
                    torch.from_numpy(labels),
                    self.cvae_gen,
                    self.cvae_epochs,
                    self.cvae_batch,
                    self.cvae_lr,
                    self.cvae_loss,
                )
                self.cvae.to("cpu")
                self.cvae_trained += 1
                self.cvae_history.append(losses[-1])
        if not self.cvae_trained:
            return self.store.class_features()
        draw = torch.Generator().manual_seed(
            int(self.run.seed) * 100_003 + server_round
        )  # one draw per round, same for all
        synthetic, _ = self.cvae.synthesize(draw)
        synthetic = synthetic.numpy().astype(np.float32)
        # how near S is to the class means the CVAE imitates (the round's record: s_rel_dist, s_nearest_own)
        self._s_quality = class_feature_distance(synthetic, self.store.class_features(), self.store.mask())
        return synthetic

    @override
    def aggregate(self, server_round: int, updates: Sequence[ClientUpdate]) -> dict[str, Any]:
        self._s_quality = {}
        record = super().aggregate(server_round, updates)
        record.update(self._s_quality)
        if "s_rel_dist" in self._s_quality:
            record["log_keys"] = [*record["log_keys"], "s_rel_dist"]
        return record

    @override
    def run_summary(self) -> dict[str, Any]:
        return {
            **super().run_summary(),
            "cvae_trainings": self.cvae_trained,
            "cvae_last_loss": self.cvae_history[-1] if self.cvae_history else None,
        }
