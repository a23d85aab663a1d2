"""URL rules share their compiled builders between apps and still build
what Werkzeug's own rules build."""

from __future__ import annotations

import pytest
from quart.routing import QuartMap, QuartRule

from buildmax.app import create_app
from buildmax.config import Config
from buildmax.url_rules import SharedBuilderRule

pytestmark = pytest.mark.engine_independent


def _values(rule: QuartRule) -> dict[str, object]:
    """A value for every variable of ``rule``, one a URL must escape."""
    return {name: f"v {name}/é" for name in rule.arguments if name not in (rule.defaults or {})}


def test_every_route_builds_as_a_plain_rule_would_and_apps_share_the_builders(tmp_path):
    first = create_app(Config(data_dir=str(tmp_path / "a")))
    second = create_app(Config(data_dir=str(tmp_path / "b")))
    plain_map = QuartMap()
    built = 0
    for rule, twin in zip(first.url_map.iter_rules(), second.url_map.iter_rules(), strict=True):
        assert (rule.rule, rule.endpoint) == (twin.rule, twin.endpoint)
        plain = QuartRule(rule.rule, endpoint=rule.endpoint, defaults=rule.defaults)
        plain_map.add(plain)
        values = _values(rule)
        for append_unknown in (False, True):
            extra = {"page": "2 of 3"} if append_unknown else {}
            assert rule.build({**values, **extra}, append_unknown) == plain.build(
                {**values, **extra}, append_unknown
            )
            built += 1
        assert rule._build.__func__ is twin._build.__func__
        assert rule._build_unknown.__func__ is twin._build_unknown.__func__
    assert built > 100


def test_rules_differing_only_in_their_defaults_keep_their_own_builders():
    url_map = QuartMap()
    plain = SharedBuilderRule("/x/<name>", endpoint="plain")
    defaulted = SharedBuilderRule("/x/<name>", endpoint="defaulted", defaults={"name": "d"})
    other_default = SharedBuilderRule("/x/<name>", endpoint="other", defaults={"name": "e"})
    with_extra = SharedBuilderRule("/x/<name>", endpoint="extra", defaults={"kind": "k"})
    for rule in (plain, defaulted, other_default, with_extra):
        url_map.add(rule)
    assert plain.build({"name": "n"}) == ("", "/x/n")
    assert defaulted.build({}) == ("", "/x/d")
    assert other_default.build({}) == ("", "/x/e")
    assert with_extra.build({"name": "n", "kind": "k"}) == ("", "/x/n")
    assert plain.build({"name": "n", "kind": "k"}) == ("", "/x/n?kind=k")
