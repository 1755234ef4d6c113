"""The round ledger (what the server sent in the batch under way) and the rule that a method
reaches the base only through public members."""

from __future__ import annotations

import re
from pathlib import Path

from flwr.app import Error, Message, RecordDict

from pflower.strategies.base.round_ledger import RoundLedger

ROOT = Path(__file__).resolve().parents[2]


def sent(node: int) -> Message:
    return Message(content=RecordDict(), message_type="train", dst_node_id=node)


def test_the_ledger_records_a_batch_names_each_reply_and_resets():
    from pflower.simulation.inprocess import InProcessGrid

    InProcessGrid(0)  # sets the task identity a ServerApp process has when it builds Messages
    ledger = RoundLedger()
    a, b = sent(1001), sent(1002)
    ledger.record(1, a, 100, ["conv1", "fc1"])
    ledger.record(2, b, 50, ["fc1", "classifier"])
    assert ledger.inflight == {1001: 1, 1002: 2} and ledger.asked() == [1, 2]
    assert ledger.bytes_down == 150 and ledger.groups_down == {"conv1", "fc1", "classifier"}
    reply = Message(RecordDict(), reply_to=a)
    reply.metadata.__dict__["_src_node_id"] = 1001
    assert ledger.client_of(reply) == 1
    # the SuperLink answers for an unreachable node itself, from node 0: matched by the message it answers
    b.metadata.__dict__["_message_id"] = "m-2"
    error = Message(Error(code=0, reason="Node Unavailable"), reply_to=b)
    error.metadata.__dict__["_src_node_id"] = 0
    assert ledger.client_of(error) == 2
    stray = Message(RecordDict(), reply_to=a)
    stray.metadata.__dict__["_src_node_id"] = 999
    assert ledger.client_of(stray) is None
    ledger.reset()
    assert (ledger.inflight, ledger.sent, ledger.bytes_down, ledger.groups_down) == ({}, {}, 0, set())


def test_no_method_reaches_a_private_member_of_the_base():
    base = (ROOT / "strategies" / "base" / "strategy.py").read_text()
    private = set(re.findall(r"def (_[a-z]\w*)\(", base)) | set(re.findall(r"self\.(_[a-z]\w*)\s*(?::[^=]*)?=", base))
    offenders = {}
    for path in (ROOT / "strategies").glob("*.py"):  # the methods (the base and its parts are in base/)
        text = path.read_text()
        own = set(re.findall(r"def (_[a-z]\w*)\(", text)) | set(re.findall(r"self\.(_[a-z]\w*)\s*(?::[^=]*)?=", text))
        used = (set(re.findall(r"(?:self|super\(\))\.(_[a-z]\w*)", text)) & private) - own
        if used:
            offenders[path.name] = sorted(used)
    assert not offenders, f"methods use private members of the base (make them public hooks): {offenders}"


def test_no_part_of_the_base_writes_another_objects_attributes():
    """The base's parts own their state (RunTiming, Architectures, RoundLedger...): a module-level
    function of strategies/base/ may read the strategy it is given but never assign its attributes."""
    import ast

    offenders = []
    for path in (ROOT / "strategies" / "base").glob("*.py"):
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, ast.FunctionDef) or fn.args.args[:1] and fn.args.args[0].arg in ("self", "cls"):
                continue
            params = {a.arg for a in [*fn.args.args, *fn.args.kwonlyargs]}
            params |= {  # and their aliases (s = strategy)
                target.id
                for node in ast.walk(fn)
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Name) and node.value.id in params
                for target in node.targets
                if isinstance(target, ast.Name)
            }
            for node in ast.walk(fn):
                targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
                for target in targets:
                    for t in ast.walk(target) if target is not None else []:
                        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id in params:
                            offenders.append(f"{path.name}:{node.lineno} {fn.name} sets {t.value.id}.{t.attr}")
    assert not offenders, offenders
