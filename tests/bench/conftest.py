"""Shared by the bench tests: one short emulated bench, run once for the module that asks."""

from __future__ import annotations

import pytest

from classifier.tokens import TokenCounter, load_tiktoken_counter


@pytest.fixture(scope="session")
def tokens() -> TokenCounter:
    return load_tiktoken_counter("cl100k_base")
