"""pflower-supernode's idle poll (client_app/supernode.py, issue 62): fast for a while after a
message, Flower's 3 s when idle; every other sleep untouched; installed into Flower's own loop."""

from __future__ import annotations

import pytest

from pflower import compat
from pflower.client_app import supernode


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_wait_is_short_after_a_message_and_flowers_when_idle():
    clock, slept = Clock(), []
    poll = supernode.AdaptivePoll(clock, slept.append)
    poll.sleep(3)  # just started: a message may come soon
    clock.now += supernode.HOT_S + 0.1
    poll.sleep(3)  # idle: Flower's pace
    poll.pulled()
    poll.sleep(3)
    poll.sleep(0.5)  # another of Flower's waits: passed through as it is
    assert slept == [supernode.FAST_S, supernode.IDLE_S, supernode.FAST_S, 0.5]
    assert poll.waits == [supernode.FAST_S, supernode.IDLE_S, supernode.FAST_S]
    assert callable(poll.monotonic)  # the rest of `time` is the real one


def test_install_puts_the_poll_into_flowers_loop_and_marks_each_pulled_message(monkeypatch):
    loop = compat.supernode_loop()
    monkeypatch.setattr(loop.module, "time", loop.module.time)  # restored after the test
    monkeypatch.setattr(loop.module, "_pull_and_store_message", loop.module._pull_and_store_message)
    monkeypatch.setattr(loop.module, "_push_messages", loop.module._push_messages)
    answers = iter([None, 7])
    monkeypatch.setattr(
        compat,
        "supernode_loop",
        lambda: type(loop)(
            module=loop.module, pull=lambda **kw: next(answers), push=lambda **kw: None, flower_supernode=None
        ),
    )
    clock = Clock()
    poll = supernode.install(supernode.AdaptivePoll(clock, lambda s: None))
    assert loop.module.time is poll
    clock.now += supernode.HOT_S + 1
    assert loop.module._pull_and_store_message(state=None) is None and poll.hot_until < clock.now
    assert loop.module._pull_and_store_message(state=None) == 7 and poll.hot_until > clock.now
    clock.now += supernode.HOT_S + 1  # the ClientApp trained longer than the window
    loop.module._push_messages(state=None)  # its reply sent: the next message is due
    assert poll.hot_until > clock.now


def test_a_pflower_supernode_counts_as_a_supernode_for_the_thread_share(tmp_path):
    from pflower.client_app import node

    for pid, argv in enumerate(
        [
            [b"/usr/bin/python3", b"/venv/bin/flower-supernode"],
            [b"/venv/bin/pflower-supernode", b"--insecure"],
            [b"bash"],
        ]
    ):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cmdline").write_bytes(b"\0".join(argv))
    assert node.supernodes_on_host(tmp_path) == 2


def test_the_heartbeat_flag_is_taken_out_and_a_value_the_superlink_refuses_stops_here():
    assert supernode.split_heartbeat(["--superlink", "a:1", "--heartbeat-interval", "10", "--insecure"]) == (
        10.0,
        ["--superlink", "a:1", "--insecure"],
    )
    assert supernode.split_heartbeat(["--heartbeat-interval=45.5"]) == (45.5, [])
    assert supernode.split_heartbeat(["--insecure"]) == (None, ["--insecure"])  # Flower's 30 s
    for bad in ("5", "1801", "soon", "nan"):
        with pytest.raises(SystemExit, match=f"--heartbeat-interval '{bad}': give seconds between 10 and 1800"):
            supernode.split_heartbeat(["--heartbeat-interval", bad])
    with pytest.raises(SystemExit, match="pflower-supernode: --heartbeat-interval needs seconds between 10 and 1800"):
        supernode.split_heartbeat(["--heartbeat-interval"])


def test_the_interval_reaches_what_the_node_announces_and_how_often_it_sends(monkeypatch):
    import flwr.supercore.heartbeat as sender
    import flwr.supernode.fleet_http_connection as connection

    for module in (connection, sender):
        monkeypatch.setattr(module, "HEARTBEAT_DEFAULT_INTERVAL", module.HEARTBEAT_DEFAULT_INTERVAL)
    assert connection.HEARTBEAT_DEFAULT_INTERVAL == 30  # Flower's, announced at activation
    supernode.set_heartbeat(10)
    assert connection.HEARTBEAT_DEFAULT_INTERVAL == sender.HEARTBEAT_DEFAULT_INTERVAL == 10
    # the sender's wait between heartbeats, computed as Flower's thread computes it: (10 - 5) x 0.7-0.9
    waits = []
    beat = sender.HeartbeatSender(lambda: True)
    monkeypatch.setattr(beat._stop_event, "wait", lambda s: waits.append(s) or beat._stop_event.set())
    beat._run()
    assert 3.5 <= waits[0] <= 4.5


def test_the_command_takes_its_own_flags_out_and_steady_poll_leaves_flowers_loop_alone(monkeypatch):
    import sys

    for steady in (False, True):
        ran, installed, beats = [], [], []
        fake = type("Loop", (), {"flower_supernode": staticmethod(lambda: ran.append(list(sys.argv[1:])))})
        monkeypatch.setattr(compat, "supernode_loop", lambda: fake)
        monkeypatch.setattr(supernode, "install", lambda: installed.append(True))
        monkeypatch.setattr(supernode, "remember_acceptance", lambda marker: None)
        monkeypatch.setattr(supernode, "set_heartbeat", beats.append)
        flags = ["--heartbeat-interval", "10", *(["--steady-poll"] if steady else [])]
        monkeypatch.setattr(sys, "argv", ["pflower-supernode", "--superlink", "a:1", *flags, "--insecure"])
        supernode.main()
        assert ran == [["--superlink", "a:1", "--insecure"]] and beats == [10.0]
        assert installed == ([] if steady else [True])


def test_a_refused_activation_says_whether_the_key_was_accepted_before(tmp_path, monkeypatch):
    """Issue 76 (8): Flower's "[code: 2004] Failed to activate SuperNode" (exit code 305) is the
    same for an unregistered key and a node restarted too early; pflower-supernode adds which one
    it is by its own history: a key accepted by this SuperLink before (marked at its first pull)."""
    import logging

    from pflower.client_app import supernode

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    argv = ["--superlink", "127.0.0.1:9092", "--auth-supernode-private-key", str(tmp_path / "node")]
    marker = supernode.accepted_marker(argv)
    assert marker != supernode.accepted_marker([*argv[:1], "127.0.0.1:9093", *argv[2:]])  # per SuperLink
    diagnose = supernode.DiagnoseRefusal(marker, 10.0)
    flower_exit = (
        "Exit Code: 305\nFailed to initialize the connection to the SuperLink.\n"
        "[code: 2004] Failed to activate SuperNode."
    )

    def said() -> str:
        record = logging.LogRecord("flwr", logging.ERROR, "x", 1, flower_exit, (), None)
        assert diagnose.filter(record)
        return record.getMessage()

    assert "never accepted by this SuperLink: most likely it is not registered" in said()
    marker.parent.mkdir(parents=True)
    marker.write_text("accepted\n")
    assert "accepted by this SuperLink before" in said() and "up to 20 s" in said()
    other = logging.LogRecord("flwr", logging.ERROR, "x", 1, "Exit Code: 305\nanother failure", (), None)
    assert diagnose.filter(other) and other.getMessage() == "Exit Code: 305\nanother failure"
