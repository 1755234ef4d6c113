"""FedRep: its defining behaviours (math on hand numbers; routing and state through the in-process grid)."""

from __future__ import annotations

from dataclasses import replace

from method_helpers import BODY, HEAD, ctx, params, role_args_of, same

from pflower.client_app.roles import base as role_base
from pflower.client_app.roles import build_role
from pflower.client_app.training import train


# ----------------------------------------------------------------------------- FedRep
def test_fedrep_trains_the_head_first_then_the_body(client, monkeypatch):
    model, data, args = client
    phases = []

    def recording_train(m, x, y, train_args, **kw):
        before_head, before_body = params(m, HEAD), params(m, BODY)
        loss = train(m, x, y, train_args, **kw)
        phases.append((train_args, same(before_head, params(m, HEAD)), same(before_body, params(m, BODY))))
        return loss

    monkeypatch.setattr(role_base, "train", recording_train)  # every stage trains through it
    metrics = build_role("fedrep", role_args_of("fedrep", head=HEAD, body_epochs=1)).fit(
        model, data, replace(args, epochs=3), ctx(HEAD)
    )
    (head_args, head_fixed_1, body_fixed_1), (body_args, head_fixed_2, body_fixed_2) = phases
    assert head_args.epochs == 2 and body_args.epochs == 1  # E - e_body, then e_body
    assert not head_fixed_1 and body_fixed_1  # head epochs: the body does not change
    assert head_fixed_2 and not body_fixed_2  # body epoch: the head does not change
    assert set(metrics) == {"head_loss", "body_loss", "train_loss"}
