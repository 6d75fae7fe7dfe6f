"""The errors devplug raises and authors may catch or raise."""

from __future__ import annotations

import sys

if sys.version_info < (3, 11):  # anyio depends on the backport there
    from exceptiongroup import BaseExceptionGroup  # type: ignore[import-not-found,unused-ignore]

__all__ = ["ConfigError", "DevplugError", "KubeletError", "RegistrationError"]


class DevplugError(Exception):
    """Base class of every error devplug raises on purpose."""


class ConfigError(DevplugError):
    """Settings or a config file are invalid; the message names the field and the problem."""


class KubeletError(DevplugError):
    """The kubelet (or the fake one) answered an RPC with an error."""

    def __init__(self, message: str, code: str = "UNKNOWN") -> None:
        super().__init__(message)
        self.code = code
        """The gRPC status code name, e.g. ``"UNKNOWN"`` or ``"INVALID_ARGUMENT"``."""


class RegistrationError(KubeletError):
    """The kubelet refused a registration (bad version, bad resource name, ...)."""


def config_error_in(exc: BaseException) -> ConfigError | None:
    """``exc`` if it is a ConfigError, or the first ConfigError of an exception group (nested
    groups included) that holds nothing else: a refusal for a command to say in one line. None
    otherwise, so that a group mixing a refusal with another failure keeps its traceback."""
    leaves: list[BaseException] = []
    pending: list[BaseException] = [exc]
    while pending:
        current = pending.pop(0)
        if isinstance(current, BaseExceptionGroup):
            pending[:0] = current.exceptions
        else:
            leaves.append(current)
    first = leaves[0] if leaves else None
    if isinstance(first, ConfigError) and all(isinstance(e, ConfigError) for e in leaves):
        return first
    return None
