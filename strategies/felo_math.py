"""Felo/Velo's server-side knowledge store (Felo/Velo paper, Algorithm 1, server side steps 6-7, [A-C]).

Every reply's class means (class c only where the client saw c, n_k[c] > 0), or with the
"samples" upload its per-sample features (:meth:`KnowledgeStore.add_samples`), go into a per-class
FIFO that spans all past rounds (capped: the paper's code keeps the last 5,000 features and
50,000 logits of a class). The class feature S[c] and logits P[c] sent to the clients are the
plain unweighted means of the stored entries; M[c] = 1 marks the classes seen. The option
``window="latest_per_client"`` keeps one entry per (client, class) instead, overwritten by each
report, which drops stale knowledge of early-round models. numpy in, numpy out; checkpointable
as plain arrays.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Mapping
from typing import Any

import numpy as np

WINDOWS = ("all", "latest_per_client")


class KnowledgeStore:
    """Per-class stores of feature vectors [D] and logit vectors [C], with their means."""

    def __init__(
        self, num_classes: int, feature_dim: int, feature_cap: int = 5000, logit_cap: int = 50000, window: str = "all"
    ) -> None:
        if window not in WINDOWS:
            raise ValueError(f"knowledge window must be one of {list(WINDOWS)}, got {window!r}")
        if feature_cap < 1 or logit_cap < 1:
            raise ValueError(f"knowledge store caps must be >= 1, got features {feature_cap}, logits {logit_cap}")
        self.num_classes, self.feature_dim, self.window = num_classes, feature_dim, window
        self.feature_cap, self.logit_cap = feature_cap, logit_cap
        # window "all": deques of vectors; "latest_per_client": client id -> vector (insertion order kept)
        self.features: list = [self._empty(feature_cap) for _ in range(num_classes)]
        self.logits: list = [self._empty(logit_cap) for _ in range(num_classes)]

    def _empty(self, cap: int):  # noqa: ANN202
        return deque(maxlen=cap) if self.window == "all" else OrderedDict()

    def add(self, client_id: int, s: np.ndarray | None, p: np.ndarray, n: np.ndarray) -> None:
        """One client's reply: s [C, D], p [C, C], n [C]; classes with n = 0 are skipped. ``s``
        None: the client sent per-sample features instead (:meth:`add_samples`), logits only."""
        p, n = np.asarray(p, np.float32), np.asarray(n)
        arrays = [("p", p, (self.num_classes, self.num_classes)), ("n", n, (self.num_classes,))]
        if s is not None:
            s = np.asarray(s, np.float32)
            arrays.append(("s", s, (self.num_classes, self.feature_dim)))
        for name, value, shape in arrays:
            if value.shape != shape:
                raise ValueError(f"client {client_id}'s knowledge {name} has shape {value.shape}, expected {shape}")
        if not ((s is None or np.isfinite(s).all()) and np.isfinite(p).all()) or (n < 0).any():
            raise ValueError(f"client {client_id}'s knowledge holds NaN/infinite values or negative counts")
        for c in np.flatnonzero(n > 0):
            pairs = [(self.logits[c], p[c], self.logit_cap)]
            if s is not None:
                pairs.insert(0, (self.features[c], s[c], self.feature_cap))
            for store, value, cap in pairs:
                if self.window == "all":
                    store.append(value.copy())
                else:
                    store.pop(client_id, None)
                    store[client_id] = value.copy()
                    while len(store) > cap:
                        store.popitem(last=False)

    def add_samples(self, client_id: int, f: np.ndarray, y: np.ndarray) -> None:
        """Per-sample features f [N, D] with labels y [N] (-1: a padding row, skipped) into the
        classes' feature FIFOs (the "samples" upload, Felo/Velo paper, the authors' code's per-sample feature upload;
        window "all" only)."""
        if self.window != "all":
            raise ValueError(
                "per-sample features need the knowledge window 'all' (a FIFO per class), not 'latest_per_client'"
            )
        f, y = np.asarray(f, np.float32), np.asarray(y)
        if f.ndim != 2 or f.shape[1] != self.feature_dim or y.shape != (len(f),):
            raise ValueError(
                f"client {client_id}'s feature samples have shapes {f.shape} and {y.shape}, expected [N, "
                f"{self.feature_dim}] and [N]"
            )
        if not np.isfinite(f).all() or ((y < -1) | (y >= self.num_classes)).any():
            raise ValueError(
                f"client {client_id}'s feature samples hold NaN/infinite values or labels outside [-1, "
                f"{self.num_classes})"
            )
        for row, c in zip(f, y.tolist()):
            if c >= 0:
                self.features[c].append(row.copy())

    def mask(self) -> np.ndarray:
        """M [C] (uint8): 1 where the store holds knowledge of the class."""
        return np.array([len(f) > 0 for f in self.features], dtype=np.uint8)

    def class_features(self) -> np.ndarray:
        """S [C, D]: the mean stored feature of each class (zero rows for unseen classes)."""
        return self._means(self.features, self.feature_dim)

    def class_logits(self) -> np.ndarray:
        """P [C, C]: the mean stored logit vector of each class (zero rows for unseen classes)."""
        return self._means(self.logits, self.num_classes)

    def labelled_features(self) -> tuple[np.ndarray, np.ndarray]:
        """Every stored feature vector [N, D] and its class [N]: Velo's CVAE training set."""
        feats = [np.asarray(list(_values(store)), np.float32).reshape(-1, self.feature_dim) for store in self.features]
        labels = [np.full(len(f), c, dtype=np.int64) for c, f in enumerate(feats)]
        return np.concatenate(feats), np.concatenate(labels)

    def _means(self, stores: list, width: int) -> np.ndarray:
        out = np.zeros((self.num_classes, width), np.float32)
        for c, store in enumerate(stores):
            if len(store):
                out[c] = np.mean(np.asarray(list(_values(store)), np.float64), axis=0)
        return out

    # ---------------------------------------------------------------- checkpoint
    def state_dict(self) -> dict[str, np.ndarray]:
        """Plain arrays (per class: the vectors in store order and, per-client window, their clients)."""
        out: dict[str, np.ndarray] = {}
        for kind, stores, width in (("f", self.features, self.feature_dim), ("p", self.logits, self.num_classes)):
            for c, store in enumerate(stores):
                out[f"{kind}{c}"] = np.asarray(list(_values(store)), np.float32).reshape(-1, width)
                if self.window != "all":
                    out[f"{kind}{c}_clients"] = np.asarray(list(store.keys()), np.int64)
        return out

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """Restore what :meth:`state_dict` wrote (same classes, width, caps and window)."""
        for kind, stores in (("f", self.features), ("p", self.logits)):
            for c in range(self.num_classes):
                vectors = np.asarray(state[f"{kind}{c}"], np.float32)
                store = stores[c]
                store.clear()
                if self.window == "all":
                    store.extend(list(vectors))
                else:
                    for cid, v in zip(np.asarray(state[f"{kind}{c}_clients"]).tolist(), vectors):
                        store[int(cid)] = v


def _values(store):  # noqa: ANN001, ANN202
    return store.values() if isinstance(store, OrderedDict) else store


def class_feature_distance(s: np.ndarray, means: np.ndarray, known: np.ndarray) -> dict[str, Any]:
    """How near synthetic class features S [C, D] are to the stored class means [C, D], over the
    known classes: per class the relative distance ||S_c - mean_c|| / ||mean_c|| (0: S is the mean;
    about sqrt(2) for an unrelated vector of the same norm), their mean, and the share of classes
    whose S_c is nearer its own mean than any other class's (1: S tells the classes apart). Velo's
    diagnostic: its CVAE should imitate the class means it is trained on."""
    s, means = np.asarray(s, np.float64), np.asarray(means, np.float64)
    idx = np.flatnonzero(np.asarray(known, bool))
    if len(idx) == 0:
        return {}
    rel = np.linalg.norm(s[idx] - means[idx], axis=1) / np.maximum(np.linalg.norm(means[idx], axis=1), 1e-12)
    dist = np.linalg.norm(s[idx][:, None, :] - means[idx][None, :, :], axis=2)  # S_c against every known mean
    own = float(np.mean(np.argmin(dist, axis=1) == np.arange(len(idx))))
    return {"s_rel_dist": float(rel.mean()), "s_rel_dist_by_class": [float(v) for v in rel], "s_nearest_own": own}
