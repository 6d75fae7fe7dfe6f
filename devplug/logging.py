"""Opt-in structlog set-up. Importing devplug configures nothing; the commands call :func:`configure`.

Events are short snake_case verbs (``registered``, ``kubelet_restarted``, ``stream_closed``)
with ``resource`` and ``socket`` bound, so a JSON log line can be filtered by resource.
"""

from __future__ import annotations

import logging
import sys
from typing import Literal, TextIO

import structlog

from devplug._text import rounded

__all__ = ["configure"]

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def configure(
    fmt: Literal["auto", "json", "console"] = "auto",
    level: Literal["debug", "info", "warning", "error"] = "info",
    stream: TextIO | None = None,
) -> None:
    """Send structlog events to ``stream`` (default stderr) as JSON lines or console text.

    ``auto`` picks JSON when the stream is not a terminal (a DaemonSet's log collector) and
    console rendering otherwise.
    """
    out = stream if stream is not None else sys.stderr
    if fmt == "auto":
        fmt = "console" if out.isatty() else "json"
    renderer: structlog.typing.Processor
    if fmt == "json":
        renderer = structlog.processors.JSONRenderer()
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=out.isatty())
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info if fmt == "json" else _passthrough,
            _round_numbers,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=False,
    )


def _round_numbers(
    logger: structlog.typing.WrappedLogger, name: str, event: structlog.typing.EventDict
) -> structlog.typing.EventDict:
    """Floats to three significant digits (devplug._text.rounded): durations, delays and
    latencies read 0.123, not 0.12345678901, whichever code logged them."""
    for key, value in event.items():
        if isinstance(value, float):
            event[key] = rounded(value)
        elif isinstance(value, list | tuple) and any(isinstance(v, float) for v in value):
            event[key] = [rounded(v) if isinstance(v, float) else v for v in value]
    return event


def _passthrough(
    logger: structlog.typing.WrappedLogger, name: str, event: structlog.typing.EventDict
) -> structlog.typing.EventDict:
    return event  # the console renderer formats exceptions itself
