"""``buildmax mcp config`` and ``buildmax mcp stdio``: client configuration
that refers to the token only through ``BUILDMAX_TOKEN``, and a bridge that
says clearly what it lacks."""

from __future__ import annotations

import json
import tomllib

import pytest
from buildmax_mcp.snippets import CLIENTS
from click.testing import CliRunner

from buildmax.cli import _register_commands, cli

from .conftest import run_bridge

pytestmark = pytest.mark.engine_independent

SECRET = "bm_this_must_never_be_printed"


@pytest.fixture(scope="module", autouse=True)
def _commands() -> None:
    _register_commands()


@pytest.mark.parametrize("client", sorted(CLIENTS))
@pytest.mark.parametrize("transport", ["http", "stdio"])
def test_each_client_s_configuration_refers_to_the_variable_never_the_token(
    client: str, transport: str
) -> None:
    result = CliRunner().invoke(
        cli,
        [
            "mcp",
            "config",
            "--client",
            client,
            "--transport",
            transport,
            "--url",
            "https://bm.test/",
        ],
        env={"BUILDMAX_TOKEN": SECRET},
    )
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert SECRET not in result.output
    assert "BUILDMAX_TOKEN" in text
    parsed = tomllib.loads(text) if client == "codex" else json.loads(text)
    (server,) = (
        parsed.get("mcp_servers") or parsed.get("mcpServers") or parsed["servers"]
    ).values()
    if transport == "http":
        assert "https://bm.test/mcp" in json.dumps(server)
    else:
        assert (server["command"], server["args"]) == (
            "buildmax",
            ["mcp", "stdio", "--url", "https://bm.test"],
        )
        assert "--token" not in server["args"]


def test_an_unknown_client_is_refused_naming_the_known_ones() -> None:
    result = CliRunner().invoke(cli, ["mcp", "config", "--client", "emacs"])
    assert result.exit_code == 2
    assert "claude-code" in result.output and "codex" in result.output


def test_the_bridge_without_a_token_says_so_and_exits_1(tmp_path) -> None:
    """No BUILDMAX_TOKEN and no login file: an error on stderr, nothing on
    stdout (where an MCP client reads messages)."""
    done = run_bridge("http://127.0.0.1:9", tmp_path, HOME=str(tmp_path))
    assert done.returncode == 1
    assert done.stdout == ""
    assert "error: no token for http://127.0.0.1:9" in done.stderr
    assert "BUILDMAX_TOKEN" in done.stderr


def test_the_bridge_to_no_server_says_so_and_exits_1(tmp_path) -> None:
    done = run_bridge("http://127.0.0.1:9", tmp_path, BUILDMAX_TOKEN=SECRET)
    assert done.returncode == 1
    assert done.stdout == ""
    assert "error: http://127.0.0.1:9/mcp cannot be reached:" in done.stderr
    assert "Traceback" not in done.stderr
    assert SECRET not in done.stderr
