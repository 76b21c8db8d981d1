"""The two distributions: specroute (the wheel `specroute serve` runs from: gateway/
and classifier/ only) and specroute-tools (tooling/, its own pyproject.toml).

Both wheels are built here, offline (pip wheel --no-index --no-deps
--no-build-isolation: the venv's setuptools, from the dev extra), from a copy of
the sources, so no build/ or egg-info is left in the checkout and no stale build/
from an earlier run can slip files into the wheel. Each test prints the wheel's
files per top-level entry (shown with pytest's output, uncaptured).

And the CLI without tooling: every command that needs it exits 2 with one line
saying how to get it, not a traceback.
"""

from __future__ import annotations

import email.parser
import shutil
import subprocess
import sys
import tomllib
import zipfile
from collections import Counter
from pathlib import Path

import pytest

from .conftest import ROOT, run

_JUNK = shutil.ignore_patterns(
    "__pycache__", "*.pyc", "*.egg-info", "build", "dist", ".mypy_cache", ".pytest_cache"
)


def _version(pyproject: Path) -> str:
    return str(tomllib.loads(pyproject.read_text())["project"]["version"])


def _build_wheel(src: Path, out: Path) -> zipfile.ZipFile:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--disable-pip-version-check",
            "--no-index",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = out.glob("*.whl")
    return zipfile.ZipFile(wheel)


def _tops(files: list[str]) -> set[str]:
    return {f.split("/", 1)[0] for f in files}


def _summary(name: str, files: list[str]) -> str:
    """Files per top-level entry of the wheel, largest first."""
    counts = Counter(f.split("/", 1)[0] for f in files)
    lines = [f"{name}: {len(files)} files"]
    lines += [f"  {top:<36} {n:>4}" for top, n in sorted(counts.items(), key=lambda kv: -kv[1])]
    return "\n".join(lines)


def _listing(wheel: zipfile.ZipFile, capsys: pytest.CaptureFixture[str]) -> list[str]:
    """The wheel's files; their summary is printed, past pytest's capture."""
    files = wheel.namelist()
    with capsys.disabled():
        print(f"\n{_summary(Path(str(wheel.filename)).name, files)}")
    return files


def _metadata(wheel: zipfile.ZipFile) -> email.message.Message:
    (meta,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    return email.parser.Parser().parsestr(wheel.read(meta).decode())


def _sources(package: Path, prefix: str) -> set[str]:
    """The .py files of a package directory, as the wheel names them."""
    return {
        f"{prefix}/{p.relative_to(package).as_posix()}"
        for p in package.rglob("*.py")
        if "__pycache__" not in p.parts
    }


@pytest.fixture(scope="module")
def server_wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    # The whole project, tooling/ and tests/ included: the wheel must leave them out
    # by its own configuration, not because they were missing.
    src = tmp_path_factory.mktemp("server-src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    for name in ("gateway", "classifier", "tooling", "tests"):
        shutil.copytree(ROOT / name, src / name, ignore=_JUNK)
    return _build_wheel(src, tmp_path_factory.mktemp("server-wheel"))


@pytest.fixture(scope="module")
def tools_wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    src = tmp_path_factory.mktemp("tools-src") / "tooling"
    shutil.copytree(ROOT / "tooling", src, ignore=_JUNK)
    return _build_wheel(src, tmp_path_factory.mktemp("tools-wheel"))


def test_server_wheel_holds_gateway_and_classifier_only(
    server_wheel: zipfile.ZipFile, capsys: pytest.CaptureFixture[str]
) -> None:
    files = _listing(server_wheel, capsys)
    version = _version(ROOT / "pyproject.toml")
    assert _tops(files) == {"gateway", "classifier", f"specroute-{version}.dist-info"}
    assert not [f for f in files if f.startswith(("tooling/", "tests/"))]

    py = {f for f in files if f.endswith(".py")}
    sources = _sources(ROOT / "gateway", "gateway") | _sources(ROOT / "classifier", "classifier")
    assert py == sources, py ^ sources
    assert "gateway/openapi.json" in files
    static = {f"gateway/ui/static/{p.name}" for p in (ROOT / "gateway/ui/static").iterdir()}
    assert static and static <= set(files), static - set(files)

    (entry_points,) = [f for f in files if f.endswith(".dist-info/entry_points.txt")]
    assert "specroute = gateway.cli:main" in server_wheel.read(entry_points).decode()
    meta = _metadata(server_wheel)
    # The tooling's extras (bench, train, traffic) are specroute-tools' now.
    assert set(meta.get_all("Provides-Extra") or []) == {"dev"}
    runtime = [r for r in meta.get_all("Requires-Dist") or [] if "extra ==" not in r]
    assert not [r for r in runtime if r.startswith(("matplotlib", "scikit-learn", "specroute"))]


def test_tools_wheel_holds_tooling(
    tools_wheel: zipfile.ZipFile, capsys: pytest.CaptureFixture[str]
) -> None:
    files = _listing(tools_wheel, capsys)
    version = _version(ROOT / "tooling/pyproject.toml")
    assert version == _version(ROOT / "pyproject.toml"), "release both from one commit"
    assert _tops(files) == {"tooling", f"specroute_tools-{version}.dist-info"}

    # Every module of every subpackage (tooling/pyproject.toml lists the packages by
    # hand: one left off the list would be missing here), CALIBRATION.md, and not
    # the packaging file that lives in the package directory.
    py = {f for f in files if f.endswith(".py")}
    sources = _sources(ROOT / "tooling", "tooling")
    assert py == sources, py ^ sources
    assert "tooling/emulator/CALIBRATION.md" in files
    assert "tooling/pyproject.toml" not in files

    meta = _metadata(tools_wheel)
    assert meta["Name"] == "specroute-tools"
    requires = meta.get_all("Requires-Dist") or []
    assert f"specroute=={version}" in requires, requires
    assert set(meta.get_all("Provides-Extra") or []) == {"bench", "train", "traffic"}


# The CLI in a subprocess, tooling hidden: None in sys.modules makes `import tooling`
# fail as an uninstalled package does (ModuleNotFoundError, name "tooling").
_NO_TOOLING = (
    "import sys; sys.modules['tooling'] = None; "
    "from gateway.cli import main; sys.exit(main(sys.argv[1:]))"
)


@pytest.mark.parametrize(
    "argv",
    [
        ["bench"],
        ["bench", "--help"],
        ["demo"],
        ["emulate", "--port", "0"],
        ["advise", "x.json"],
        ["train"],
        ["serve", "--emulate"],
    ],
    ids=" ".join,
)
def test_tool_commands_without_tooling_say_how_to_get_it(argv: list[str]) -> None:
    result = run([sys.executable, "-c", _NO_TOOLING, *argv], cwd=ROOT)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    (line,) = result.stderr.splitlines()
    command = "serve --emulate" if argv[0] == "serve" else argv[0]
    assert line == (
        f"specroute {command}: needs specroute-tools (the tooling package), which is not "
        "installed; from a specroute checkout: pip install ./tooling"
    )


@pytest.mark.parametrize("argv", [["--help"], ["serve", "--help"], ["profile", "--help"]])
def test_server_commands_need_no_tooling(argv: list[str]) -> None:
    result = run([sys.executable, "-c", _NO_TOOLING, *argv], cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "usage: specroute" in result.stdout


def test_a_missing_dependency_inside_tooling_is_not_reported_as_tooling() -> None:
    from gateway.cli import _tooling_missing

    with pytest.raises(ModuleNotFoundError, match="sklearn"):
        _tooling_missing("train", ModuleNotFoundError("No module named 'sklearn'", name="sklearn"))
