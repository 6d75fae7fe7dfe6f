"""The host tree of a fake NVML machine model, for ``--fake-nvml MODEL``.

A fake model answers NVML calls, but discovery and the labels also read the host's files: NUMA
nodes and PCI classes under ``/sys``, MIG capability minors under ``/proc``, device nodes under
``/dev``, the driver's libraries under the driver root. Without the model's files a run reads
this machine's own, and a machine without GPUs has none of them: NUMA nodes come out empty, MIG
devices lose their capability nodes and every GPU's mode is unknown.

So ``--fake-nvml MODEL`` without a driver root of its own lays the model's tree out
(:func:`devplug_nvidia.testing.write_root`) in a temporary directory and points the driver root at
it, for that run only: :class:`FakeRoots` removes it when the process ends, whether it ends
normally, on SIGTERM or SIGINT, or on a start-up error. A driver root that is given
(``--driver-root``, ``NVIDIA_DRIVER_ROOT``, ``flags.nvidiaDriverRoot``) is used as it is.
``devplug-nvidia fake-root MODEL DIR`` (:func:`main`) writes a tree to keep.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import stat
import sys
import tempfile
import textwrap
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import structlog

from devplug.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence
    from types import FrameType, TracebackType

    from devplug_nvidia.config import NvidiaSettings
    from devplug_nvidia.testing import MachineModel

__all__ = ["FakeRoots", "main", "model_names", "models_help", "with_fake_root"]

PROG = "devplug-nvidia fake-root"
DEV_NULL = "/dev/null"
TEMP_PREFIX = "devplug-nvidia-fake-"
"""Prefix of the temporary directories (under ``$TMPDIR``, default ``/tmp``)."""

log = structlog.get_logger("devplug_nvidia")


def model_names() -> list[str]:
    """The fake NVML machine models, by name."""
    from devplug_nvidia.testing import MODELS

    return sorted(MODELS)


def models_help() -> str:
    """The models, one to a paragraph: the name and what the machine is."""
    from devplug_nvidia.testing import MODELS

    width = max(map(len, MODELS))
    return "\n".join(
        textwrap.fill(
            MODELS[name].description,
            width=79,
            initial_indent=f"  {name:<{width}}  ",
            subsequent_indent=" " * (width + 4),
        )
        for name in sorted(MODELS)
    )


def write_tree(model: MachineModel, root: Path) -> Path:
    """:func:`~devplug_nvidia.testing.write_root`, with the ``/dev`` stand-ins made character
    devices with ``/dev/null``'s numbers, which plain files are not (the host-path check of
    Allocate's device specs, and a container runtime's CDI injection, want device nodes).

    As root they are real nodes (``mknod``): containerd's CDI injection does not follow links
    (``not a device node``). Without root, where ``mknod`` is refused, links to ``/dev/null``,
    which satisfy whoever follows them (the host-path check)."""
    from devplug_nvidia.testing import write_root

    dev = root / "dev"
    for path in _stand_ins(dev):  # a tree written before: write_root would write to /dev/null
        path.unlink()
    write_root(model, root)
    null = os.stat(DEV_NULL)
    for path in sorted(dev.rglob("*")):
        if path.is_file() and not path.is_symlink():
            path.unlink()
            try:
                os.mknod(path, stat.S_IFCHR | 0o666, null.st_rdev)
            except PermissionError:
                path.symlink_to(DEV_NULL)
    return root


def _stand_ins(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return [p for p in folder.rglob("*") if p.is_symlink() or p.is_char_device()]


class _Terminated(SystemExit):
    """SIGTERM before the runner took the signal over: unwinds like SystemExit, so the tree goes."""


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise _Terminated(128 + signum)


@contextmanager
def _signals_held() -> Iterator[None]:
    """SIGTERM and SIGINT wait until the block is done (in the main thread; elsewhere they
    cannot run anyway)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


class FakeRoots:
    """The temporary trees of one process (one per model it ran on); all removed by :meth:`close`.

    Use it as a context manager around the whole run. While a tree exists and no one else has
    taken SIGTERM over (the runner does while it serves), SIGTERM raises SystemExit(143) in the
    main thread, so start-up ends through the ``with`` block too.
    """

    def __init__(self) -> None:
        self._base: Path | None = None
        self._roots: dict[str, Path] = {}
        self._previous: tuple[Any] | None = None
        """SIGTERM's handler before ours, while ours is in place."""

    def root(self, model: str) -> Path:
        """The tree of ``model``, written on first use.

        Raises:
            ConfigError: no model of that name (:func:`require_model`).
        """
        from devplug_nvidia.testing import MODELS

        require_model(model)
        if model not in self._roots:
            if self._base is None:
                with _signals_held():
                    self._base = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX))
                    # Not when the process's own handler is in place: it unwinds the same way.
                    main = threading.current_thread() is threading.main_thread()
                    if main and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
                        self._previous = (signal.signal(signal.SIGTERM, _terminate),)
            self._roots[model] = write_tree(MODELS[model], self._base / model)
        return self._roots[model]

    @property
    def trees(self) -> dict[str, Path]:
        """Model name → its tree, for those written so far."""
        return dict(self._roots)

    def log_trees(self) -> None:
        """Say where the trees are (once logging is configured)."""
        for model, path in self._roots.items():
            log.info("fake_nvml_root", model=model, path=str(path), note="removed at exit")

    def close(self) -> None:
        """Remove the trees; SIGTERM or SIGINT arriving meanwhile is handled after."""
        if self._base is None:
            return
        with _signals_held():
            shutil.rmtree(self._base, ignore_errors=True)
            self._base, self._roots = None, {}
            if self._previous is not None:
                signal.signal(signal.SIGTERM, self._previous[0])
                self._previous = None

    def __enter__(self) -> FakeRoots:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def require_model(model: str) -> None:
    """Refuse a ``--fake-nvml`` name that is no model, as every other bad value is refused: one
    line, exit status 2, before anything starts.

    Raises:
        ConfigError: no model of that name (the message lists the known ones).
    """
    from devplug_nvidia.testing import MODELS

    if model not in MODELS:
        raise ConfigError(
            f"invalid setting --fake-nvml: no model {model!r}; known: {', '.join(sorted(MODELS))}"
        )


def with_fake_root(settings: NvidiaSettings, roots: FakeRoots) -> NvidiaSettings:
    """``settings`` on the fake model's tree: with ``fake_nvml`` set and no driver root given,
    the driver root (and so the dev root, /sys and /proc of the model, and the container's
    view of the driver root, unless given) becomes a tree from ``roots``.

    Raises:
        ConfigError: ``fake_nvml`` names no model.
    """
    given = settings.model_fields_set
    if settings.fake_nvml:
        require_model(settings.fake_nvml)
    if not settings.fake_nvml or "driver_root" in given:
        return settings
    root = roots.root(settings.fake_nvml)
    update = {"driver_root": str(root)}
    if "driver_root_ctr_path" not in given:
        update["driver_root_ctr_path"] = str(root)
    return settings.model_copy(update=update)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        usage=f"{PROG} [-h] MODEL DIR",
        description=textwrap.fill(
            "Write a fake NVML machine model's host tree to DIR, to keep: /sys (NUMA nodes, PCI "
            "classes, the DMI product name), /proc (MIG capability minors), /dev (stand-ins for the "
            "device nodes) and a user-space driver of the model's version; then print the commands "
            "that run on it. (devplug-nvidia --fake-nvml MODEL alone lays the same tree out in a "
            "temporary directory for the run, removed at exit.)",
            width=78,
        ),
        epilog="models:\n" + models_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("model", metavar="MODEL", choices=model_names(), help="the machine model (below)")
    parser.add_argument("dir", metavar="DIR", type=Path, help="where to write the tree (made if missing)")
    return parser


def main(argv: Sequence[str]) -> int:
    """``devplug-nvidia fake-root MODEL DIR``; returns the exit status (2: bad arguments, 1: not written)."""
    try:
        args = _parser().parse_args(list(argv))
    except ConfigError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    from devplug_nvidia.testing import MODELS

    target: Path = args.dir.absolute()
    try:
        write_tree(MODELS[args.model], target)
    except OSError as exc:
        print(f"{PROG}: cannot write the tree to {target}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    flags = f"--fake-nvml {shlex.quote(args.model)} --driver-root {shlex.quote(str(target))}"
    print(f"wrote the {args.model} tree to {target}; run on it with:")
    print(f"  devplug-nvidia {flags}")
    print(f"  devplug-nvidia labels {flags}")
    return 0
