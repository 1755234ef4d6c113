"""Cosine similarity between clients' tensors, in one place (FedCMD Eq. 8, pFedSim, CFL, FedCPMD).

Two inputs, one formula: cos_ij = <v_i, v_j> / (||v_i|| ||v_j|| + eps), clipped to [lo, 1].
``lo = 0`` is FedCMD/FedCPMD's Eq. 8 (negative similarity counts as none); ``lo = -1`` keeps
the sign (CFL's bipartition). From a Gram matrix (:func:`strategies.shared.model_distance.gram_matrix`,
built blockwise, so no client's vector is ever materialised) or from explicit vectors.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

EQ8_EPS = 1e-8  # the FedCMD paper's Eq. 8, the FedCPMD paper's Eq. 13


def _cosine(dots: np.ndarray, norms: np.ndarray, eps: float, lo: float) -> np.ndarray:
    return np.clip(dots / (np.outer(norms, norms) + eps), lo, 1.0)


def cosine_from_gram(gram: np.ndarray, eps: float = 1e-12, lo: float = -1.0) -> np.ndarray:
    """Pairwise cosines from G_ij = <v_i, v_j> (||v_i|| = sqrt(G_ii)); a zero vector gives 0."""
    gram = np.asarray(gram, dtype=np.float64)
    return _cosine(gram, np.sqrt(np.maximum(np.diag(gram), 0.0)), eps, lo)


def cosine_of_vectors(vectors: Sequence[np.ndarray], eps: float = 1e-12, lo: float = -1.0) -> np.ndarray:
    """Pairwise cosines of explicit vectors (each flattened), as :func:`cosine_from_gram`."""
    v = np.stack([np.asarray(x, dtype=np.float64).reshape(-1) for x in vectors])
    return _cosine(v @ v.T, np.linalg.norm(v, axis=1), eps, lo)
