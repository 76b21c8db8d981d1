"""Every stage of the config's checks in one pass: a type error does not hide a bad
policy name, a bad k does not hide four bad route names."""

from __future__ import annotations

import tomllib

import pytest

from gateway.config import ConfigError, parse_config

# A type error (server.port), a bad k (-2), a bad policy name and four bad route names.
BAD = """
[server]
port = "eighty"
[routing]
policy = "fastest"
[routes.Plain]
urls = ["http://127.0.0.1:8001"]
[routes.NGRAM]
urls = ["http://127.0.0.1:8002"]
method = "ngram"
num_speculative_tokens = -2
[routes."eagle 3"]
urls = ["http://127.0.0.1:8003"]
method = "eagle3"
num_speculative_tokens = 3
[routes."-mtp"]
urls = ["http://127.0.0.1:8004"]
method = "mtp"
num_speculative_tokens = 1
"""


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(tomllib.loads(text))
    lines = str(caught.value).splitlines()
    return [line.removeprefix("  - ") for line in lines[1:]] if len(lines) > 1 else lines


def test_every_stage_is_reported_together() -> None:
    found = problems(BAD)
    expected = [
        "server.port must be an integer, got 'eighty'",  # the tables' stage
        "routes.NGRAM.num_speculative_tokens must be >= 0, got -2",
        "[routes.Plain]: a route's name",  # the routes' stage
        "[routes.NGRAM]: a route's name",
        '[routes."eagle 3"]: a route\'s name',
        "[routes.-mtp]: a route's name",
        "routing.policy must be one of profiled, rules, static-Plain",
    ]
    for text in expected:
        assert [p for p in found if p.startswith(text)], (text, found)
    assert len(found) == len(expected), found


def test_a_route_table_that_cannot_be_built_does_not_add_missing_servers() -> None:
    # routes.b has no urls: the routes' stage would only say there are no servers.
    found = problems(
        '[server]\nport = "x"\n[routes.a]\nurls = ["http://127.0.0.1:1"]\n[routes.b]\nmethod = "none"\n'
    )
    assert sorted(found) == [
        "missing key 'routes.b.urls'",
        "server.port must be an integer, got 'x'",
    ]


def test_a_good_config_still_loads() -> None:
    config = parse_config(
        tomllib.loads(
            BAD.replace('"eighty"', "80")
            .replace(" -2", " 2")
            .replace("Plain", "plain")
            .replace("NGRAM", "ngram")
            .replace('"eagle 3"', "eagle3")
            .replace('"-mtp"', "mtp")
            .replace("fastest", "profiled")
        )
    )
    assert [r.value for r in config.routes] == ["plain", "ngram", "eagle3", "mtp"]
