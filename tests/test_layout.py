"""benchmarks/ and tests/ do not import each other, and test files are named by subject
(docs/testing.md, "Layout of the tests").

- A benchmark imports gateway/, classifier/, tooling/ and other benchmarks, never tests/:
  no `tests.` import, and no path into tests/ put on sys.path.
- A test never imports a benchmark: tests/benchmarks run each one as a user does,
  `python benchmarks/NAME.py` in a subprocess (tests/benchmarks/benchrun.py).
- tooling/ (the specroute-tools distribution) imports neither.
What both need lives in tooling/: tooling/sim/, tooling/chaos.py, tooling/envoy.py.
- gateway/ and classifier/ (the specroute distribution) import no tooling, nor name a
  module of it for importlib: the tools reach the CLI through the `specroute.commands`
  entry points (gateway/commands.py), so the arrows go one way, tooling -> gateway.

Every import is read from the source, at the top of a module or inside a function.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"

# Words that say when or why a test was written, not what it tests.
NOT_A_SUBJECT = re.compile(
    r"(^|_)(reviews?|defects?|issues?\d*|fix(es)?|bugs?|regressions?|misc|new|more|extra|"
    r"other|\d+)(_|$)"
)


def _sources(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


def _imports(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, module) for every absolute import: `import a.b` and `from a.b import c`
    give a.b."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module


def _strings(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, text) of every string constant but the docstrings."""
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
        ):
            yield node.lineno, node.value


def _top(module: str) -> str:
    return module.split(".")[0]


def _test_helpers() -> set[str]:
    """The modules of tests/ that a path on sys.path would let one import by name
    (tests/classifier/foo.py as `foo`)."""
    return {p.stem for p in _sources(TESTS) if p.stem not in ("__init__", "conftest")}


def _offences(path: Path, banned: set[str]) -> list[str]:
    return _offences_in(path.read_text(), str(path.relative_to(ROOT)), banned)


def _offences_in(source: str, where: str, banned: set[str]) -> list[str]:
    tree = ast.parse(source, where)
    out = [f"{where}:{line} imports {m}" for line, m in _imports(tree) if _top(m) in banned]
    if "tests" in banned:
        helpers = _test_helpers()
        out += [
            f"{where}:{line} imports {m}, a module of tests/"
            for line, m in _imports(tree)
            if "." not in m and m in helpers
        ]
        out += [
            f"{where}:{line} names a path into tests/: {text!r}"
            for line, text in _strings(tree)
            if text == "tests" or text.startswith(("tests/", "tests."))
        ]
    if "tooling" in banned:
        out += [
            f"{where}:{line} names a tooling module: {text!r}"
            for line, text in _strings(tree)
            if text.startswith("tooling.")
        ]
    if "benchmarks" in banned:
        out += [
            f"{where}:{line} names a benchmark module: {text!r}"
            for line, text in _strings(tree)
            if text.startswith("benchmarks.")
        ]
    return out


def test_no_benchmark_imports_from_tests() -> None:
    offences = [o for p in _sources(ROOT / "benchmarks") for o in _offences(p, {"tests"})]
    assert offences == [], "\n".join(offences)


def test_no_test_imports_a_benchmark() -> None:
    tests = [p for p in _sources(TESTS) if p != Path(__file__).resolve()]  # not its own examples
    offences = [o for p in tests for o in _offences(p, {"benchmarks"})]
    assert offences == [], "\n".join(offences)


def test_tooling_imports_neither_tests_nor_benchmarks() -> None:
    banned = {"tests", "benchmarks"}
    offences = [o for p in _sources(ROOT / "tooling") for o in _offences(p, banned)]
    assert offences == [], "\n".join(offences)


def test_the_gateway_imports_no_tooling() -> None:
    sources = _sources(ROOT / "gateway") + _sources(ROOT / "classifier")
    offences = [o for p in sources for o in _offences(p, {"tooling", "tests", "benchmarks"})]
    assert offences == [], "\n".join(offences)


def test_the_check_sees_what_it_must() -> None:
    """The shapes that were here before: a folder of tests/ on sys.path and a module
    of it imported by name, an import from tests/, and a test importing a benchmark."""
    old = (
        '"""A benchmark."""\n'
        'sys.path[:0] = [str(ROOT / "tests" / "benchmarks")]\n'
        "import benchrun\n"
        "from tests.extproc.helpers import events\n"
    )
    assert len(_offences_in(old, "old.py", {"tests"})) == 3
    test = "from benchmarks.overhead import pct\nimportlib.import_module('benchmarks.shadow')\n"
    assert len(_offences_in(test, "test_old.py", {"benchmarks"})) == 2
    cli = (  # gateway/cli.py as it was: a module of the tools imported, and one by name
        "from tooling.local_stack import serve_emulated\n_TOOLS = {'bench': 'tooling.bench.cli'}\n"
    )
    assert len(_offences_in(cli, "cli.py", {"tooling"})) == 2
    assert NOT_A_SUBJECT.search("review_defects") and NOT_A_SUBJECT.search("issue41")
    assert not NOT_A_SUBJECT.search("request_log")


def test_test_files_are_named_by_subject_once() -> None:
    """test_<subject>.py, the subject what is tested (a module, a feature, a behaviour),
    never when or why the test was written; and each name once in tests/, since the
    folders without an __init__.py import their files by name alone."""
    names = [p.name for p in _sources(TESTS) if p.name.startswith("test_")]
    bad = [n for n in names if NOT_A_SUBJECT.search(n.removeprefix("test_").removesuffix(".py"))]
    assert bad == [], bad
    twice = [n for n, count in Counter(names).items() if count > 1]
    assert twice == [], twice
