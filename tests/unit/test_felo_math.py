"""Felo/Velo's math (Felo/Velo paper, set-up, scaled to a CPU unit tests 2, 3, 6, 7): the client's per-class knowledge,
the
distillation terms, the server's knowledge store and Velo's CVAE."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pflower.client_app.roles.felo_knowledge import ClassKnowledge, FeatureSamples, distill_terms, felo_loss
from pflower.models.cvae import CVAE, cvae_loss, train_cvae
from pflower.strategies.felo_math import KnowledgeStore


def test_class_means_over_batches_with_absent_classes():
    k = ClassKnowledge(num_classes=4, feature_dim=2)
    k.add(torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.tensor([[1.0, 0, 0, 0], [0, 1.0, 0, 0]]), torch.tensor([0, 2]))
    k.add(torch.tensor([[5.0, 6.0]]), torch.tensor([[0, 0, 3.0, 0]]), torch.tensor([0]))
    s, p, n = k.means()
    assert n.tolist() == [2, 0, 1, 0]
    assert torch.equal(s, torch.tensor([[3.0, 4.0], [0, 0], [3.0, 4.0], [0, 0]]))
    assert torch.equal(p, torch.tensor([[0.5, 0, 1.5, 0], [0, 0, 0, 0], [0, 1.0, 0, 0], [0, 0, 0, 0]]))
    assert s.dtype == torch.float32 and p.dtype == torch.float32


def test_distill_terms_vanish_on_their_own_targets_and_match_hand_values():
    feats = torch.tensor([[1.0, 0.0], [0.0, 2.0], [4.0, 4.0]])
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    y = torch.tensor([0, 1, 1])
    S = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    P = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
    mse, kl = distill_terms(feats[:2], logits[:2], y[:2], S, P, torch.ones(2))
    assert float(mse) == 0.0 and abs(float(kl)) < 1e-7
    # row 2 (class 1): feature error (4, 2), teacher softmax([0, 1]), student softmax([1, 1])
    mse, kl = distill_terms(feats, logits, y, S, P, torch.tensor([0, 1]))  # class 0 has no knowledge: row 0 is out
    assert float(mse) == pytest.approx((16 + 4) / 4)  # element mean over 2 kept rows x 2 dims: rows (0,0) and (4,2)
    q = F.softmax(torch.tensor([0.0, 1.0]), 0)
    by_hand = float((q * (q.log() - torch.log(torch.tensor([0.5, 0.5])))).sum()) / 4  # 'mean': over 2 rows x 2 classes
    assert float(kl) == pytest.approx(by_hand, rel=1e-6)
    zero_mse, zero_kl = distill_terms(feats, logits, y, S, P, torch.zeros(2))
    assert float(zero_mse) == 0.0 and float(zero_kl) == 0.0


def test_the_loss_is_ce_without_knowledge_and_the_mse_never_reaches_the_classifier():
    torch.manual_seed(0)
    extractor, head = nn.Linear(3, 4), nn.Linear(4, 2)
    x, y = torch.randn(6, 3), torch.tensor([0, 1, 0, 1, 0, 1])
    feats = extractor(x)
    logits = head(feats)
    loss, terms = felo_loss(feats, logits, y, 0.5, None)
    assert float(loss.detach()) == pytest.approx(float(F.cross_entropy(logits, y).detach())) and terms["mse"] == 0.0
    S, P, M = torch.randn(2, 4), torch.randn(2, 2), torch.ones(2)
    mse, _ = distill_terms(feats, logits, y, S, P, M)
    mse.backward()
    assert head.weight.grad is None and extractor.weight.grad is not None and S.grad is None
    loss, terms = felo_loss(extractor(x), head(extractor(x)), y, 0.5, (S, P, M))
    assert terms["mse"] > 0 and terms["kl"] > 0
    assert float(loss.detach()) == pytest.approx(terms["ce"] + 0.5 * (terms["mse"] + terms["kl"]), rel=1e-5)


def test_the_store_averages_what_the_clients_saw_and_masks_the_rest():
    store = KnowledgeStore(num_classes=3, feature_dim=2)
    store.add(0, [[1, 1], [9, 9], [0, 0]], [[1, 0, 0], [9, 9, 9], [0, 0, 0]], [4, 0, 0])  # class 1 absent (n = 0)
    store.add(1, [[3, 3], [2, 4], [0, 0]], [[3, 0, 0], [0, 2, 0], [0, 0, 0]], [1, 5, 0])
    assert store.mask().tolist() == [1, 1, 0]
    assert np.array_equal(store.class_features(), [[2, 2], [2, 4], [0, 0]])  # unweighted mean of the entries
    assert np.array_equal(store.class_logits(), [[2, 0, 0], [0, 2, 0], [0, 0, 0]])
    feats, labels = store.labelled_features()
    assert labels.tolist() == [0, 0, 1] and feats.shape == (3, 2)
    with pytest.raises(ValueError, match="client 2's knowledge s has shape"):
        store.add(2, np.zeros((3, 5)), np.zeros((3, 3)), np.ones(3))
    with pytest.raises(ValueError, match="NaN"):
        store.add(2, np.full((3, 2), np.nan), np.zeros((3, 3)), np.ones(3))


def test_the_store_is_a_capped_fifo_or_one_entry_per_client_and_checkpoints():
    fifo = KnowledgeStore(num_classes=1, feature_dim=1, feature_cap=2, logit_cap=3)
    for v in (1.0, 2.0, 3.0):
        fifo.add(0, [[v]], [[v]], [1])
    assert fifo.class_features()[0, 0] == 2.5 and fifo.class_logits()[0, 0] == 2.0
    latest = KnowledgeStore(num_classes=1, feature_dim=1, window="latest_per_client")
    for cid, v in ((0, 1.0), (1, 5.0), (0, 3.0)):
        latest.add(cid, [[v]], [[v]], [1])
    assert latest.class_features()[0, 0] == 4.0  # client 0's first report was replaced
    for store, kwargs in ((fifo, dict(feature_cap=2, logit_cap=3)), (latest, dict(window="latest_per_client"))):
        copy = KnowledgeStore(num_classes=1, feature_dim=1, **kwargs)
        copy.load_state_dict(store.state_dict())
        assert np.array_equal(copy.class_features(), store.class_features()) and np.array_equal(
            copy.class_logits(), store.class_logits()
        )
        copy.add(7, [[10.0]], [[10.0]], [1])
        store.add(7, [[10.0]], [[10.0]], [1])
        assert np.array_equal(copy.class_features(), store.class_features())
    with pytest.raises(ValueError, match="knowledge window must be one of"):
        KnowledgeStore(1, 1, window="recent")


def test_feature_samples_keep_the_last_n_oldest_first_and_pad_with_minus_one():
    buf = FeatureSamples(capacity=4, feature_dim=1)
    buf.add(torch.tensor([[1.0], [2.0]]), torch.tensor([1, 2]))
    f, y = buf.arrays()
    assert y.tolist() == [1, 2, -1, -1] and f[:, 0].tolist() == [1, 2, 0, 0]  # a short round: padding rows
    buf.add(torch.tensor([[3.0], [4.0], [5.0]]), torch.tensor([0, 1, 2]))
    f, y = buf.arrays()
    assert f[:, 0].tolist() == [2, 3, 4, 5] and y.tolist() == [2, 0, 1, 2]  # the last 4, oldest first
    buf.add(torch.arange(6.0)[:, None] + 10, torch.zeros(6, dtype=torch.int64))  # a batch wider than the buffer
    assert buf.arrays()[0][:, 0].tolist() == [12, 13, 14, 15]


def test_the_store_takes_per_sample_features_and_skips_padding():
    store = KnowledgeStore(num_classes=3, feature_dim=2, feature_cap=2)
    store.add(0, None, [[1, 0, 0], [0, 1, 0], [0, 0, 0]], [2, 1, 0])  # logits only: the features come as samples
    store.add_samples(0, [[1, 1], [3, 3], [5, 5], [2, 4], [0, 0]], [0, 0, 0, 1, -1])
    assert store.mask().tolist() == [1, 1, 0]
    assert np.array_equal(store.class_features(), [[4, 4], [2, 4], [0, 0]])  # class 0's FIFO keeps the last 2
    assert np.array_equal(store.class_logits()[0], [1, 0, 0])
    with pytest.raises(ValueError, match="labels outside"):
        store.add_samples(1, np.zeros((2, 2)), [0, 3])
    with pytest.raises(ValueError, match=r"expected \[N, 2\] and \[N\]"):
        store.add_samples(1, np.zeros((2, 3)), [0, 1])
    with pytest.raises(ValueError, match="window 'all'"):
        KnowledgeStore(3, 2, window="latest_per_client").add_samples(0, np.zeros((1, 2)), [0])


def test_cvae_shapes_and_seeded_synthesis():
    model = CVAE(feature_dim=8, num_classes=3, label_dim=4, hidden=16, latent=5)
    recon, mu, logvar = model(torch.randn(6, 8), torch.tensor([0, 1, 2, 0, 1, 2]), torch.Generator().manual_seed(0))
    assert recon.shape == (6, 8) and mu.shape == (6, 5) and logvar.shape == (6, 5)
    a, labels = model.synthesize(torch.Generator().manual_seed(3))
    b, _ = model.synthesize(torch.Generator().manual_seed(3))
    assert a.shape == (3, 8) and labels.tolist() == [0, 1, 2] and torch.equal(a, b)
    with pytest.raises(ValueError, match="cvae_loss must be one of"):
        cvae_loss(recon, recon, mu, logvar, kind="bce")


@pytest.mark.parametrize("kind", ["elbo", "code"])
def test_the_cvae_learns_and_its_samples_are_class_separable(kind):
    """Features of 10 classes around separated centres: training lowers the loss, and a
    nearest-centroid classifier puts the decoded features of each class in that class."""
    rng = np.random.default_rng(0)
    centres = rng.normal(0, 3, size=(10, 16)).astype(np.float32)
    labels = np.repeat(np.arange(10), 30)
    feats = centres[labels] + rng.normal(0, 0.5, size=(len(labels), 16)).astype(np.float32)
    torch.manual_seed(0)
    model = CVAE(feature_dim=16, num_classes=10, label_dim=16, hidden=64, latent=8)
    gen = torch.Generator().manual_seed(0)
    history = train_cvae(
        model, torch.from_numpy(feats), torch.from_numpy(labels), gen, epochs=40, batch_size=50, lr=3e-3, kind=kind
    )
    assert history[-1] < 0.5 * history[0], history
    synth, synth_labels = model.synthesize(torch.Generator().manual_seed(1), per_class=20)
    class_means = np.stack([feats[labels == c].mean(0) for c in range(10)])
    nearest = np.argmin(((synth.numpy()[:, None] - class_means[None]) ** 2).sum(-1), axis=1)
    accuracy = float((nearest == synth_labels.numpy()).mean())
    assert accuracy >= 0.9, accuracy  # chance: 0.1
