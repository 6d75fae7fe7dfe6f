"""A small base install: each part that needs an extra says which, when used, in one line.

The processes here run with the extras' modules made unimportable (``sys.modules[name] = None``,
which Python's import system treats as absent), as in a ``pip install devplug`` without extras.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tomllib

from devplug._extras import EXTRAS, missing

ROOT = Path(__file__).resolve().parents[2]
ABSENT = ("h11", "lightkube", "lightkube.models", "prometheus_client", "pynvml")
# Run a module as its console script would, with the extras' modules absent.
RUNNER = (
    "import runpy, sys\n"
    f"for name in {ABSENT!r}:\n"
    "    sys.modules[name] = None\n"
    "module = sys.argv[1]\n"
    "sys.argv = [module, *sys.argv[2:]]\n"
    "runpy.run_module(module, run_name='__main__', alter_sys=True)\n"
)


BLOCKER = RUNNER.split("module = ", maxsplit=1)[0]


def without_extras(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """Run module ``args[0]`` as a command with ``args[1:]``."""
    return subprocess.run(
        [sys.executable, "-c", RUNNER, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def code_without_extras(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", BLOCKER + textwrap.dedent(code)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_extras_name_what_pyproject_installs() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = " ".join(project["dependencies"])
    for dist in ("lightkube", "h11", "prometheus-client", "nvidia-ml-py"):
        assert dist not in base, f"{dist} is in the base install"
    extras = project["optional-dependencies"]
    assert set(EXTRAS) <= set(extras)
    assert any(d.startswith("lightkube>=") for d in extras["dra"])
    assert any(d.startswith("h11>=") for d in extras["testing"])
    assert "devplug[dra,testing,nvidia,metrics]" in extras["dev"]
    for extra in EXTRAS:  # the development install has them all
        assert missing(extra) is None, extra


def test_a_device_plugin_and_its_testing_kit_need_no_extra() -> None:
    res = code_without_extras(
        """
        import devplug, devplug.testing, devplug.testing.pytest_plugin, devplug_fake
        import devplug_nvidia._cli._main
        from devplug.testing import FakeKubelet, run_conformance, serving
        print("ok")
        """
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "ok"


def test_the_fake_api_server_names_the_testing_extra() -> None:
    res = code_without_extras(
        """
        import devplug.testing
        try:
            devplug.testing.FakeKubeAPI
        except ImportError as exc:
            print(exc)
        """
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == (
        "devplug.testing.FakeKubeAPI needs the 'testing' extra: pip install 'devplug[testing]'"
    )


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["devplug", "run", "--api", "dra", "tests.support:Widgets"],
            "devplug run tests.support:Widgets: --api dra needs the 'dra' extra: pip install 'devplug[dra]'",
        ),
        (
            ["devplug_fake", "--api", "dra", "--node-name", "n1"],
            "devplug-fake: --api dra needs the 'dra' extra: pip install 'devplug[dra]'",
        ),
        (
            ["devplug_nvidia", "--api", "dra", "--fake-nvml", "dgx-a100", "--node-name", "n1"],
            "devplug-nvidia: --api dra needs the 'dra' extra: pip install 'devplug[dra]'",
        ),
        (
            ["devplug", "demo", "--dra"],
            "devplug demo: demo --dra needs the 'testing' extra: pip install 'devplug[testing]'",
        ),
        (
            ["devplug", "kubelet", "--dra", "--kubelet-root", "/tmp/devplug-extras-test"],
            "devplug kubelet: devplug.testing.FakeKubeAPI needs the 'testing' extra: "
            "pip install 'devplug[testing]'",
        ),
        (
            ["devplug", "conformance", "--dra", "--", "true"],
            "devplug conformance: run_dra_conformance needs the 'testing' extra: "
            "pip install 'devplug[testing]'",
        ),
    ],
    ids=["run", "devplug-fake", "devplug-nvidia", "demo", "kubelet", "conformance"],
)
def test_a_command_that_needs_an_extra_exits_2_with_one_line(args: list[str], line: str) -> None:
    res = without_extras(*args)
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip() == line
    assert not Path("/tmp/devplug-extras-test").exists()  # nothing was made before the refusal


def test_a_plugins_own_pytest_run_needs_no_extra(tmp_path: Path) -> None:
    (tmp_path / "test_plugin.py").write_text(
        textwrap.dedent(
            """
            import pytest
            from devplug.testing import FakeKubelet

            pytestmark = pytest.mark.anyio

            async def test_the_fixture_serves(fake_kubelet: FakeKubelet) -> None:
                assert fake_kubelet.socket_path.exists()
            """
        )
    )
    (tmp_path / "conftest.py").write_text(
        '@__import__("pytest").fixture(scope="session")\ndef anyio_backend():\n    return "asyncio"\n'
    )
    res = without_extras("pytest", "-q", "-p", "no:cacheprovider", str(tmp_path), cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "1 passed" in res.stdout
