"""The API server, as the driver uses it: the only module that touches the client library.

lightkube's AsyncClient (typed resources, asyncio-native over httpx) underneath; objects cross
this module's boundary as plain JSON dicts, and every failure as :class:`KubeError` carrying the
HTTP status (None when the server could not be reached) and the server's message.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from devplug.errors import ConfigError, DevplugError

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from lightkube import AsyncClient


class KubeError(DevplugError):
    """An API request failed: ``status`` is the HTTP status, None when it never got an answer."""

    def __init__(self, message: str, status: int | None = None, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason

    @property
    def status_label(self) -> str:
        """The status for logs and metrics: ``403``, or ``unreachable``."""
        return str(self.status) if self.status is not None else "unreachable"


def load_client(kubeconfig: Path | None) -> Kube:
    """A client for the API server of ``kubeconfig``, else the in-cluster service account, else
    $KUBECONFIG or ~/.kube/config.

    Raises:
        ConfigError: no usable configuration (one line saying which file and why).
    """
    import lightkube
    import yaml
    from lightkube.core.exceptions import ConfigError as LightkubeConfigError

    try:
        if kubeconfig is not None:
            config = lightkube.KubeConfig.from_file(kubeconfig)
        else:
            config = lightkube.KubeConfig.from_env()
        client = lightkube.AsyncClient(config, field_manager="devplug")
    except (
        OSError,
        LightkubeConfigError,
        ValueError,
        KeyError,
        TypeError,
        AttributeError,
        yaml.YAMLError,
    ) as exc:
        where = (
            f"kubeconfig {kubeconfig}"
            if kubeconfig is not None
            else "no in-cluster service account and no kubeconfig"
        )
        detail = getattr(exc, "strerror", None) or str(exc).splitlines()[0] or type(exc).__name__
        if isinstance(exc, yaml.YAMLError | TypeError | AttributeError | KeyError):
            detail = f"not a kubeconfig file ({type(exc).__name__}: {detail})"
        hint = "" if kubeconfig is not None else " (pass --kubeconfig FILE)"
        raise ConfigError(f"{where}: {detail}{hint}") from None
    return Kube(client)


class Kube:
    """The calls a DRA driver makes, each raising :class:`KubeError`."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def aclose(self) -> None:
        await self._client.close()

    async def node_uid(self, node: str) -> str:
        from lightkube.resources.core_v1 import Node

        async with _errors():
            obj = await self._client.get(Node, node)
        return str(obj.metadata.uid if obj.metadata else "")

    async def claim(self, namespace: str, name: str) -> dict[str, Any]:
        from lightkube.resources.resource_v1 import ResourceClaim

        async with _errors():
            obj = await self._client.get(ResourceClaim, name, namespace=namespace)
        return _dict(obj)

    async def list_slices(self, driver: str, node: str) -> tuple[list[dict[str, Any]], str]:
        """The driver's slices of the node, and the list's resourceVersion (to watch from)."""
        from lightkube.resources.resource_v1 import ResourceSlice

        async with _errors():
            listing = self._client.list(ResourceSlice, fields={"spec.driver": driver, "spec.nodeName": node})
            items = [_dict(obj) async for obj in listing]
            return items, listing.resourceVersion

    async def watch_slices(
        self, driver: str, node: str, resource_version: str
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """(event type, object) from ``resource_version`` on; ends (or raises) when the watch breaks."""
        from lightkube.resources.resource_v1 import ResourceSlice

        async with _errors():
            async for kind, obj in self._client.watch(
                ResourceSlice,
                fields={"spec.driver": driver, "spec.nodeName": node},
                resource_version=resource_version,
                server_timeout=300,  # a broken watch raises: the caller lists again
            ):
                yield kind, _dict(obj)

    async def create_slice(self, obj: dict[str, Any]) -> dict[str, Any]:
        from lightkube.resources.resource_v1 import ResourceSlice

        async with _errors():
            return _dict(await self._client.create(ResourceSlice.from_dict(obj)))

    async def replace_slice(self, obj: dict[str, Any]) -> dict[str, Any]:
        from lightkube.resources.resource_v1 import ResourceSlice

        async with _errors():
            return _dict(await self._client.replace(ResourceSlice.from_dict(obj)))

    async def delete_slice(self, name: str) -> None:
        from lightkube.resources.resource_v1 import ResourceSlice

        async with _errors():
            await self._client.delete(ResourceSlice, name)


def _dict(obj: Any) -> dict[str, Any]:
    data: dict[str, Any] = obj.to_dict()
    return data


class _errors:
    """Turns the client library's failures into KubeError."""

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        if exc is None or not isinstance(exc, Exception) or isinstance(exc, KubeError):
            return
        import httpx2
        from lightkube import ApiError

        if isinstance(exc, ApiError):
            status = exc.status
            raise KubeError(status.message or str(exc), status.code, status.reason or "") from None
        if isinstance(exc, httpx2.HTTPError | OSError):
            raise KubeError(f"API server unreachable: {exc or type(exc).__name__}") from None
