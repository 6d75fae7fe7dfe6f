"""A real Kubernetes node on this machine, in one run directory of its own.

``e2e/node build`` builds etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet,
kubectl and containerd 2 (with its runc shim and ``ctr``) from their Go modules into a cache keyed
by version (``~/.cache/devplug-e2e``); runc, the CNI plugins and busybox come from Debian's
packages. ``e2e/node up`` starts them under one run directory (own ports, own kubelet root, own
containerd socket, root, state and CDI directory), imports a pause and a busybox image made here
(no registry), waits for the node to be Ready and prints one ``export …`` line. ``e2e/node down``
stops exactly what ``up`` started and cleans up after it.

Standard library only: it runs before devplug is installed. Every failure is one line naming the
component and its log, with a non-zero exit status; ``up`` cleans up after itself when it fails.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, NoReturn

PROG = "e2e/node"
DEFAULT_K8S = os.environ.get("DEVPLUG_E2E_K8S") or "v1.37.2"  # the release CI uses
CONTAINERD = "v2.4.2"
PAUSE_IMAGE = "docker.io/local/pause:1"
BUSYBOX_IMAGE = "docker.io/local/busybox:1"
EXAMPLE_BUSYBOX = "docker.io/library/busybox:1.36"
CACHE = Path(os.environ.get("DEVPLUG_E2E_CACHE") or Path.home() / ".cache" / "devplug-e2e")
DEFAULT_RUN = Path(os.environ.get("DEVPLUG_E2E_RUN") or "/tmp/devplug-e2e-node")  # noqa: S108 (the node's own)


def _default_node_name() -> str:
    """The machine's host name where it resolves to loopback (real-node.md: `vm` here), else devplug-e2e.

    The kubelet refuses a loopback --node-ip and then reports no addresses at all, so the API
    server reaches the kubelet (kubectl logs, exec) through the node's Hostname address, which is
    its name: a name that resolves to 127.0.0.1 keeps that traffic on loopback.
    """
    host = socket.gethostname()
    with contextlib.suppress(OSError):
        addresses = {str(info[4][0]) for info in socket.getaddrinfo(host, None)}
        if re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", host) and all(
            a.startswith("127.") or a == "::1" for a in addresses
        ):
            return host
    return "devplug-e2e"


DEFAULT_NODE_NAME = _default_node_name()
# What the kubelet changes on start (its container manager) and `down` puts back.
SYSCTLS = (
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
)
DEBIAN = {  # path needed -> Debian package that has it
    "/usr/sbin/runc": "runc",
    "/usr/lib/cni/loopback": "containernetworking-plugins",
    "/usr/lib/cni/bridge": "containernetworking-plugins",
    "/usr/lib/cni/host-local": "containernetworking-plugins",
    "/bin/busybox": "busybox-static",
}
K8S_COMMANDS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl")
CONTAINERD_COMMANDS = ("containerd", "containerd-shim-runc-v2", "ctr")
ORDER = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "containerd", "kubelet")


class Failure(Exception):
    """One line for the user: what failed and where its log is."""


def fail(message: str, code: int = 1) -> NoReturn:
    print(f"{PROG}: {message}", file=sys.stderr)
    raise SystemExit(code)


def say(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# build


def _check_version(version: str) -> str:
    if not re.fullmatch(r"v1\.\d+\.\d+", version):
        fail(f"--k8s {version!r}: expected a Kubernetes release such as {DEFAULT_K8S}", 2)
    return version


def k8s_dir(version: str) -> Path:
    return CACHE / f"kubernetes-{version}"


def containerd_dir() -> Path:
    return CACHE / f"containerd-{CONTAINERD}"


def etcd_dir(version: str) -> Path:
    return CACHE / f"etcd-{version}"


def images_dir() -> Path:
    return CACHE / "images-1"


def _go(args: list[str], cwd: Path, log: Path, env: dict[str, str] | None = None) -> None:
    full = dict(os.environ, GOFLAGS="-mod=mod", GOTOOLCHAIN="local", **(env or {}))
    with log.open("ab") as out:
        out.write(f"\n$ go {' '.join(args)}\n".encode())
        out.flush()
        rc = subprocess.call(["go", *args], cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=full)
    if rc != 0:
        raise Failure(f"go {args[0]} failed (status {rc})")


def _go_module(src: Path, name: str, require: str, extra: str = "") -> None:
    """The go.mod of our own build module for `name`: it requires `require` (module version)."""
    src.mkdir(parents=True, exist_ok=True)
    (src / "go.mod").write_text(f"module devplug.local/e2e/{name}\n\ngo 1.26.0\n\nrequire {require}\n{extra}")


def _module_file(module: str, version: str, log: Path, cwd: Path) -> str:
    """The go.mod of module@version, from the module proxy through `go mod download`."""
    full = dict(os.environ, GOTOOLCHAIN="local", GOFLAGS="-mod=mod")
    res = subprocess.run(
        ["go", "mod", "download", "-json", f"{module}@{version}"],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=full,
        check=False,
    )
    with log.open("a") as out:
        out.write(res.stdout + res.stderr)
    if res.returncode != 0:
        raise Failure(f"cannot download {module}@{version}")
    return Path(json.loads(res.stdout)["GoMod"]).read_text()


def _staging_modules(gomod: str) -> list[str]:
    return re.findall(r"^\s+(k8s\.io/[\w.-]+)\s+=>\s+\./staging/", gomod, flags=re.MULTILINE)


def _required(gomod: str, module: str) -> str | None:
    found = re.search(rf"^\s+{re.escape(module)}\s+(v\S+)", gomod, flags=re.MULTILINE)
    return found.group(1) if found else None


def _build_step(name: str, out_dir: Path, commands: tuple[str, ...], log: Path, work: Any) -> bool:
    """Build `commands` into out_dir/bin unless all are there; True when something was built."""
    bin_dir = out_dir / "bin"
    if all((bin_dir / c).is_file() for c in commands):
        return False
    say(f"building {name} (log: {log})")
    started = time.monotonic()
    tmp = out_dir / "bin.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        work(tmp)
    except Failure as exc:
        raise Failure(f"{name}: {exc}; log: {log}") from None
    missing = [c for c in commands if not (tmp / c).is_file()]
    if missing:
        raise Failure(f"{name}: the build made no {', '.join(missing)}; log: {log}")
    shutil.rmtree(bin_dir, ignore_errors=True)
    tmp.rename(bin_dir)
    say(f"built {name} in {time.monotonic() - started:.0f} s")
    return True


def build(version: str) -> None:
    CACHE.mkdir(parents=True, exist_ok=True)
    logs = CACHE / "logs"
    logs.mkdir(exist_ok=True)
    built = _debian_packages()
    kdir = k8s_dir(version)
    src = kdir / "src"
    src.mkdir(parents=True, exist_ok=True)
    klog = logs / f"build-kubernetes-{version}.log"
    gomod = _module_file("k8s.io/kubernetes", version, klog, src)
    staging_version = "v0." + version[len("v1.") :]
    minor = version.split(".")[1]

    def k8s(tmp: Path) -> None:
        # every k8s.io staging module at the release's v0 version (its go.mod points them at ./staging)
        replaces = "".join(f"\t{m} => {m} {staging_version}\n" for m in _staging_modules(gomod))
        _go_module(src, "kubernetes", f"k8s.io/kubernetes {version}", f"\nreplace (\n{replaces})\n")
        ldflags = " ".join(
            f"-X k8s.io/component-base/version.{k}={v}"
            for k, v in (
                ("gitVersion", version),
                ("gitMajor", "1"),
                ("gitMinor", minor),
                ("gitTreeState", "clean"),
            )
        )
        _go(
            [
                "build",
                "-tags",
                "providerless",
                "-trimpath",
                "-ldflags",
                ldflags,
                "-o",
                str(tmp) + "/",
                *(f"k8s.io/kubernetes/cmd/{c}" for c in K8S_COMMANDS),
            ],
            src,
            klog,
            {"CGO_ENABLED": "1"},
        )

    built |= _build_step(f"kubernetes {version}", kdir, K8S_COMMANDS, klog, k8s)

    etcd_version = _required(gomod, "go.etcd.io/etcd/server/v3") or _required(
        gomod, "go.etcd.io/etcd/client/v3"
    )
    if etcd_version is None:
        raise Failure(f"kubernetes {version}: its go.mod names no etcd version; log: {klog}")
    edir = etcd_dir(etcd_version)
    elog = logs / f"build-etcd-{etcd_version}.log"

    def etcd(tmp: Path) -> None:
        _go_module(edir / "src", "etcd", f"go.etcd.io/etcd/server/v3 {etcd_version}")
        _go(
            ["build", "-trimpath", "-o", str(tmp / "etcd"), "go.etcd.io/etcd/server/v3"],
            edir / "src",
            elog,
            {"CGO_ENABLED": "0"},
        )

    built |= _build_step(f"etcd {etcd_version}", edir, ("etcd",), elog, etcd)

    cdir = containerd_dir()
    clog = logs / f"build-containerd-{CONTAINERD}.log"

    def containerd(tmp: Path) -> None:
        _go_module(cdir / "src", "containerd", f"github.com/containerd/containerd/v2 {CONTAINERD}")
        ldflags = f"-X github.com/containerd/containerd/v2/version.Version={CONTAINERD}"
        _go(
            [
                "build",
                "-tags",
                "no_btrfs",
                "-trimpath",
                "-ldflags",
                ldflags,
                "-o",
                str(tmp) + "/",
                *(f"github.com/containerd/containerd/v2/cmd/{c}" for c in CONTAINERD_COMMANDS),
            ],
            cdir / "src",
            clog,
            {"CGO_ENABLED": "0"},
        )

    built |= _build_step(f"containerd {CONTAINERD}", cdir, CONTAINERD_COMMANDS, clog, containerd)
    built |= _images(logs / "build-images.log")

    assets = kdir / "assets"  # KUBEBUILDER_ASSETS, as envtest looks for it
    assets.mkdir(exist_ok=True)
    for name, target in (
        ("kube-apiserver", kdir / "bin" / "kube-apiserver"),
        ("kubectl", kdir / "bin" / "kubectl"),
        ("etcd", edir / "bin" / "etcd"),
    ):
        link = assets / name
        if not link.is_symlink() or os.readlink(link) != str(target):
            link.unlink(missing_ok=True)
            link.symlink_to(target)
    (kdir / "etcd-version").write_text(etcd_version + "\n")
    if built:
        say(f"kubernetes {version}, etcd {etcd_version}, containerd {CONTAINERD} built in {CACHE}")
    else:
        say(
            f"kubernetes {version}, etcd {etcd_version}, containerd {CONTAINERD} already built in {CACHE}; "
            "nothing to build"
        )


def _debian_packages(needed: dict[str, str] = DEBIAN) -> bool:
    missing = sorted({pkg for path, pkg in needed.items() if not Path(path).exists()})
    if not missing:
        return False
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise Failure(
            f"Debian packages missing: {' '.join(missing)} (install them as root: "
            f"apt-get install {' '.join(missing)})"
        )
    log = CACHE / "logs" / "apt.log"
    say(f"installing Debian packages {' '.join(missing)} (log: {log})")
    with log.open("ab") as out:
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        rc = subprocess.call(["apt-get", "install", "-y", "-q", *missing], stdout=out, stderr=out, env=env)
        if rc != 0:
            subprocess.call(["apt-get", "update", "-q"], stdout=out, stderr=out, env=env)
            rc = subprocess.call(
                ["apt-get", "install", "-y", "-q", *missing], stdout=out, stderr=out, env=env
            )
    if rc != 0:
        raise Failure(f"apt-get install {' '.join(missing)} failed; log: {log}")
    return True


PAUSE_C = r"""
#include <signal.h>
#include <unistd.h>
#include <sys/wait.h>
static void stop(int sig) { (void)sig; _exit(0); }
static void reap(int sig) { (void)sig; while (waitpid(-1, 0, WNOHANG) > 0) {} }
int main(void) {
    signal(SIGTERM, stop);
    signal(SIGINT, stop);
    signal(SIGCHLD, reap);
    for (;;) pause();
}
"""


def _layer(files: dict[str, tuple[bytes | None, int, str | None]]) -> bytes:
    """A one-layer tar: path -> (content or None for a directory, mode, symlink target)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(files):
            content, mode, link = files[path]
            info = tarfile.TarInfo(path)
            info.mode = mode
            info.mtime = 0
            if link is not None:
                info.type = tarfile.SYMTYPE
                info.linkname = link
                tar.addfile(info)
            elif content is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
    return buf.getvalue()


def _image_archive(ref: str, layer: bytes, entrypoint: list[str], cmd: list[str], dest: Path) -> None:
    """A docker-archive tar (what `ctr images import` reads) with one layer."""
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = json.dumps(
        {
            "architecture": {"x86_64": "amd64", "aarch64": "arm64"}.get(
                os.uname().machine, os.uname().machine
            ),
            "os": "linux",
            "config": {"Entrypoint": entrypoint, "Cmd": cmd, "Env": ["PATH=/bin"], "WorkingDir": "/"},
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        },
        sort_keys=True,
    ).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [ref], "Layers": ["layer.tar"]}]).encode()
    tmp = dest.with_suffix(".partial")
    with tarfile.open(tmp, "w") as tar:
        for name, data in (("layer.tar", layer), (config_name, config), ("manifest.json", manifest)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    tmp.rename(dest)


def _images(log: Path) -> bool:
    out = images_dir()
    pause_tar, busybox_tar = out / "pause.tar", out / "busybox.tar"
    if pause_tar.is_file() and busybox_tar.is_file():
        return False
    out.mkdir(parents=True, exist_ok=True)
    dirs = {d: (None, 0o755, None) for d in ("bin", "dev", "etc", "proc", "sys", "tmp", "var", "run")}
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "pause.c"
        src.write_text(PAUSE_C)
        with log.open("ab") as logf:
            rc = subprocess.call(
                ["gcc", "-static", "-Os", "-o", str(Path(tmp) / "pause"), str(src)], stdout=logf, stderr=logf
            )
        if rc != 0:
            raise Failure(f"images: gcc -static failed for the pause image; log: {log}")
        pause = (Path(tmp) / "pause").read_bytes()
    _image_archive(PAUSE_IMAGE, _layer({**dirs, "pause": (pause, 0o755, None)}), ["/pause"], [], pause_tar)
    busybox = Path("/bin/busybox").read_bytes()
    applets = subprocess.run(
        ["/bin/busybox", "--list"], capture_output=True, text=True, check=True
    ).stdout.split()
    files: dict[str, tuple[bytes | None, int, str | None]] = {**dirs, "bin/busybox": (busybox, 0o755, None)}
    files.update({f"bin/{a}": (None, 0o777, "busybox") for a in applets if a != "busybox"})
    files["etc/passwd"] = (
        b"root:x:0:0:root:/:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n",
        0o644,
        None,
    )
    files["etc/group"] = (b"root:x:0:\nnogroup:x:65534:\n", 0o644, None)
    _image_archive(BUSYBOX_IMAGE, _layer(files), [], ["/bin/sh"], busybox_tar)
    say(f"made the pause and busybox images in {out}")
    return True


# --------------------------------------------------------------------------------------------
# image: the project's own image (its Dockerfile), built without a registry or a Docker engine

ROOT = Path(__file__).resolve().parents[1]
IMAGE_DEBIAN = {"/usr/bin/buildah": "buildah", "/usr/bin/mmdebstrap": "mmdebstrap"}
BASE_SUITE = "bookworm"  # its python3 is 3.11, as the Dockerfile's default base image
BASE_IMAGE = f"localhost/devplug-e2e-python:{BASE_SUITE}"
IMAGE_SOURCES = (
    "Dockerfile",
    ".dockerignore",
    "pyproject.toml",
    "README.md",
    "devplug",
    "devplug_fake",
    "devplug_nvidia",
)


def _buildah(args: list[str], log: Path, check: bool = True) -> str:
    store = CACHE / "buildah"
    argv = [
        "buildah",
        "--root",
        str(store / "root"),
        "--runroot",
        str(store / "run"),
        "--storage-driver",
        "vfs",
        *args,
    ]
    with log.open("ab") as out:
        out.write(f"\n$ {' '.join(argv)}\n".encode())
        out.flush()
        res = subprocess.run(argv, stdout=subprocess.PIPE, stderr=out, text=True, check=False)
        out.write(res.stdout.encode())
    if check and res.returncode != 0:
        raise Failure(f"image: buildah {args[0]} failed; log: {log}")
    return res.stdout.strip()


def _base_image(log: Path) -> None:
    """FROM for the Dockerfile: Debian's python3 with a venv as /usr/local (pip, no wheel), as the
    python:3.11-slim image has it, made by mmdebstrap and committed to buildah's own storage."""
    if _buildah(["images", "--quiet", BASE_IMAGE], log, check=False):
        return
    tar = images_dir() / f"debian-python-{BASE_SUITE}.tar"
    if not tar.is_file():
        say(f"making the base image's root file system (Debian {BASE_SUITE}, python3; log: {log})")
        partial = tar.with_suffix(".partial")
        partial.unlink(missing_ok=True)  # what an interrupted run left
        excludes = [
            f"--dpkgopt=path-exclude={x}"
            for x in ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/locale/*", "/usr/share/info/*")
        ]
        argv = [
            "mmdebstrap", "--variant=minbase", "--format=tar",
            "--include=python3,python3-venv,ca-certificates", *excludes,
            "--customize-hook=chroot \"$1\" python3 -m venv /usr/local",
            "--customize-hook=rm -rf \"$1\"/var/cache/apt/* \"$1\"/var/lib/apt/lists/*",
            BASE_SUITE, str(partial),
        ]  # fmt: skip
        with log.open("ab") as out:
            out.write(f"\n$ {' '.join(argv)}\n".encode())
            out.flush()
            if subprocess.call(argv, stdout=out, stderr=out) != 0:
                partial.unlink(missing_ok=True)
                raise Failure(f"image: mmdebstrap {BASE_SUITE} failed; log: {log}")
        partial.rename(tar)
    work = _buildah(["from", "scratch"], log)
    try:
        _buildah(["add", work, str(tar), "/"], log)
        _buildah(
            ["config", "--env", "PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin", work],
            log,
        )
        _buildah(["commit", "--quiet", work, BASE_IMAGE], log)
    finally:
        _buildah(["rm", work], log, check=False)


def _project_version() -> str:
    found = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), flags=re.MULTILINE)
    if not found:
        raise Failure(f"image: no version in {ROOT / 'pyproject.toml'}")
    return found.group(1)


def _sources_digest() -> str:
    """What the Dockerfile copies, hashed: the image is built again only when that changed."""
    digest = hashlib.sha256()
    for name in IMAGE_SOURCES:
        top = ROOT / name
        paths = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file())
        for path in paths:
            if "__pycache__" in path.parts or path.suffix == ".pyc":
                continue
            digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def build_image() -> tuple[Path, str]:
    """devplug:VERSION from the project's Dockerfile as a docker-archive tar in the cache (built
    only when the sources changed) and the name it carries."""
    _debian_packages(IMAGE_DEBIAN)
    version = _project_version()
    name = f"docker.io/library/devplug:{version}"
    out = images_dir() / f"devplug-{version}-{_sources_digest()}.tar"
    if out.is_file():
        say(f"image devplug:{version} already built ({out.name}); nothing to build")
        return out, name
    images_dir().mkdir(parents=True, exist_ok=True)
    log = CACHE / "logs" / "build-image.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    started = time.monotonic()
    _base_image(log)
    say(f"building image devplug:{version} from {ROOT / 'Dockerfile'} with buildah (log: {log})")
    trust = []  # the machine's CA certificates and pip settings, for a network behind a TLS proxy
    for path in ("/etc/ssl/certs", "/etc/pip.conf"):
        if Path(path).exists():
            trust += ["--volume", f"{path}:{path}:ro"]
    tag = f"localhost/devplug-e2e-build:{out.stem}"
    _buildah(
        ["bud", "--isolation", "chroot", "--layers=false", "--pull=never", *trust,
         "--build-arg", f"PYTHON_IMAGE={BASE_IMAGE}", "--tag", tag,
         "--file", str(ROOT / "Dockerfile"), str(ROOT)],
        log,
    )  # fmt: skip
    try:
        partial = out.with_suffix(".partial")
        partial.unlink(missing_ok=True)
        _buildah(["push", "--quiet", tag, f"docker-archive:{partial}:{name}"], log)
        partial.rename(out)
    finally:
        _buildah(["rmi", tag], log, check=False)
    for old in images_dir().glob("devplug-*.tar"):
        if old != out:
            old.unlink()
    say(f"image devplug:{version} built in {time.monotonic() - started:.0f} s: {out}")
    return out, name


def image(run: Path) -> None:
    """Build the project's image (cached) and import it into the node's containerd when one is up."""
    tar, name = build_image()
    node = Node(run)
    if not node.state.get("net") or "containerd" not in node.live():
        say(f"no node up in {node.run}: the image is in {tar}")
        return
    ctr = [
        str(containerd_dir() / "bin" / "ctr"),
        "--address",
        str(node.containerd_socket),
        "--namespace",
        "k8s.io",
    ]
    log = node.logs / "images.log"
    with log.open("ab") as out:
        rc = subprocess.call([*ctr, "images", "import", str(tar)], stdout=out, stderr=out)
    if rc != 0:
        raise Failure(f"containerd: importing {tar.name} failed; log: {log}")
    say(f"{name.removeprefix('docker.io/library/')} imported into the node in {node.run}")


# --------------------------------------------------------------------------------------------
# up


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _start_time(pid: int) -> str | None:
    """The process's start time (field 22 of /proc/PID/stat): a PID reused since is not ours.
    None for a process that is gone, or a zombie (it ended; its parent has not reaped it yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return None if fields[0] in ("Z", "X") else fields[19]


def alive(entry: dict[str, Any]) -> bool:
    """The process `up` recorded in `entry` still runs (not a later process with its PID)."""
    return bool(_start_time(entry["pid"]) == entry["start"])


class Node:
    """The run directory of one node and what is recorded in its state.json."""

    def __init__(self, run: Path) -> None:
        self.run = run.resolve() if run.exists() else run.absolute()
        self.state_file = self.run / "state.json"
        self.logs = self.run / "logs"
        self.state: dict[str, Any] = {}
        if self.state_file.is_file():
            with contextlib.suppress(ValueError, OSError):
                self.state = json.loads(self.state_file.read_text())

    def save(self) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state, indent=1, sort_keys=True))
        tmp.rename(self.state_file)

    @property
    def kubeconfig(self) -> Path:
        return self.run / "kubeconfig"

    @property
    def kubelet_root(self) -> Path:
        return self.run / "kubelet"

    @property
    def cdi_dir(self) -> Path:
        return self.run / "cdi"

    @property
    def api_url(self) -> str:
        """The API server: on the node's bridge address (port 443, where pods reach it as the
        kubernetes Service), or on loopback for a control plane alone."""
        host = self.state.get("net", {}).get("gateway", "127.0.0.1")
        return f"https://{host}:{self.state['ports']['apiserver']}"

    @property
    def containerd_socket(self) -> Path:
        return self.run / "containerd" / "containerd.sock"

    def env_line(self) -> str:
        return (
            f"export KUBECONFIG={self.kubeconfig} KUBELET_ROOT={self.kubelet_root} "
            f"CDI_DIR={self.cdi_dir} NODE_NAME={self.state['node_name']}"
        )

    def processes(self) -> dict[str, dict[str, Any]]:
        procs: dict[str, dict[str, Any]] = self.state.get("processes", {})
        return procs

    def live(self) -> list[str]:
        return [name for name, entry in self.processes().items() if alive(entry)]

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = self.logs / f"{name}.log"
        with log.open("ab") as out:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=dict(os.environ, **(env or {})),
                cwd=self.run,
            )
        self.state.setdefault("processes", {})[name] = {
            "pid": proc.pid,
            "start": _start_time(proc.pid),
            "log": str(log),
            "argv": argv,
            "env": env or {},
        }
        self.save()
        return proc


def _wait(name: str, log: Path, proc: subprocess.Popen[bytes], ready: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise Failure(f"{name} exited with status {proc.returncode} while starting; log: {log}")
        with contextlib.suppress(Exception):
            if ready():
                return
        if time.monotonic() > deadline:
            raise Failure(f"{name} did not become ready within {timeout:.0f} s; log: {log}")
        time.sleep(0.2)


def _https_ok(url: str, token: str | None = None) -> bool:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})  # noqa: S310
    with urllib.request.urlopen(req, context=ctx, timeout=2) as resp:  # noqa: S310 (our own loopback URL)
        return bool(resp.status == 200)


def _api_get(node: Node, path: str) -> Any:
    st = node.state
    ctx = ssl.create_default_context(cafile=str(node.run / "pki" / "ca.crt"))
    req = urllib.request.Request(  # noqa: S310 (our own node's URL)
        f"{node.api_url}{path}",
        headers={"Authorization": f"Bearer {st['token']}"},
    )
    with urllib.request.urlopen(req, context=ctx, timeout=5) as resp:  # noqa: S310 (our own loopback URL)
        return json.loads(resp.read())


def _openssl(args: list[str], log: Path) -> None:
    with log.open("ab") as out:
        rc = subprocess.call(["openssl", *args], stdout=out, stderr=out)
    if rc != 0:
        raise Failure(f"certificates: openssl {args[0]} failed; log: {log}")


def _service_ip(node: Node) -> str:
    """The kubernetes Service's address: the node's bridge address, or 10.0.0.1 without a network."""
    return str(node.state.get("net", {}).get("gateway", "10.0.0.1"))


def _pick_network(run: Path) -> dict[str, str]:
    """A /24 of 10.200-249.x.0 for the node's pods, and a bridge name, both derived from the run
    directory and skipping a /24 any address or route of this machine is in already.

    The bridge's address (.1) is the API server's (port 443) and the first address of the Service
    range (.0/28), so the kubernetes Service's ClusterIP that the kubelet gives pods
    (KUBERNETES_SERVICE_HOST) is the API server itself: no kube-proxy needed. Pods get .16-.254."""
    digest = hashlib.sha256(str(run).encode()).digest()
    seen = (
        subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, check=False).stdout
        + subprocess.run(
            ["ip", "-4", "route", "show", "table", "all"], capture_output=True, text=True, check=False
        ).stdout
    )
    used = set(re.findall(r"\b10\.(\d+)\.(\d+)\.\d+", seen))
    start = int.from_bytes(digest[:2], "big")
    for i in range(50 * 256):
        a, b = 200 + (start + i) // 256 % 50, (start + i) % 256
        if (str(a), str(b)) not in used:
            prefix = f"10.{a}.{b}"
            return {
                "bridge": f"dpe2e{digest.hex()[:8]}",
                "subnet": f"{prefix}.0/24",
                "gateway": f"{prefix}.1",
                "services": f"{prefix}.0/28",
                "pods_from": f"{prefix}.16",
                "pods_to": f"{prefix}.254",
            }
    raise Failure("network: no free 10.200-249.x.0/24 for the node's pods")


def _ip(args: list[str], log: Path) -> int:
    with log.open("ab") as out:
        out.write(f"$ ip {' '.join(args)}\n".encode())
        out.flush()
        return subprocess.call(["ip", *args], stdout=out, stderr=out)


def _bridge_up(node: Node) -> None:
    """The node's bridge with its address, before the API server binds to it."""
    net, log = node.state["net"], node.logs / "network.log"
    _ip(["link", "del", net["bridge"]], log)  # one left by a node that was never taken down
    for args in (
        ["link", "add", net["bridge"], "type", "bridge"],
        ["addr", "add", f"{net['gateway']}/24", "dev", net["bridge"]],
        ["link", "set", net["bridge"], "up"],
    ):
        if _ip(args, log) != 0:
            raise Failure(f"network: ip {' '.join(args)} failed; log: {log}")


def _certificates(node: Node) -> None:
    pki = node.run / "pki"
    pki.mkdir(parents=True, exist_ok=True)
    log = node.logs / "pki.log"
    host = socket.gethostname()
    _openssl(
        [
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "3650",
            "-subj",
            "/CN=devplug-e2e-ca",
            "-keyout",
            str(pki / "ca.key"),
            "-out",
            str(pki / "ca.crt"),
        ],
        log,
    )
    ext = pki / "apiserver.ext"
    ext.write_text(
        f"subjectAltName=IP:127.0.0.1,IP:{_service_ip(node)},DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
        f"DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:{host}\n"
        "extendedKeyUsage=serverAuth\n"
    )
    _openssl(
        [
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=kube-apiserver",
            "-keyout",
            str(pki / "apiserver.key"),
            "-out",
            str(pki / "apiserver.csr"),
        ],
        log,
    )
    _openssl(
        [
            "x509",
            "-req",
            "-in",
            str(pki / "apiserver.csr"),
            "-CA",
            str(pki / "ca.crt"),
            "-CAkey",
            str(pki / "ca.key"),
            "-CAcreateserial",
            "-days",
            "3650",
            "-extfile",
            str(ext),
            "-out",
            str(pki / "apiserver.crt"),
        ],
        log,
    )
    _openssl(["genrsa", "-out", str(pki / "sa.key"), "2048"], log)
    _openssl(["rsa", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub")], log)


def _kubeconfig(node: Node, user: str, token: str, path: Path) -> None:
    ca = base64.b64encode((node.run / "pki" / "ca.crt").read_bytes()).decode()
    server = node.api_url
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "devplug-e2e",
                "clusters": [
                    {"name": "devplug-e2e", "cluster": {"server": server, "certificate-authority-data": ca}}
                ],
                "users": [{"name": user, "user": {"token": token}}],
                "contexts": [{"name": "devplug-e2e", "context": {"cluster": "devplug-e2e", "user": user}}],
            },
            indent=1,
        )
    )
    path.chmod(0o600)


def _read_sysctls() -> dict[str, str]:
    values = {}
    for key in SYSCTLS:
        with contextlib.suppress(OSError):
            values[key] = Path("/proc/sys/" + key.replace(".", "/")).read_text().strip()
    return values


def _containerd_config(node: Node) -> Path:
    c = node.run / "containerd"
    (node.run / "cni" / "net.d").mkdir(parents=True, exist_ok=True)
    net = node.state["net"]
    bridge = {  # isGateway false: the bridge has its address already, and ip_forward stays as it is
        "type": "bridge",
        "bridge": net["bridge"],
        "isGateway": False,
        "ipMasq": False,
        "ipam": {
            "type": "host-local",
            "dataDir": str(node.run / "cni" / "ipam"),
            "ranges": [
                [{"subnet": net["subnet"], "rangeStart": net["pods_from"], "rangeEnd": net["pods_to"]}]
            ],
        },
    }
    (node.run / "cni" / "net.d" / "10-devplug-e2e.conflist").write_text(
        json.dumps({"cniVersion": "0.4.0", "name": "devplug-e2e", "plugins": [bridge]}, indent=1)
    )
    node.cdi_dir.mkdir(parents=True, exist_ok=True)
    cri_runtime = 'plugins."io.containerd.cri.v1.runtime"'
    config = f"""version = 3
root = "{c / "root"}"
state = "{c / "state"}"
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{node.containerd_socket}"

[ttrpc]
  address = "{c / "containerd.sock.ttrpc"}"

[debug]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{c / "opt"}"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{PAUSE_IMAGE}"

[{cri_runtime}]
  enable_cdi = true
  cdi_spec_dirs = ["{node.cdi_dir}"]
  disable_apparmor = true
  restrict_oom_score_adj = true
  [{cri_runtime}.containerd]
    default_runtime_name = "runc"
    [{cri_runtime}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri_runtime}.containerd.runtimes.runc.options]
        BinaryName = "/usr/sbin/runc"
        SystemdCgroup = false
  [{cri_runtime}.cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "{node.run / "cni" / "net.d"}"

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""
    path = c / "config.toml"
    c.mkdir(parents=True, exist_ok=True)
    path.write_text(config)
    return path


def _kubelet_config(node: Node) -> Path:
    p = node.state["ports"]
    cfg = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": node.state["cgroup_root"],
        "failSwapOn": False,
        "containerRuntimeEndpoint": f"unix://{node.containerd_socket}",
        "address": "127.0.0.1",
        "port": p["kubelet"],
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": p["kubelet_healthz"],
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        "podLogsDir": str(node.run / "pod-logs"),
        "volumePluginDir": str(node.run / "volume-plugins"),
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "serializeImagePulls": False,
        "rotateCertificates": False,
        "protectKernelDefaults": False,
        "makeIPTablesUtilChains": False,
        "localStorageCapacityIsolation": True,
        "resolvConf": "/etc/resolv.conf",
        "clusterDomain": "cluster.local",
        "nodeStatusUpdateFrequency": "2s",
        "syncFrequency": "10s",
    }
    path = node.run / "kubelet-config.json"
    path.write_text(json.dumps(cfg, indent=1))
    return path


def _cgroup_dirs(root: str) -> list[Path]:
    base = Path("/sys/fs/cgroup")
    if (base / "cgroup.controllers").exists():  # cgroup v2: one hierarchy
        return [base / root.strip("/")]
    return [
        base / d / root.strip("/")
        for d in sorted(os.listdir(base))
        if (base / d).is_dir() and not (base / d).is_symlink() and (base / d / "cgroup.procs").exists()
    ]


def _mount_namespace(node: Node) -> list[str]:
    """A mount namespace of the node's own for containerd and the kubelet (and so the pods).

    The kubelet's device manager does not follow --root-dir: its socket directory is the constant
    /var/lib/kubelet/device-plugins. In this namespace /var/lib and /var/log are empty tmpfs,
    /var/lib/kubelet is the run directory's kubelet root (KUBELET_ROOT, bind mount) and
    /var/run/cdi its CDI directory (CDI_DIR). So device plugins on the host use
    KUBELET_ROOT/device-plugins; the DaemonSets of deploy/, whose hostPath volumes name the
    standard paths (/var/lib/kubelet/..., /var/run/cdi), reach this node's directories; and the
    kubelet's symlinks under /var/log/containers stay out of the machine's /var/log. The
    namespace is kept in ns/mnt (a bind mount of it); its mounts, the pods' included, go when
    `down` unmounts it. Returns the prefix that runs a command inside it.
    """
    ns = node.run / "ns"
    ns.mkdir()
    log = node.logs / "namespace.log"
    (node.kubelet_root / "device-plugins").mkdir(parents=True)
    Path("/run/cdi").mkdir(mode=0o755, exist_ok=True)  # the standard CDI directory: a mount point here
    setup = (
        "set -e; mount -t tmpfs -o mode=0755 devplug-e2e /var/lib; mkdir -p /var/lib/kubelet; "
        f"mount --bind '{node.kubelet_root}' /var/lib/kubelet; "
        f"mount --bind '{node.cdi_dir}' /run/cdi; "
        "mount -t tmpfs -o mode=0755 devplug-e2e /var/log; "
        # shared inside this namespace only (its mounts were made private from the machine's):
        # volumes with Bidirectional or HostToContainer propagation need it, as on a real node
        "mount --make-rshared /"
    )
    for argv in (
        ["mount", "--bind", str(ns), str(ns)],
        ["mount", "--make-private", str(ns)],
        ["touch", str(ns / "mnt")],
        ["unshare", f"--mount={ns / 'mnt'}", "--propagation", "private", "sh", "-c", setup],
    ):
        with log.open("ab") as out:
            if subprocess.call(argv, stdout=out, stderr=out) != 0:
                raise Failure(f"mount namespace: {' '.join(argv[:2])} failed; log: {log}")
    return ["nsenter", f"--mount={ns / 'mnt'}", "--"]


def _fresh(node: Node, version: str, node_name: str, network: bool = True) -> None:
    """An empty run directory (earlier logs gone) and the new node's state: ports, token, sysctls."""
    if node.run.exists() and any(node.run.iterdir()):
        keep = {"logs"}
        for child in node.run.iterdir():
            if child.name not in keep:
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
    node.run.mkdir(parents=True, exist_ok=True)
    node.logs.mkdir(exist_ok=True)
    for old in node.logs.glob("*.log"):
        old.unlink()
    ports = dict(
        zip(
            (
                "etcd_client",
                "etcd_peer",
                "etcd_metrics",
                "apiserver",
                "controller_manager",
                "scheduler",
                "kubelet",
                "kubelet_healthz",
            ),
            _free_ports(8),
            strict=True,
        )
    )
    token = base64.b32encode(os.urandom(20)).decode().lower()
    node.state = {
        "version": version,
        "node_name": node_name,
        "ports": ports,
        "token": token,
        "cgroup_root": f"/devplug-e2e-{hashlib.sha256(str(node.run).encode()).hexdigest()[:8]}",
        "sysctls": _read_sysctls(),
        "processes": {},
    }
    if network:  # a whole node: pods on a bridge of its own, the API server on it at port 443
        node.state["net"] = _pick_network(node.run)
        node.state["ports"]["apiserver"] = 443
    node.save()


def up(version: str, run: Path, node_name: str) -> None:
    node = Node(run)
    if any(node.run.is_relative_to(p) for p in ("/var/lib", "/var/log")):
        fail(f"--run-dir {run}: not under /var/lib or /var/log (the node's mount namespace hides them)", 2)
    if node.state.get("processes"):
        live = node.live()
        if set(live) == set(ORDER):
            say(f"already up in {node.run}")
            print(node.env_line())
            return
        say(
            f"a previous node in {node.run} is incomplete ({', '.join(live) or 'nothing'} running); "
            "taking it down first"
        )
        down(run, quiet=True)
        node = Node(run)
    build(version)
    _fresh(node, version, node_name)
    try:
        _up(node, version)
    except (Failure, KeyboardInterrupt) as exc:
        for signum in (signal.SIGINT, signal.SIGTERM):  # a second Ctrl-C must not cut the clean-up short
            signal.signal(signum, signal.SIG_IGN)
        down(run, quiet=True)
        if isinstance(exc, KeyboardInterrupt):
            fail("interrupted; what was started is stopped and cleaned up", 130)
        fail(str(exc))
    print(node.env_line(), flush=True)


def _control_plane(node: Node, apiserver_bin: Path, etcd_bin: Path) -> None:
    """Certificates, the admin kubeconfig, etcd and kube-apiserver (ready)."""
    p = node.state["ports"]
    net = node.state.get("net")
    run = node.run
    _certificates(node)
    pki = run / "pki"
    (run / "tokens.csv").write_text(f'{node.state["token"]},admin,admin,"system:masters"\n')
    (run / "tokens.csv").chmod(0o600)
    _kubeconfig(node, "admin", node.state["token"], node.kubeconfig)

    etcd = node.start(
        "etcd",
        [
            str(etcd_bin),
            "--name",
            "devplug-e2e",
            "--data-dir",
            str(run / "etcd"),
            "--listen-client-urls",
            f"http://127.0.0.1:{p['etcd_client']}",
            "--advertise-client-urls",
            f"http://127.0.0.1:{p['etcd_client']}",
            "--listen-peer-urls",
            f"http://127.0.0.1:{p['etcd_peer']}",
            "--initial-advertise-peer-urls",
            f"http://127.0.0.1:{p['etcd_peer']}",
            "--initial-cluster",
            f"devplug-e2e=http://127.0.0.1:{p['etcd_peer']}",
            "--listen-metrics-urls",
            f"http://127.0.0.1:{p['etcd_metrics']}",
            "--unsafe-no-fsync",
            "--log-level",
            "warn",
        ],
    )

    def etcd_ready() -> bool:
        url = f"http://127.0.0.1:{p['etcd_client']}/health"
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(json.loads(resp.read()).get("health") == "true")

    _wait("etcd", node.logs / "etcd.log", etcd, etcd_ready, 60)

    apiserver = node.start(
        "kube-apiserver",
        [
            str(apiserver_bin),
            f"--etcd-servers=http://127.0.0.1:{p['etcd_client']}",
            f"--secure-port={p['apiserver']}",
            f"--bind-address={_service_ip(node)}" if net else "--bind-address=127.0.0.1",
            f"--advertise-address={_service_ip(node)}" if net else "--advertise-address=127.0.0.1",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            f"--token-auth-file={run / 'tokens.csv'}",
            "--authorization-mode=Node,RBAC",
            "--allow-privileged=true",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--service-cluster-ip-range={net['services']}"
            if net
            else "--service-cluster-ip-range=10.0.0.0/24",
            "--kubelet-preferred-address-types=Hostname",
            # No kube-proxy: the kubernetes Service's address is the API server's own (the node's
            # bridge address, first of the Service range), so its Endpoints would add nothing.
            "--endpoint-reconciler-type=none",
            "--enable-priority-and-fairness=false",
            "--profiling=false",
            "--v=1",
        ],
    )
    _wait(
        "kube-apiserver",
        node.logs / "kube-apiserver.log",
        apiserver,
        lambda: _https_ok(f"{node.api_url}/readyz", node.state["token"]),
        120,
    )


def _up(node: Node, version: str) -> None:
    kbin = k8s_dir(version) / "bin"
    etcd_version = (k8s_dir(version) / "etcd-version").read_text().strip()
    cbin = containerd_dir() / "bin"
    p = node.state["ports"]
    run = node.run
    pki = run / "pki"
    started = time.monotonic()
    _bridge_up(node)
    _control_plane(node, kbin / "kube-apiserver", etcd_dir(etcd_version) / "bin" / "etcd")

    kcm = node.start(
        "kube-controller-manager",
        [
            str(kbin / "kube-controller-manager"),
            f"--kubeconfig={node.kubeconfig}",
            f"--authentication-kubeconfig={node.kubeconfig}",
            f"--authorization-kubeconfig={node.kubeconfig}",
            f"--secure-port={p['controller_manager']}",
            "--bind-address=127.0.0.1",
            "--leader-elect=false",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}",
            "--use-service-account-credentials=true",
            "--controllers=*",
            "--profiling=false",
            "--v=1",
        ],
    )
    scheduler = node.start(
        "kube-scheduler",
        [
            str(kbin / "kube-scheduler"),
            f"--kubeconfig={node.kubeconfig}",
            f"--authentication-kubeconfig={node.kubeconfig}",
            f"--authorization-kubeconfig={node.kubeconfig}",
            f"--secure-port={p['scheduler']}",
            "--bind-address=127.0.0.1",
            "--leader-elect=false",
            "--profiling=false",
            "--v=1",
        ],
    )
    config = _containerd_config(node)
    inside = _mount_namespace(node)
    containerd = node.start(
        "containerd",
        [*inside, str(cbin / "containerd"), "--config", str(config)],
        env={"PATH": f"{cbin}:{os.environ.get('PATH', '/usr/bin:/bin')}"},
    )
    _wait(
        "kube-controller-manager",
        node.logs / "kube-controller-manager.log",
        kcm,
        lambda: _https_ok(f"https://127.0.0.1:{p['controller_manager']}/healthz"),
        60,
    )
    _wait(
        "kube-scheduler",
        node.logs / "kube-scheduler.log",
        scheduler,
        lambda: _https_ok(f"https://127.0.0.1:{p['scheduler']}/healthz"),
        60,
    )
    ctr = [str(cbin / "ctr"), "--address", str(node.containerd_socket), "--namespace", "k8s.io"]

    def containerd_ready() -> bool:
        return subprocess.run([*ctr, "version"], capture_output=True, timeout=5, check=False).returncode == 0

    _wait("containerd", node.logs / "containerd.log", containerd, containerd_ready, 60)
    for tar in ("pause.tar", "busybox.tar"):
        with (node.logs / "images.log").open("ab") as out:
            rc = subprocess.call(
                [*ctr, "images", "import", "--no-unpack", str(images_dir() / tar)], stdout=out, stderr=out
            )
        if rc != 0:
            raise Failure(f"containerd: importing {tar} failed; log: {node.logs / 'images.log'}")
    # deploy/'s example pods name busybox:1.36: the local busybox answers to that name too
    with (node.logs / "images.log").open("ab") as out:
        subprocess.call(
            [*ctr, "images", "tag", "--force", BUSYBOX_IMAGE, EXAMPLE_BUSYBOX], stdout=out, stderr=out
        )

    for cg in _cgroup_dirs(node.state["cgroup_root"]):
        cg.mkdir(exist_ok=True)
    kubelet = node.start(
        "kubelet",
        [
            *inside,
            str(kbin / "kubelet"),
            f"--config={_kubelet_config(node)}",
            f"--kubeconfig={node.kubeconfig}",
            # KUBELET_ROOT, at the standard path in the node's mount namespace: the kubelet dials
            # plugins_registry/<driver>-<pod UID>-reg.sock there, which under a long run
            # directory would pass the 107 bytes a unix socket path can have
            "--root-dir=/var/lib/kubelet",
            "--cert-dir=/var/lib/kubelet/pki",
            f"--hostname-override={node.state['node_name']}",
            "--v=2",
        ],
    )

    def node_ready() -> bool:
        obj = _api_get(node, f"/api/v1/nodes/{node.state['node_name']}")
        return any(c["type"] == "Ready" and c["status"] == "True" for c in obj["status"]["conditions"])

    _wait("kubelet", node.logs / "kubelet.log", kubelet, node_ready, 120)

    def default_sa() -> bool:
        return bool(_api_get(node, "/api/v1/namespaces/default/serviceaccounts/default"))

    _wait("kube-controller-manager", node.logs / "kube-controller-manager.log", kcm, default_sa, 60)
    say(f"node {node.state['node_name']} is Ready ({time.monotonic() - started:.1f} s); run directory {run}")


# --------------------------------------------------------------------------------------------
# down


def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (ppid, command line) of every process."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = (
                Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            )
        except OSError:
            continue
        out[int(entry)] = (int(stat[stat.rindex(")") + 2 :].split()[1]), cmdline)
    return out


def _stop(pid: int, start: str | None, timeout: float = 10) -> None:
    if start is None or _start_time(pid) != start:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _start_time(pid) == start:
        time.sleep(0.1)
    if _start_time(pid) == start:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        while _start_time(pid) == start:
            time.sleep(0.05)


def _kill_pod_processes(node: Node) -> int:
    """SIGKILL the runc shims of this node's containerd and every process below them (the containers)."""
    address = str(node.containerd_socket)
    procs = _processes()
    shims = {pid for pid, (_, cmd) in procs.items() if "containerd-shim" in cmd and address in cmd}
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    below: list[int] = []
    todo = list(shims)
    while todo:
        for child in children.get(todo.pop(), []):
            below.append(child)
            todo.append(child)
    for pid in [*below, *shims]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return len(shims)


def _unmount_under(root: Path) -> None:
    prefix = str(root) + "/"
    for _ in range(5):
        mounts = []
        with contextlib.suppress(OSError):
            for line in Path("/proc/self/mountinfo").read_text().splitlines():
                point = line.split()[4].encode().decode("unicode_escape")
                if point.startswith(prefix) or point == str(root):
                    mounts.append(point)
        if not mounts:
            return
        for point in sorted(mounts, key=lambda m: m.count("/"), reverse=True):
            subprocess.call(["umount", "-l", point], stderr=subprocess.DEVNULL)


def _remove_cgroups(root: str) -> None:
    for top in _cgroup_dirs(root):
        if not top.exists():
            continue
        for dirpath, _, _ in sorted(os.walk(top), key=lambda w: w[0].count("/"), reverse=True):
            with contextlib.suppress(OSError):
                os.rmdir(dirpath)


def _undo_host_changes(node: Node) -> None:
    """The kubelet's sysctls back as they were; the node's cgroups and its bridge gone."""
    for key, value in node.state.get("sysctls", {}).items():
        with contextlib.suppress(OSError):
            Path("/proc/sys/" + key.replace(".", "/")).write_text(value)
    if node.state.get("cgroup_root"):
        _remove_cgroups(node.state["cgroup_root"])
    if node.state.get("net"):  # its pods' veths went with their network namespaces
        _ip(["link", "del", node.state["net"]["bridge"]], node.logs / "network.log")


def down(run: Path, quiet: bool = False) -> None:
    node = Node(run)
    if not node.state:
        if not quiet:
            say(f"nothing is up in {node.run}")
        return
    procs = node.processes()
    live = node.live()
    if "kubelet" in procs:
        _stop(procs["kubelet"]["pid"], procs["kubelet"]["start"])
    shims = _kill_pod_processes(node)
    for name in reversed(ORDER):
        if name in procs and name != "kubelet":
            _stop(procs[name]["pid"], procs[name]["start"])
    time.sleep(0.2)
    _kill_pod_processes(node)  # a shim that started while containerd stopped
    _unmount_under(node.run)
    _undo_host_changes(node)
    for child in list(node.run.iterdir()) if node.run.is_dir() else []:
        if child.name == "logs":
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                child.unlink()
    if not quiet:
        what = ", ".join(name for name in ORDER if name in live)
        what = f"stopped {what}" if what else "nothing was running"
        say(
            f"down: {what}"
            + (f", and {shims} pod sandboxes" if shims else "")
            + f"; cleaned {node.run} (logs kept in {node.logs})"
        )


def control_plane(run: Path, assets: Path) -> Node:
    """etcd and kube-apiserver alone, from a directory as envtest finds it (KUBEBUILDER_ASSETS: etcd,
    kube-apiserver and kubectl; `e2e/node build` makes one). `down` stops them. No root needed."""
    for name in ("kube-apiserver", "etcd"):
        if not (assets / name).is_file():
            raise Failure(f"no {name} in {assets} (KUBEBUILDER_ASSETS; e2e/node build makes one)")
    node = Node(run)
    if node.state.get("processes"):
        down(run, quiet=True)
        node = Node(run)
    _fresh(node, "assets", "none", network=False)
    try:
        _control_plane(node, assets / "kube-apiserver", assets / "etcd")
    except BaseException:
        down(run, quiet=True)
        raise
    return node


def restart(run: Path, name: str, how: signal.Signals = signal.SIGTERM, pause: float = 0.0) -> None:
    """Stop one component of a running node with `how` and start it again as `up` did."""
    node = Node(run)
    entry = node.processes().get(name)
    if entry is None or not alive(entry):
        raise Failure(f"{name} is not running in {node.run}")
    pid = entry["pid"]
    os.kill(pid, how)
    deadline = time.monotonic() + 30
    while _start_time(pid) == entry["start"]:
        if time.monotonic() > deadline:
            raise Failure(f"{name} did not stop on {how.name} within 30 s; log: {entry['log']}")
        time.sleep(0.05)
    if name == "kubelet":  # a SIGKILLed kubelet leaves its shims and pods running, as on a real node
        for cg in _cgroup_dirs(node.state["cgroup_root"]):
            cg.mkdir(exist_ok=True)
    time.sleep(pause)
    node.start(name, entry["argv"], entry["env"])
    say(f"{name} restarted after {how.name}")


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _kubectl(run: Path, args: list[str]) -> None:
    node = Node(run)
    if not node.state or "kube-apiserver" not in node.live():
        fail(f"nothing is up in {node.run} (e2e/node up starts a node)")
    kubectl = k8s_dir(node.state["version"]) / "bin" / "kubectl"
    env = dict(os.environ, KUBECACHEDIR=str(node.run / "kubectl-cache"))  # not ~/.kube/cache
    os.execve(kubectl, [str(kubectl), f"--kubeconfig={node.kubeconfig}", *args], env)  # noqa: S606 (our kubectl)


def _env(run: Path) -> None:
    node = Node(run)
    if not node.state or not node.live():
        fail(f"nothing is up in {node.run}")
    print(node.env_line())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="{build,up,down,env,restart,image,kubectl}"
    )
    b = sub.add_parser("build", help="build the components into the cache (nothing when cached)")
    b.add_argument("--k8s", default=DEFAULT_K8S, help=f"Kubernetes release (default {DEFAULT_K8S})")
    u = sub.add_parser("up", help="start a node and print the export line")
    u.add_argument("--k8s", default=DEFAULT_K8S, help=f"Kubernetes release (default {DEFAULT_K8S})")
    u.add_argument(
        "--node-name", default=DEFAULT_NODE_NAME, help=f"the node's name (default {DEFAULT_NODE_NAME})"
    )
    r = sub.add_parser("restart", help="stop one component with a signal and start it again as up did")
    r.add_argument("component", choices=ORDER)
    r.add_argument(
        "--signal", choices=("TERM", "KILL", "INT"), default="TERM", help="how to stop it (default TERM)"
    )
    k = sub.add_parser(
        "kubectl", help="the node's kubectl with its kubeconfig: e2e/node kubectl get pods", add_help=False
    )
    k.add_argument("args", nargs=argparse.REMAINDER)
    for p in (
        u,
        sub.add_parser("down", help="stop what up started and clean up"),
        sub.add_parser("env", help="print the export line of a running node"),
        r,
        sub.add_parser(
            "image",
            help="build devplug's image from its Dockerfile (buildah, cached) and import it into the node",
        ),
        k,
    ):
        p.add_argument(
            "--run-dir",
            type=Path,
            default=DEFAULT_RUN,
            help=f"the node's run directory (default {DEFAULT_RUN}, or $DEVPLUG_E2E_RUN)",
        )
    args = parser.parse_args(argv)
    if args.command in ("build", "up"):
        _check_version(args.k8s)
    if args.command in ("up", "down", "image") and os.geteuid() != 0:
        fail(f"{args.command} needs root (the kubelet and containerd manage mounts and cgroups)", 2)
    if args.command == "up" and not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", args.node_name):
        fail(f"--node-name {args.node_name!r}: not a valid node name (lower-case letters, digits and '-')", 2)
    commands = {
        "build": lambda: build(args.k8s),
        "up": lambda: up(args.k8s, args.run_dir, args.node_name),
        "down": lambda: down(args.run_dir),
        "restart": lambda: restart(args.run_dir, args.component, signal.Signals[f"SIG{args.signal}"]),
        "kubectl": lambda: _kubectl(args.run_dir, args.args),
        "env": lambda: _env(args.run_dir),
        "image": lambda: image(args.run_dir),
    }
    if args.command in ("up", "image"):  # SIGTERM as Ctrl-C: what was started is cleaned up
        signal.signal(signal.SIGTERM, _interrupted)
        signal.signal(signal.SIGINT, _interrupted)  # also where the shell started it ignoring SIGINT
    try:
        commands[args.command]()
    except Failure as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        fail("interrupted", 130)


if __name__ == "__main__":
    main()
