"""Run aiperf's CLI with a tokenizer from a local model folder while offline.

aiperf 0.13.0 in HF offline mode (HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE set)
resolves every tokenizer name through `huggingface_hub.snapshot_download(...,
local_files_only=True)`, which refuses a folder path ("HFValidationError: Repo
id must be in the form 'repo_name' or 'namespace/repo_name'"), so
`--tokenizer /path/to/model` fails before the first request. This launcher
makes that one lookup answer a folder that exists with the folder itself (what
aiperf does online, where it passes the path to AutoTokenizer directly) and
runs aiperf's own CLI:

    AIPERF_VENV/bin/python deploy/cpu/clients/aiperf_cli.py profile ...

The patch is applied at import time, not under `__main__`: aiperf runs its
services in processes started with multiprocessing's "spawn", which import
this file again as `__mp_main__`, so each of them is patched too. Runs with
the aiperf venv's Python.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any


def _patch() -> None:
    from aiperf.common import tokenizer

    original: Any = tokenizer.Tokenizer._resolve_local_snapshot

    def resolve(cls: Any, name: str, revision: str) -> str:
        if Path(name).is_dir():
            return name
        return str(original.__func__(cls, name, revision))

    tokenizer.Tokenizer._resolve_local_snapshot = classmethod(resolve)  # type: ignore[method-assign,assignment,unused-ignore]


_patch()


def main() -> int:
    from aiperf.cli import app

    sys.argv[0] = "aiperf"
    result = app()
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
