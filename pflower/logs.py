"""Log hygiene for both sides: a user sees pflower's lines and real warnings, not Flower's known noise.

Dropped (each is logged by Flower whatever the user does, and says nothing about their run):
- "DEPRECATED FEATURE: The `run_simulation` function is deprecated": ``pflower sim`` needs the
  in-process simulation entry (a hydra sweep runs several ServerApps in one process); flwr 1.41
  has no supported replacement for it, only `flwr run` through a SuperLink, which pflower also
  supports.
- "Manually terminating ClientAppActor": Ray's actors say it at every normal shutdown.
- "Since flwr 1.32, default simulated SuperNodes changed from 10 to 2": printed even when the
  user gave the number (only where pflower's code is loaded before it: not in the
  flwr-simulation process of `flwr run`, which logs it before loading the ServerApp).
Colour codes are written only to a terminal (and never with ``NO_COLOR`` set).

Shortened: a pflower error that is the user's to fix (a class with ``user_error = True``, such as
a method option that does not exist), raised in a user's own ServerApp, reaches Flower's log as
one ``pflower: ...`` line instead of a traceback (:func:`one_line_user_errors`, installed when
``pflower.strategies`` is imported).
"""

from __future__ import annotations

import logging
import os
import sys

from .compat import FLOWER_LOGGER, update_console_handler

NOISE = (
    "The `run_simulation` function is deprecated",
    "Manually terminating ClientAppActor",
    "default simulated SuperNodes changed from 10 to 2",
)


class DropFlowerNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except (TypeError, ValueError):
            return True
        return not any(n in text for n in NOISE)


_FILTER = DropFlowerNoise()


def use_colour() -> bool:
    return sys.stderr.isatty() and not os.environ.get("NO_COLOR")


def quiet_flower_logs() -> None:
    """Install the noise filter on Flower's logger (once) and colour only a terminal."""
    if _FILTER not in FLOWER_LOGGER.filters:
        FLOWER_LOGGER.addFilter(_FILTER)
    update_console_handler(colored=use_colour())


class OneLineUserErrors(logging.Filter):
    """Flower logs a ServerApp's exception with its traceback ("... raised an exception"); for a
    pflower error marked ``user_error`` (the message names the setting and the fix) the record
    becomes that one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and getattr(exc, "user_error", False):
            record.msg, record.args = "pflower: %s", (exc,)
            record.exc_info, record.exc_text = None, None
            record.pflower_user_error = exc  # pflower's own ServerApp, which logged the line already, drops it
        return True


_ONE_LINE = OneLineUserErrors()


def one_line_user_errors() -> None:
    """Install :class:`OneLineUserErrors` on Flower's logger (once)."""
    if _ONE_LINE not in FLOWER_LOGGER.filters:
        FLOWER_LOGGER.addFilter(_ONE_LINE)
