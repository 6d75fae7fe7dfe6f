"""What the NVIDIA DRA tests share: a fake cluster (API server and kubelet with its plugin watcher),
the published taints, and an environment free of NVIDIA's and devplug's variables."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from devplug.testing import FakeKubeAPI, FakeKubelet

NODE = "node-a"
DRIVER = "gpu.nvidia.com"

# The variables devplug-nvidia reads besides DEVPLUG_*: a test's process must not inherit them.
NVIDIA_ENV = (
    "MIG_STRATEGY",
    "CONFIG_FILE",
    "NVIDIA_DRIVER_ROOT",
    "DEVPLUG_FAKE_NVML",
    "NODE_NAME",
    "CDI_ROOT",
    "KUBELET_REGISTRAR_DIRECTORY_PATH",
    "FEATURE_GATES",
    "ADDITIONAL_XIDS_TO_IGNORE",
    "CONSUMABLE_SHARES",
    "HOST_ROOT",
    "HTTP_ENDPOINT",
    "METRICS_PATH",
    "SERVICE_ACCOUNT_NAME",
    "IMAGE_PULL_SECRETS",
    "IMAGE_PULL_POLICY",
)


def nvidia_env(**extra: str) -> dict[str, str]:
    """This process's environment without NVIDIA's and devplug's variables, plus ``extra``."""
    kept = {k: v for k, v in os.environ.items() if k not in NVIDIA_ENV and not k.startswith("DEVPLUG_")}
    return kept | extra


@asynccontextmanager
async def dra_cluster(
    short_dir: Path, node: str = NODE
) -> AsyncIterator[tuple[FakeKubeAPI, FakeKubelet, Path]]:
    """FakeKubeAPI, and a FakeKubelet whose plugin watcher serves DRA drivers under
    the kubelet root ``short_dir/k`` (its ``plugins_registry`` made, as the kubelet makes it).
    Yields (api, kubelet, kubelet root)."""
    kubelet_root = short_dir / "k"
    async with (
        FakeKubeAPI() as api,
        FakeKubelet(
            short_dir / "dp",
            plugins_registry_dir=kubelet_root / "plugins_registry",
            dra=True,
            kube_api=api,
            node_name=node,
        ) as kubelet,
    ):
        yield api, kubelet, kubelet_root


def published_taints(
    api: FakeKubeAPI, node: str = NODE, driver: str = DRIVER
) -> dict[str, list[dict[str, Any]]]:
    """The published taints by device name (``timeAdded`` left out); untainted devices too."""
    out: dict[str, list[dict[str, Any]]] = {}
    for item in api.slices(node=node, driver=driver):
        for device in item["spec"].get("devices") or ():
            out[device["name"]] = [
                {k: v for k, v in t.items() if k != "timeAdded"} for t in device.get("taints") or ()
            ]
    return out


async def wait_taints(
    api: FakeKubeAPI, predicate: Callable[[dict[str, list[dict[str, Any]]]], bool], node: str = NODE
) -> dict[str, list[dict[str, Any]]]:
    """Wait until the published taints satisfy ``predicate``; return them."""
    await api.wait_for_slices(
        node=node, driver=DRIVER, predicate=lambda _: predicate(published_taints(api, node)), timeout=10
    )
    return published_taints(api, node)
