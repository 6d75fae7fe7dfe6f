"""The rules of docs/security.md, enforced: private sockets whatever the umask, only what the
plugin created is removed, no symlink in the kubelet directories is followed, world-writable
kubelet directories are refused (or warned about), the metrics port binds only where told,
and no secret from the environment reaches the log."""

from __future__ import annotations

import os
import signal
import socket
import stat
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import grpc
import pytest
from anyio.abc import Process
from structlog.testing import capture_logs

from devplug import ConfigError, Runner
from devplug._device_plugin import resource as resource_module
from devplug._proto.deviceplugin.v1beta1 import api_pb2 as pb
from devplug._proto.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc
from devplug._runtime.sockets import SocketServer, directory_exposure, unique_socket_name
from devplug.testing import FakeKubelet
from devplug.testing._process import signal_child
from tests.metrics.probing import events, wait_for_event
from tests.support import Widgets, logged_process, serving, settings_for

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[2]
RESOURCE = "example.com/fake"
CANARY = "s3cr3t-canary-7f1c2e9a"


# -- helpers -------------------------------------------------------------------------------------


@asynccontextmanager
async def devplug_fake(
    log: Path, *args: str, umask: int = -1, env: dict[str, str] | None = None
) -> AsyncIterator[Process]:
    """devplug-fake with a JSON log; SIGTERM at the end, which must end it with status 0."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("DEVPLUG_")}
    environment = base | {"PYTHONPATH": str(ROOT)} | (env or {})
    async with logged_process("devplug_fake", args, log, env=environment, umask=umask) as process:
        yield process


def listening(pid: int) -> set[str]:
    """``proto host:port`` of every TCP socket ``pid`` listens on and every UDP socket it has."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(int(link[8:-1]))
    found = set()
    for proto in ("tcp", "tcp6", "udp", "udp6"):
        for line in Path(f"/proc/{pid}/net/{proto}").read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], int(fields[9])
            if inode in inodes and (state == "0A" or proto.startswith("udp")):
                found.add(f"{proto} {_address(local)}")
    return found


def _address(local: str) -> str:
    host, port = local.split(":")
    if len(host) == 8:  # IPv4, little-endian
        return f"{socket.inet_ntoa(bytes.fromhex(host)[::-1])}:{int(port, 16)}"
    words = [bytes.fromhex(host[i : i + 8])[::-1] for i in range(0, 32, 8)]
    return f"[{socket.inet_ntop(socket.AF_INET6, b''.join(words))}]:{int(port, 16)}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def listener(path: Path) -> Iterator[socket.socket]:
    """A live unix socket at ``path`` that nobody accepts on: a connection would wait in its queue."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(path))
        s.listen(8)
        s.setblocking(False)
        yield s


def never_connected(s: socket.socket) -> bool:
    try:
        conn, _ = s.accept()
    except BlockingIOError:
        return True
    conn.close()
    return False


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


# -- socket permissions ----------------------------------------------------------------------------


class _Options(pb_grpc.DevicePluginServicer):  # type: ignore[misc]
    async def GetDevicePluginOptions(self, request: pb.Empty, context: object) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions()


async def test_socket_is_private_from_the_moment_it_is_bound(short_dir: Path) -> None:
    """No window between bind and chmod: a connection made then would be kept after the chmod."""
    path = short_dir / unique_socket_name(RESOURCE)
    at_bind: list[int] = []

    def add_services(server: grpc.aio.Server) -> None:
        pb_grpc.add_DevicePluginServicer_to_server(_Options(), server)
        bind = server.add_insecure_port

        def spy(address: str) -> int:
            port = bind(address)
            at_bind.append(mode(path))
            return port

        server.add_insecure_port = spy  # type: ignore[method-assign]

    umask = os.umask(0)
    try:
        server = SocketServer(path, add_services)
        await server.start()
    finally:
        os.umask(umask)
    try:
        assert at_bind == [0o600]
        assert mode(path) == 0o600
        assert os.umask(umask) == umask  # restored
    finally:
        await server.stop(0)
    assert not path.exists()


async def test_sockets_and_directories_under_umask_0(short_dir: Path) -> None:
    """A process started with umask 0, before the kubelet: private sockets, no directory made
    (none left open by the umask), and nothing listening on the network without
    --metrics-address."""
    dp = short_dir / "kubelet" / "dp"
    log = short_dir / "plugin.log"
    async with devplug_fake(log, "--device-plugin-dir", str(dp), umask=0) as process:
        await wait_for_event(log, "kubelet_directory_missing")
        # The kubelet's directories are the kubelet's: the plugin waits, making nothing.
        assert sorted(p.name for p in short_dir.iterdir()) == ["plugin.log"]
        async with FakeKubelet(dp) as kubelet:
            first = await kubelet.wait_for_registration(RESOURCE, timeout=10)
            assert mode(dp / first.endpoint) == 0o600
            await kubelet.restart()
            second = await kubelet.wait_for_registration(RESOURCE, count=2, timeout=10)
            assert mode(dp / second.endpoint) == 0o600
            assert listening(process.pid) == set()


# -- what the plugin removes, and symlinks -----------------------------------------------------------


async def test_foreign_files_survive_and_symlinks_are_not_followed(short_dir: Path) -> None:
    dp, outside = short_dir / "dp", short_dir / "outside"
    dp.mkdir(mode=0o755)
    outside.mkdir()
    target = outside / "target.txt"
    target.write_text("keep")
    target.chmod(0o644)
    (outside / "sub").mkdir()
    # Named like sockets, like the plugin's own, like the kubelet's checkpoint.
    links = {
        "example.com-fake-00000000.sock": target,
        "example.com-fake-00000001.sock": outside / "live.sock",
        "example.com-fake-00000002.sock": outside / "sub",
        "gone.sock": outside / "missing",
    }
    for name, to in links.items():
        (dp / name).symlink_to(to)
    (dp / "notes.sock").write_text("a regular file")
    (dp / "kubelet_internal_checkpoint").write_text("{}")
    kept = {
        name: os.lstat(dp / name).st_ino for name in [*links, "notes.sock", "kubelet_internal_checkpoint"]
    }

    def unharmed() -> None:
        for name, inode in kept.items():
            assert os.lstat(dp / name).st_ino == inode, name
        for name, to in links.items():
            assert os.readlink(dp / name) == str(to)
        assert target.read_text() == "keep" and mode(target) == 0o644
        assert never_connected(outside_live), "a symlink was followed to a socket"

    log = short_dir / "plugin.log"
    with listener(outside / "live.sock") as outside_live:
        async with FakeKubelet(dp) as kubelet:

            def accepted() -> int:
                return sum(r.accepted for r in kubelet.registrations)

            for crash in (None, False, True):
                if crash is not None:
                    await kubelet.restart(crash=crash)
                # Another program's live socket: a restarting kubelet deletes it, the plugin never.
                with listener(dp / "other-vendor.sock") as other:
                    async with devplug_fake(log, "--device-plugin-dir", str(dp)) as process:
                        reg = await kubelet.wait_for_registration(RESOURCE, count=accepted() + 1, timeout=10)
                        (dp / reg.endpoint).unlink()  # its own socket deleted: it makes a new one
                        await kubelet.wait_for_registration(RESOURCE, count=accepted() + 1)
                        signal_child(process, signal.SIGHUP)
                        await wait_for_event(log, "reloaded")
                        unharmed()
                    # SIGTERM: its own socket removed, nothing else.
                    unharmed()
                    assert never_connected(other)
                    assert {p.name for p in dp.iterdir()} == {*kept, "kubelet.sock", "other-vendor.sock"}
                    (dp / "other-vendor.sock").unlink()


async def test_a_symlink_at_the_chosen_name_is_not_used(
    short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A name collision with a symlink: refused, left alone, and a new name tried."""
    outside = short_dir / "outside"
    outside.mkdir()
    dp = short_dir / "device-plugins"
    dp.mkdir()
    (dp / "example.com-widget-taken.sock").symlink_to(outside / "live.sock")
    names = iter(["example.com-widget-taken.sock"])
    monkeypatch.setattr(
        resource_module, "unique_socket_name", lambda r: next(names, None) or unique_socket_name(r)
    )
    with listener(outside / "live.sock") as live, capture_logs() as logs:
        async with FakeKubelet(dp) as kubelet, serving(Widgets(), settings_for(short_dir)):
            reg = await kubelet.wait_for_registration("example.com/widget", timeout=5)
        assert reg.endpoint != "example.com-widget-taken.sock"
        assert (dp / "example.com-widget-taken.sock").is_symlink()
        assert never_connected(live)
    failed = [e for e in logs if e["event"] == "serve_failed"]
    assert failed and "symlink" in failed[0]["error"]


# -- world-writable directories ---------------------------------------------------------------------


def _tree(root: Path, modes: dict[str, int]) -> None:
    for name, perm in modes.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        os.chmod(root / name, perm)


@pytest.mark.parametrize(
    ("modes", "problem"),
    [
        ({"a": 0o755, "a/dp": 0o755}, None),
        ({"a": 0o755, "a/dp": 0o775}, None),  # group-writable: the admin's choice
        ({"a": 0o755, "a/dp": 0o777}, "a/dp is writable by every user (mode 0777)"),
        ({"a": 0o755, "a/dp": 0o1777}, "a/dp is writable by every user (mode 1777)"),
        ({"a": 0o777, "a/dp": 0o755}, "a, above"),
        ({"a": 0o1777, "a/dp": 0o755}, None),  # like /tmp: others cannot rename what is not theirs
    ],
)
def test_directory_exposure(tmp_path: Path, modes: dict[str, int], problem: str | None) -> None:
    _tree(tmp_path, modes)
    try:
        found = directory_exposure(tmp_path / "a" / "dp")
        assert (found is None) if problem is None else (found is not None and problem in found), found
    finally:
        _tree(tmp_path, {"a": 0o755, "a/dp": 0o755})


def test_directory_exposure_follows_the_directory_link(tmp_path: Path) -> None:
    _tree(tmp_path, {"real": 0o777})
    (tmp_path / "link").symlink_to(tmp_path / "real")
    found = directory_exposure(tmp_path / "link")
    assert (
        found
        == f"{tmp_path / 'link'} (resolving to {tmp_path / 'real'}) is writable by every user (mode 0777)"
    )


@pytest.mark.parametrize("registration", ["kubelet", "watcher"])
async def test_refuses_a_world_writable_directory(short_dir: Path, registration: str) -> None:
    settings = settings_for(short_dir, registration=registration)
    watched = settings.device_plugin_dir if registration == "kubelet" else settings.plugins_registry_dir
    _tree(short_dir, {watched.name: 0o777})
    with pytest.raises(ConfigError, match=f"refusing to start: {watched} is writable by every user"):
        await Runner(Widgets(), settings).run(handle_signals=False)
    assert list(watched.iterdir()) == []  # nothing served, nothing created


async def test_warns_about_a_world_writable_directory(short_dir: Path) -> None:
    settings = settings_for(short_dir, insecure_dir="warn")
    _tree(short_dir, {"device-plugins": 0o777})
    with capture_logs() as logs:
        async with FakeKubelet(settings.device_plugin_dir) as kubelet, serving(Widgets(), settings):
            await kubelet.wait_for_devices("example.com/widget")
    warnings = [e for e in logs if e["event"] == "insecure_directory"]
    assert len(warnings) == 1 and warnings[0]["log_level"] == "warning"
    assert "device-plugins is writable by every user" in warnings[0]["problem"]


# -- the metrics port and the log ---------------------------------------------------------------------


async def test_metrics_bind_only_where_told_and_no_secret_is_logged(short_dir: Path) -> None:
    pytest.importorskip("prometheus_client", reason="the metrics extra")
    from tests.metrics.probing import get

    dp, log, port = short_dir / "dp", short_dir / "plugin.log", free_port()
    secrets = {
        "AWS_SECRET_ACCESS_KEY": CANARY,
        "DEVPLUG_API_TOKEN": CANARY + "-devplug",  # the settings' prefix, but no setting
        "KUBECONFIG_PASSWORD": CANARY + "-kube",
    }
    args = ("--device-plugin-dir", str(dp), "--metrics-address", f"127.0.0.1:{port}", "--log-level", "debug")
    async with FakeKubelet(dp) as kubelet, devplug_fake(log, *args, env=secrets) as process:
        await kubelet.wait_for_registration(RESOURCE, timeout=10)
        await kubelet.wait_for_devices(RESOURCE)
        assert listening(process.pid) == {f"tcp 127.0.0.1:{port}"}
        await kubelet.allocate(RESOURCE, ["fake-1"])
        for path in ("/debug/state", "/metrics", "/readyz"):
            _, _, body = await get(port, path)
            assert CANARY not in body.decode(), path
        signal_child(process, signal.SIGUSR1)  # the state dump
        await wait_for_event(log, "debug_state")
        signal_child(process, signal.SIGHUP)  # a reload re-reads the settings
        await wait_for_event(log, "reloaded")
        await kubelet.restart()
        await kubelet.wait_for_registration(RESOURCE, count=2, timeout=10)
    text = log.read_text()
    logged = events(log)
    assert {"debug_state", "reloaded", "registered"} <= {e["event"] for e in logged}
    assert any(e["level"] == "debug" for e in logged)
    assert CANARY not in text
