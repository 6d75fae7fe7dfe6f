"""The kubelet's registration rules and error texts, as pure functions.

No I/O and no gRPC here: the fake kubelet calls these and sends the texts back exactly as
the kubelet words them, so plugins (and their tests) can match on them.
"""

from __future__ import annotations

import posixpath
from typing import TYPE_CHECKING

from devplug._names import is_extended_resource_name

if TYPE_CHECKING:
    from collections.abc import Sequence

SUPPORTED_VERSIONS = ("v1beta1",)
KUBELET_SOCKET = "kubelet.sock"
CHECKPOINT = "kubelet_internal_checkpoint"
DEVICE_PLUGIN_TYPE = "DevicePlugin"
# sun_path is 108 bytes on Linux, one of which is the terminating NUL.
MAX_UNIX_PATH = 107

# Go's %q escapes these; everything else printable is written as is.
_GO_ESCAPES = {'"': '\\"', "\\": "\\\\", "\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r",
               "\t": "\\t", "\v": "\\v"}  # fmt: skip


def go_quote(text: str) -> str:
    """Quote ``text`` the way Go's ``%q`` verb does, for error texts built like the kubelet's."""
    out = []
    for char in text:
        if char in _GO_ESCAPES:
            out.append(_GO_ESCAPES[char])
        elif char.isprintable():
            out.append(char)
        elif ord(char) < 0x80:
            out.append(f"\\x{ord(char):02x}")
        elif ord(char) <= 0xFFFF:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(f"\\U{ord(char):08x}")
    return '"' + "".join(out) + '"'


def unsupported_version_error(version: str) -> str:
    """The kubelet's text for a ``RegisterRequest.version`` it does not speak."""
    supported = "[" + " ".join(go_quote(v) for v in SUPPORTED_VERSIONS) + "]"
    return (
        f"requested API version {go_quote(version)} is not supported by kubelet. "
        f"Supported version is {supported}"
    )


def invalid_resource_name_error(name: str) -> str:
    """The kubelet's text for a resource name that is not an extended resource name."""
    return f"the ResourceName {go_quote(name)} is invalid"


def validate_register(version: str, resource_name: str) -> str | None:
    """Check a ``RegisterRequest`` as the kubelet does: version first, then the name.

    Returns:
        The kubelet's error text, or ``None`` when the request is acceptable.
    """
    if version not in SUPPORTED_VERSIONS:
        return unsupported_version_error(version)
    if not is_extended_resource_name(resource_name):
        return invalid_resource_name_error(resource_name)
    return None


def validate_plugin_info(name: str, supported_versions: Sequence[str]) -> str | None:
    """Check a plugin-watcher ``PluginInfo`` as the device manager's ``ValidatePlugin`` does.

    Returns:
        The kubelet's error text, or ``None`` when the plugin is acceptable.
    """
    if not any(v in SUPPORTED_VERSIONS for v in supported_versions):
        # Go prints a []string with %v as [a b c].
        versions = "[" + " ".join(supported_versions) + "]"
        return f"manager version, {SUPPORTED_VERSIONS[0]}, is not among plugin supported versions {versions}"
    if not is_extended_resource_name(name):
        return f"invalid name of device plugin socket: {invalid_resource_name_error(name)}"
    return None


def join_endpoint(directory: str, endpoint: str) -> str:
    """Join ``endpoint`` under ``directory`` like Go's ``filepath.Join``.

    Unlike ``pathlib``, an absolute endpoint does not replace the directory and ``..`` is
    resolved lexically: this is the path the kubelet dials for ``RegisterRequest.endpoint``.
    """
    if not endpoint:
        return posixpath.normpath(directory)
    return posixpath.normpath(f"{directory}/{endpoint}")


def check_unix_path(path: str) -> None:
    """Raise ``ValueError`` if ``path`` is too long to bind or dial as a unix socket."""
    size = len(path.encode())
    if size > MAX_UNIX_PATH:
        raise ValueError(
            f"unix socket path {path!r} is {size} bytes; AF_UNIX allows at most {MAX_UNIX_PATH}: "
            "use a shorter directory, e.g. tempfile.mkdtemp(prefix='dp-', dir='/tmp')"
        )


_GO_CODE_NAMES = {"OK": "OK", "CANCELLED": "Canceled"}


def go_rpc_error(code_name: str, details: str) -> str:
    """Render a gRPC status the way Go's ``status.Error`` prints (``rpc error: code = ... desc = ...``).

    Args:
        code_name: the Python ``grpc.StatusCode`` member name, e.g. ``"DEADLINE_EXCEEDED"``.
        details: the status message.
    """
    go_name = _GO_CODE_NAMES.get(code_name) or "".join(p.capitalize() for p in code_name.split("_"))
    return f"rpc error: code = {go_name} desc = {details}"


def status_not_sent_error(path: str, rpc: str) -> str:
    """The kubelet's text when NotifyRegistrationStatus(registered=true) failed with ``rpc``."""
    return f"RegisterPlugin error -- failed to send registration status at socket {path}, err: {rpc}"


STATUS_CUT_BY_STOP = go_rpc_error("CANCELLED", "context canceled")
"""Why a registration status was never sent when the kubelet stopped (or the plugin's socket
went) while sending it: the plugin was registered all the same, and is recorded with this."""
