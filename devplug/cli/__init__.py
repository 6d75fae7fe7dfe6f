"""The ``devplug`` command: ``run``, ``demo``, ``inspect``, ``conformance`` and ``kubelet``.

What belongs here is the command line only: argument parsing, the sub-commands and what they
print (``_demo``, ``_inspect`` with its client and renderer, ``_conformance``, ``_kubelet``, the
shared ``_argtypes``). Nothing in the library imports this package: only ``devplug.__main__``
(``python -m devplug``), the ``devplug`` console script (``devplug.cli:main``), the tests and
the bench do. Work a library user could want belongs in the library; the commands use it like
any other program.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    import argparse

    from devplug.plugin import DevicePlugin

__all__ = ["main"]


def _fail(message: str) -> NoReturn:
    print(f"devplug run: {message}", file=sys.stderr)
    raise SystemExit(2)


def _load(target: str) -> object:
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        _fail(f"expected MODULE:CLASS, got {target!r}")
    # The current directory is on the import path, as uvicorn and celery do it: a plugin saved
    # as ./serialports.py runs as serialports:SerialPorts (a console script's own path[0] is
    # the script's directory, not the current one).
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        _fail(f"cannot import {module_name}: {exc}")
    try:
        obj: object = module
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        _fail(f"{module_name} has no attribute {attr}")
    return obj


_TARGET = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")


def _split_run(args: list[str]) -> tuple[str, list[str]]:
    """The MODULE:CLASS target and the runner options around it, in any order.

    ``devplug run --api dra mod:Class`` and ``devplug run mod:Class --api dra`` are the same:
    the target is the first argument shaped like one (an option's value such as ``:8080`` is
    not).
    """
    if "--version" in args:
        from devplug._version import version

        print(f"devplug run {version()}")
        raise SystemExit(0)
    for index, arg in enumerate(args):
        if _TARGET.fullmatch(arg):
            return arg, args[:index] + args[index + 1 :]
    if "-h" in args or "--help" in args:
        _run_help()
    # A word that is not an option's value (``--api dra``) was meant as the target.
    wrong = next(
        (a for i, a in enumerate(args) if not a.startswith("-") and not (i and _takes_value(args[i - 1]))),
        None,
    )
    _fail(
        f"expected MODULE:CLASS, got {wrong!r}"
        if wrong
        else "the following arguments are required: MODULE:CLASS"
    )


def _run_help() -> NoReturn:
    """``devplug run --help`` without a target: what run takes, then the runner options."""
    print(
        "usage: devplug run MODULE:CLASS [OPTIONS]\n\n"
        "Serve a DevicePlugin subclass (or instance) found as MODULE:CLASS; the current directory\n"
        "is on the import path, so ./myplugin.py runs as myplugin:MyPlugin. The options below are\n"
        "the runner's; a class with a settings_class adds its own (devplug run MODULE:CLASS --help).\n"
    )
    sys.stdout.flush()
    from devplug.settings import Settings, load_settings

    load_settings(Settings, ["--help"], prog="devplug run MODULE:CLASS")
    raise SystemExit(0)  # pragma: no cover - --help exits


def _takes_value(arg: str) -> bool:
    return arg.startswith("--") and "=" not in arg


def _cmd_run(target: str, rest: list[str]) -> int:
    from devplug._main import run
    from devplug.plugin import DevicePlugin

    obj = _load(target)
    prog = f"devplug run {target}"
    if isinstance(obj, type) and issubclass(obj, DevicePlugin):
        _check_class(obj, target)
        # The class says which settings it takes and how it is built from them.
        return run(obj.from_settings, settings_cls=obj.settings_class, argv=rest, prog=prog)
    if isinstance(obj, DevicePlugin):
        return run(obj, argv=rest, prog=prog)
    _fail(f"{target} is not a DevicePlugin subclass or instance")


def _check_class(cls: type[DevicePlugin], target: str) -> None:
    """One line (exit 2) for the mistakes that would otherwise end in a traceback at start."""
    import inspect  # ~10 ms to import: not before main's first line, and only for a class that needs it

    from devplug.plugin import DevicePlugin

    missing = sorted(getattr(cls, "__abstractmethods__", ()))
    if missing:
        defs = ", ".join(f"async def {name}(...)" for name in missing)
        _fail(f"{target} cannot be built: {cls.__name__} does not define {', '.join(missing)}; add {defs}")
    own = cls.__mro__[: cls.__mro__.index(DevicePlugin)]
    if any("from_settings" in vars(k) for k in own):
        return  # the class builds itself from its settings
    if cls.__init__ is object.__init__ and cls.__new__ is object.__new__:
        return  # object's constructor, which takes nothing (inspect.signature would take ~4 ms)
    try:
        inspect.signature(cls).bind()
    except TypeError:
        params = [
            p.name
            for p in inspect.signature(cls).parameters.values()
            if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
        _fail(
            f"{target} cannot be built: {cls.__name__}() needs {', '.join(params)}; give "
            f"{'them defaults' if len(params) > 1 else 'it a default'}, or define "
            "from_settings(cls, settings) to build it (with a settings_class for its options)"
        )
    except ValueError:  # no signature to read (a C type): let the runner try it
        return


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``devplug`` console script."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] in (["run"], ["kubelet"], ["demo"], ["conformance"], ["inspect"]):
        from devplug._runtime.signals import install_signals

        # First: a Ctrl-C or SIGTERM from here on is one line and status 130 (before serving),
        # or a clean stop (after; for inspect, once --watch follows its stream).
        install_signals(f"devplug {args[0]}")
    if args[:1] == ["run"]:
        # run parses its own options (the runner's settings): the other commands' parsers and
        # modules are not needed, and a plugin's start does not wait for them.
        return _cmd_run(*_split_run(args[1:]))
    # Imported here, not at the top: the console script's import stays small (the library,
    # pydantic and grpc load once a command runs).
    from devplug._version import version
    from devplug.cli import _conformance
    from devplug.cli.inspect import command as _inspect
    from devplug.cli.kubelet import command as _kubelet
    from devplug.settings import _OneLineParser

    # One line and status 2 for a bad argument, in every sub-command (sub-parsers share the class).
    parser = _OneLineParser(prog="devplug", description="Kubernetes device plugins in async Python.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run_parser = sub.add_parser(
        "run",
        help="serve a DevicePlugin class (MODULE:CLASS) to the kubelet",
        description="Serve MODULE:CLASS with the standard runner options (see --help after the target).",
        add_help=False,
    )
    run_parser.add_argument("target", metavar="MODULE:CLASS")
    demo_parser = sub.add_parser(
        "demo",
        help="watch a fake kubelet and a fake plugin talk: registration, allocation, health, restart",
    )
    demo_parser.add_argument(
        "--dra",
        action="store_true",
        help="the same plugin as a DRA driver: slices published, a claim prepared, a wipe restored",
    )
    inspect_parser = _inspect.add_parser(sub)
    conformance_parser = _conformance.add_parser(sub)
    kubelet_parser = _kubelet.add_parser(sub)
    for name, sub_parser in sub.choices.items():
        if name != "run":  # run's options come from the runner's settings, --version included
            sub_parser.add_argument("--version", action="version", version=f"devplug {name} {version()}")
    known, rest = parser.parse_known_args(args)
    from devplug._extras import MissingExtraError

    try:
        parsers = {"conformance": conformance_parser, "inspect": inspect_parser, "kubelet": kubelet_parser}
        return _dispatch(known, rest, parser, parsers)
    except MissingExtraError as exc:  # a part whose extra is not installed: one line, status 2
        print(f"devplug {known.command}: {exc}", file=sys.stderr)
        return 2


def _dispatch(
    known: argparse.Namespace,
    rest: list[str],
    parser: argparse.ArgumentParser,
    parsers: dict[str, argparse.ArgumentParser],
) -> int:
    from devplug.cli import _conformance
    from devplug.cli.inspect import command as _inspect
    from devplug.cli.kubelet import command as _kubelet

    if known.command == "conformance":
        # Everything after the options is the plugin's command line, its own flags included.
        return _conformance.main(known, parsers["conformance"])
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if known.command == "demo":
        from devplug.cli.demo import story as _demo

        if known.dra:
            from devplug._extras import require

            require("testing", "demo --dra")  # its API server is the testing kit's
        return _demo.main(dra=known.dra)
    if known.command == "inspect":
        return _inspect.main(known, parsers["inspect"])
    if known.command == "kubelet":
        return _kubelet.main(known, parsers["kubelet"])
    parser.error(f"unknown command {known.command}")
    return 2  # pragma: no cover - parser.error exits


if __name__ == "__main__":
    sys.exit(main())
