"""A grid whose server dies mid-run: what checkpoint and resume tests crash a run with."""

from __future__ import annotations

from pflower.simulation.inprocess import InProcessGrid


class Crash(RuntimeError):
    """The server process was killed (raised by :class:`CrashingGrid`)."""


class CrashingGrid(InProcessGrid):
    """Raises when the train messages of round ``crash_at`` are sent (the server process dies).

    With ``after_replies`` the clients train and save their state first, and the server dies
    before it aggregates (mid-round).
    """

    def __init__(self, *args, crash_at: int | None = None, after_replies: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.crash_at = crash_at
        self.after_replies = after_replies

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        rounds = {
            int(m.content.config_records["config"]["server-round"])
            for m in messages
            if m.metadata.message_type == "train"
        }
        if self.crash_at in rounds:
            if self.after_replies:
                super().send_and_receive(messages, timeout=timeout)
            raise Crash(
                f"server killed {'after the replies of' if self.after_replies else 'before'} round {self.crash_at}"
            )
        return super().send_and_receive(messages, timeout=timeout)
