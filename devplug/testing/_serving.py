"""Serve plugins in the background of a test, pointed at a FakeKubelet."""

from __future__ import annotations

from contextlib import asynccontextmanager
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from devplug import DevicePlugin, Plugins, Runner, Settings
    from devplug.dra import DraDriver, DualHost
    from devplug.testing._kubeapi.server import FakeKubeAPI
    from devplug.testing._kubelet.kubelet import FakeKubelet


@asynccontextmanager
async def serving(
    plugins: Plugins,
    kubelet: FakeKubelet | None = None,
    *,
    settings: Settings | None = None,
    **overrides: Any,
) -> AsyncIterator[Runner]:
    """Run devplug for ``plugins`` while the block runs; stopped (as on SIGTERM) on exit.

    Args:
        plugins: what :func:`devplug.serve` takes: a plugin, several, or a plugin source.
        kubelet: point the settings at this fake kubelet's directories, with the retry and
            shutdown delays shortened for tests.
        settings: use these settings instead (then ``kubelet`` and ``overrides`` are ignored).
        overrides: further :class:`devplug.Settings` fields, e.g. ``registration="watcher"``.

    Yields the :class:`devplug.Runner`, whose ``resources`` show each resource's status.
    """
    # The runtime is imported here, not at module level: the rest of the testing kit talks to
    # plugins over gRPC only, and must not need devplug's runtime.
    from devplug import Runner, Settings

    if settings is None:
        values: dict[str, Any] = {"retry_initial": 0.02, "retry_max": 0.2, "shutdown_grace": 0.2}
        if kubelet is not None:
            values["device_plugin_dir"] = kubelet.device_plugin_dir
            if kubelet.plugins_registry_dir is not None:
                values["plugins_registry_dir"] = kubelet.plugins_registry_dir
        settings = Settings(**(values | overrides))
    runner = Runner(plugins, settings)
    async with anyio.create_task_group() as tg:
        tg.start_soon(partial(runner.run, handle_signals=False))
        await runner.wait_started()
        yield runner
        tg.cancel_scope.cancel()


@asynccontextmanager
async def serving_dra(
    plugins: DevicePlugin | list[DevicePlugin],
    kube_api: FakeKubeAPI,
    kubelet_root: Path | str | FakeKubelet,
    *,
    node_name: str | None = None,
    **overrides: Any,
) -> AsyncIterator[DraDriver]:
    """Run ``plugins`` as a DRA driver while the block runs; stopped (as on SIGTERM) on exit.

    The driver talks to ``kube_api`` (a kubeconfig is written under ``kubelet_root``), serves its
    sockets under ``kubelet_root`` (``plugins/<driver>/`` and ``plugins_registry/``, which is
    created here as the kubelet would) and writes CDI specs to ``<kubelet_root>/cdi`` unless
    ``cdi_dir`` is given. The node is added to ``kube_api`` if missing.

    Args:
        plugins: the plugin, or the plugins, the driver serves.
        kube_api: the API server the driver publishes its ResourceSlices to.
        kubelet_root: the kubelet's root directory; or a :class:`FakeKubelet` in DRA mode (the
            ``fake_dra_kubelet`` fixture), whose plugin watcher the driver then registers with:
            its ``plugins_registry_dir``, the directory above it as the root, and its node.
        node_name: the driver's node (default: the FakeKubelet's, else ``node-1``).
        overrides: further :class:`devplug.Settings` fields, e.g. ``driver_name="widget.example.com"``.

    Yields the :class:`devplug.dra.DraDriver`: its ``dra_socket``, ``registration_socket``,
    ``settings`` (``settings.cdi_dir``), ``readiness()`` and ``debug_state()``.
    """
    from pathlib import Path

    from devplug import Settings
    from devplug.dra import DraDriver

    where: dict[str, Any] = {}
    if isinstance(kubelet_root, (Path, str)):
        root = Path(kubelet_root)
    else:
        registry = kubelet_root.plugins_registry_dir
        if registry is None or kubelet_root._dra is None:
            raise ValueError("serving_dra needs a FakeKubelet in DRA mode (dra=True, plugins_registry_dir)")
        root = registry.parent
        where["plugins_registry_dir"] = registry
        node_name = node_name or kubelet_root.node_name
    node_name = node_name or "node-1"
    await anyio.Path(root).mkdir(parents=True, exist_ok=True)
    if not any(n["metadata"]["name"] == node_name for n in kube_api.nodes()):
        kube_api.add_node(node_name)
    values: dict[str, Any] = {
        "api": "dra",
        "kubelet_root": root,
        **where,
        "node_name": node_name,
        "kubeconfig": kube_api.write_kubeconfig(root / "kubeconfig"),
        "cdi_dir": root / "cdi",
        "shutdown_grace": 0.2,
    }
    settings = Settings(**(values | overrides))
    # The kubelet's plugin watcher creates plugins_registry/ at start; the driver waits for it.
    await anyio.Path(settings.plugins_registry_dir).mkdir(parents=True, exist_ok=True)
    async with _running(DraDriver(plugins if isinstance(plugins, list) else [plugins], settings)) as driver:
        yield driver


@asynccontextmanager
async def serving_both(
    plugins: DevicePlugin | list[DevicePlugin],
    kube_api: FakeKubeAPI,
    kubelet: FakeKubelet,
    **overrides: Any,
) -> AsyncIterator[DualHost]:
    """Run ``plugins`` through both APIs (``api=device-plugin,dra``) while the block runs, with
    ``kubelet`` (a :class:`FakeKubelet` in DRA mode) as the node's kubelet: the device-plugin
    side registers on its ``kubelet.sock``, the DRA driver with its plugin watcher, the holders
    are read from its pod-resources API. Stopped (as on SIGTERM) on exit.

    Yields the :class:`devplug.dra.DualHost`: ``dra`` (the driver), ``device_plugin`` (its
    ``resources``), ``ledger`` (who holds what), ``readiness()`` and ``debug_state()``.

    Raises:
        ValueError: ``kubelet`` is not in DRA mode.
    """
    from devplug import Settings
    from devplug.dra import DualHost

    registry = kubelet.plugins_registry_dir
    if registry is None or kubelet._dra is None:
        raise ValueError("serving_both needs a FakeKubelet in DRA mode (dra=True, plugins_registry_dir)")
    root = registry.parent
    if not any(n["metadata"]["name"] == kubelet.node_name for n in kube_api.nodes()):
        kube_api.add_node(kubelet.node_name)
    values: dict[str, Any] = {
        "api": "device-plugin,dra",
        "kubelet_root": root,
        "device_plugin_dir": kubelet.device_plugin_dir,
        "plugins_registry_dir": registry,
        "node_name": kubelet.node_name,
        "kubeconfig": kube_api.write_kubeconfig(root / "kubeconfig"),
        "cdi_dir": root / "cdi",
        "retry_initial": 0.02,
        "retry_max": 0.2,
        "shutdown_grace": 0.2,
        "pod_resources_interval": 1.0,
    }
    settings = Settings(**(values | overrides))
    async with _running(DualHost(plugins if isinstance(plugins, list) else [plugins], settings)) as host:
        yield host


H = TypeVar("H", "DraDriver", "DualHost")


@asynccontextmanager
async def _running(host: H) -> AsyncIterator[H]:
    """``host`` serving in the background (30 s to start) while the block runs, then stopped."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(partial(host.run, handle_signals=False))
        with anyio.fail_after(30):
            await host.wait_started()
        yield host
        tg.cancel_scope.cancel()
