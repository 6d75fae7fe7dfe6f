"""FakeKubeAPI and a real kube-apiserver side by side: the same test runs against both.

The real one is etcd and kube-apiserver started as envtest starts them, from the directory that
``KUBEBUILDER_ASSETS`` names (``e2e/node build`` makes one: its default is used when the variable
is unset), once per test module, so that it loads the machine only while those tests run.
Without it the real half of each test is skipped with the reason, and fails where
``DEVPLUG_E2E_REQUIRED`` is set (CI).
"""

from __future__ import annotations

import os
import shutil
import ssl
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx2
import lightkube
import pytest

from devplug.testing import FakeKubeAPI
from tests.testing.kubeapi.test_kubeapi_kit import SLICES

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "e2e"))
import localnode  # noqa: E402  (e2e/ is not a package)


def assets() -> Path:
    return Path(os.environ.get("KUBEBUILDER_ASSETS") or localnode.k8s_dir(localnode.DEFAULT_K8S) / "assets")


@dataclass
class RealAPI:
    url: str
    token: str
    ca: str
    kubeconfig: Path


@dataclass
class Kube:
    """One API server under test: FakeKubeAPI (``fake`` set) or the real one."""

    name: str
    url: str
    fake: FakeKubeAPI | None = None
    real: RealAPI | None = None

    def raw(self) -> httpx2.AsyncClient:
        """HTTP for what lightkube cannot send (bodies on DELETE, strict validation, raw watches)."""
        if self.real is None:
            return httpx2.AsyncClient(base_url=self.url, trust_env=False, timeout=10)
        return httpx2.AsyncClient(
            base_url=self.url,
            trust_env=False,
            timeout=10,
            verify=ssl.create_default_context(cafile=self.real.ca),
            headers={"Authorization": f"Bearer {self.real.token}"},
        )

    def client(self) -> lightkube.AsyncClient:
        if self.fake is not None:
            return self.fake.client()
        assert self.real is not None
        return lightkube.AsyncClient(lightkube.KubeConfig.from_file(self.real.kubeconfig), trust_env=False)

    async def slice_names(self) -> list[str]:
        async with self.raw() as http:
            answer = await http.get(SLICES)
        return sorted(item["metadata"]["name"] for item in answer.json()["items"])


@pytest.fixture(scope="module")  # a few seconds a module; nothing runs on after its tests
def real_api_server() -> Iterator[RealAPI]:
    where = assets()
    if not (where / "kube-apiserver").is_file():
        reason = f"no kube-apiserver in {where} (KUBEBUILDER_ASSETS; e2e/node build makes one)"
        if os.environ.get("DEVPLUG_E2E_REQUIRED"):
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    run = Path(tempfile.mkdtemp(prefix="dpapi-", dir="/tmp"))
    try:
        node = localnode.control_plane(run, where)
    except localnode.Failure as exc:
        shutil.rmtree(run, ignore_errors=True)
        pytest.fail(f"the real API server did not start: {exc}", pytrace=False)
    try:
        yield RealAPI(
            url=f"https://127.0.0.1:{node.state['ports']['apiserver']}",
            token=node.state["token"],
            ca=str(run / "pki" / "ca.crt"),
            kubeconfig=node.kubeconfig,
        )
    finally:
        localnode.down(run, quiet=True)
        shutil.rmtree(run, ignore_errors=True)


@pytest.fixture(params=["fake", "real"])
async def kube(request: pytest.FixtureRequest) -> AsyncIterator[Kube]:
    """FakeKubeAPI, then the real API server with no ResourceSlice in it."""
    if request.param == "fake":
        async with FakeKubeAPI() as api:
            yield Kube("fake", api.url, fake=api)
        return
    real: RealAPI = request.getfixturevalue("real_api_server")
    kube = Kube("real", real.url, real=real)
    async with kube.raw() as http:
        await http.delete(SLICES)  # what earlier tests left
    yield kube
