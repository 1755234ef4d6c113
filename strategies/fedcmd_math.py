"""FedCMD's server-side math on plain arrays (no Flower): vote counting and Eq. 7-8.

The client-side statistics (Gaussian fits, W2, layer scores, the client's own vote) live
in :mod:`client_app.roles.fedcmd`; what the server does with the votes and the uploaded
parameters is here. Candidates are referred to by their index in the candidate list, whose
order (forward order of the model) is the last tie-break everywhere.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from .shared.aggregation import mixing_average
from .shared.similarity import EQ8_EPS, cosine_of_vectors

Arrays = Mapping[str, np.ndarray]

EPS = EQ8_EPS  # Eq. 8


def round_winner(client_votes: Sequence[int], batch_votes: Sequence[float], num_candidates: int) -> int | None:
    """Mode of the round's client votes (FedCMD paper); None if nobody voted.

    Ties go to the candidate with more batch votes summed over the round's clients (the
    finer-grained count of the same votes), then to the earlier candidate.
    """
    counts = np.bincount(np.asarray(client_votes, dtype=np.int64), minlength=num_candidates)
    if counts.sum() == 0:
        return None
    return min(range(num_candidates), key=lambda c: (-counts[c], -batch_votes[c], c))


def personal_layer_index(round_winners: Sequence[int], total_client_votes: Sequence[int], num_candidates: int) -> int:
    """l* = mode of the phase-1 round winners (FedCMD paper).

    Ties: the larger number of client votes over all of phase 1, then the earlier
    candidate. With no round winner at all this falls through to the vote totals, then
    to the first candidate.
    """
    counts = np.bincount(np.asarray(round_winners, dtype=np.int64), minlength=num_candidates)
    return min(range(num_candidates), key=lambda c: (-counts[c], -total_client_votes[c], c))


def flat_vector(arrays: Arrays, keys: Sequence[str]) -> np.ndarray:
    """v_i of Eq. 8: the given tensors (weight, bias of l*) flattened and concatenated."""
    return np.concatenate([np.asarray(arrays[k], dtype=np.float64).reshape(-1) for k in keys])


def similarity_matrix(vectors: Sequence[np.ndarray], eps: float = EPS) -> np.ndarray:
    """Phi_ij = max(0, <v_i, v_j> / (||v_i|| ||v_j|| + eps)) (Eq. 8), in [0, 1] (a zero vector: 0)."""
    return cosine_of_vectors(vectors, eps, lo=0.0)


def eq7_weights(phi: np.ndarray) -> np.ndarray:
    """Rows of Phi normalised to sum to 1: client i's weights over the round's posts (Eq. 7).

    A row that sums to 0 (a client whose l* is all zeros) keeps that client's own post.
    """
    phi = np.asarray(phi, dtype=np.float64)
    sums = phi.sum(axis=1, keepdims=True)
    eye = np.eye(len(phi))
    return np.where(sums > 0, phi / np.where(sums > 0, sums, 1.0), eye)


def personalized_posts(posts: Sequence[Arrays], phi: np.ndarray) -> list[dict[str, np.ndarray]]:
    """post_store[i] = sum_j Phi_ij post_j / sum_j Phi_ij for every participant i (Eq. 7)."""
    return mixing_average(posts, eq7_weights(phi))
