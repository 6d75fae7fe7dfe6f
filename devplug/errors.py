"""The errors devplug raises and authors may catch or raise."""

from __future__ import annotations

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
