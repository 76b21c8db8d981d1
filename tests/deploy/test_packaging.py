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
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from collections import Counter
from pathlib import Path

import pytest
import trove_classifiers

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
    for name in ("pyproject.toml", "README.md", "LICENSE"):
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
    # The tooling's extras (bench, train, traffic) are specroute-tools' now; envoy holds
    # what only `specroute ext-proc` needs, otel the spans (docs/tracing.md), and dev
    # (the tests) takes both in.
    assert set(meta.get_all("Provides-Extra") or []) == {"dev", "envoy", "otel"}
    requires = meta.get_all("Requires-Dist") or []
    runtime = [r for r in requires if "extra ==" not in r]
    assert not [r for r in runtime if r.startswith(("matplotlib", "scikit-learn", "specroute"))]
    grpc = ("grpcio", "protobuf", "grpcio-health-checking")
    assert not [r for r in runtime if re.split(r"[<>=!~ ;\[]", r)[0] in grpc], runtime
    envoy = {re.split(r"[<>=!~ ;]", r)[0] for r in requires if 'extra == "envoy"' in r}
    assert envoy == set(grpc), envoy
    assert any(r.startswith("specroute[envoy]") and 'extra == "dev"' in r for r in requires)
    assert any(r.startswith("specroute[otel]") and 'extra == "dev"' in r for r in requires)
    assert not [r for r in runtime if r.startswith("opentelemetry")], runtime


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
    # the bench's progress bar (rate, time left) is a maintained library's
    assert [r for r in requires if r.startswith("tqdm") and "extra" not in r], requires
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


@pytest.mark.parametrize("which", ["server", "tools"])
def test_each_wheel_carries_the_license_and_pypi_metadata(
    which: str, server_wheel: zipfile.ZipFile, tools_wheel: zipfile.ZipFile
) -> None:
    wheel = server_wheel if which == "server" else tools_wheel
    meta = _metadata(wheel)
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta.get_all("License-File") == ["LICENSE"]
    (license_file,) = [n for n in wheel.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
    assert wheel.read(license_file) == (ROOT / "LICENSE").read_bytes()
    assert meta["Author"] or meta["Author-email"]
    classifiers = meta.get_all("Classifier") or []
    assert "Programming Language :: Python :: 3.11" in classifiers
    # PyPI refuses an unknown classifier at upload; PEP 639 forbids License :: beside
    # a license expression.
    assert not [c for c in classifiers if c not in trove_classifiers.classifiers]
    assert not [c for c in classifiers if c.startswith("License ::")]


def test_the_license_is_the_apache_license_2_0_in_full() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    # the nine sections of the terms, then the appendix on how to apply it
    for n, title in enumerate(
        [
            "Definitions",
            "Grant of Copyright License",
            "Grant of Patent License",
            "Redistribution",
            "Submission of Contributions",
            "Trademarks",
            "Disclaimer of Warranty",
            "Limitation of Liability",
            "Accepting Warranty or Additional Liability",
        ],
        start=1,
    ):
        assert f"{n}. {title}." in text, title
    assert "END OF TERMS AND CONDITIONS" in text
    assert "APPENDIX: How to apply the Apache License to your work." in text
    assert (ROOT / "tooling/LICENSE").read_bytes() == text.encode()  # the link resolves


def test_ext_proc_without_grpc_says_which_extra() -> None:
    no_grpc = (
        "import sys; sys.modules['grpc'] = None; "
        "from gateway.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    result = run(
        [
            sys.executable,
            "-c",
            no_grpc,
            "ext-proc",
            "--backend",
            "speculative=http://127.0.0.1:9",
            "--backend",
            "baseline=http://127.0.0.1:9",
        ],
        cwd=ROOT,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    (line,) = result.stderr.splitlines()
    assert line == (
        "specroute ext-proc: needs grpcio and protobuf (grpc is not installed): "
        "pip install 'specroute[envoy]'"
    )


@pytest.mark.parametrize("command", ["serve", "profile"])
def test_server_commands_run_without_grpc(command: str, tmp_path: Path) -> None:
    """`serve` and `profile` import nothing of gRPC: the envoy extra is for ext-proc only.
    Through the CLI, whatever module each lives in: both import their code, then stop on a
    config file that is not there (exit 2, the config's own message)."""
    code = (
        "import sys; sys.modules['grpc'] = None; sys.modules['google.protobuf'] = None; "
        "import gateway.app; from gateway.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    missing = tmp_path / "missing.toml"
    result = run([sys.executable, "-c", code, command, "--config", str(missing)], cwd=ROOT)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and "grpc" not in result.stderr
    assert str(missing) in result.stderr


def test_the_install_lines_take_both_distributions_from_the_checkout() -> None:
    """specroute-tools pins specroute of its own version, which no index holds: every
    documented install of the tooling names `.` in the same pip command, and the README's
    production line installs without -e."""
    readme = (ROOT / "README.md").read_text()
    tools = (ROOT / "tooling/pyproject.toml").read_text()
    lines = [
        line
        for text in (readme, tools)
        for line in text.splitlines()
        if re.search(r"pip install .*\./tooling", line)
    ]
    assert lines
    for line in lines:
        command = line.split("pip install", 1)[1].split("#")[0]
        assert re.search(r"(^|\s)(-e )?'?\.(\[\w+\])?'?(\s|$)", command), line
    production = [
        line for line in readme.splitlines() if "pip install" in line and "-e" not in line
    ]
    assert production, "the README has no install line without -e"
