"""``buildmax login|principal|token|space`` against a live server.

Each command runs in a worker thread (the live server shares the test's
event loop); results are checked through the client, independently of the
command's own output.
"""

from __future__ import annotations

import asyncio
import json
import stat
from collections.abc import Awaitable, Callable
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result

from buildmax.cli import _register_commands, cli
from buildmax.client import TOKEN_ENV, URL_ENV, Client, Unauthenticated, login_path
from buildmax.commands.identity import SECRET_WARNING
from buildmax.testing import free_port

Invoke = Callable[..., Awaitable[Result]]


@pytest.fixture(scope="module")
def buildmax_cli() -> click.Group:
    """The root group with every command registered (once per module)."""
    _register_commands()
    return cli


@pytest.fixture(autouse=True)
def isolated_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """No BUILDMAX_URL/TOKEN from the outside; the login file lives in tmp_path."""
    monkeypatch.delenv(URL_ENV, raising=False)
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


@pytest.fixture
def run(buildmax_cli: click.Group) -> Invoke:
    """``await run("space", "list", ..., input=None)``: the command's :class:`Result`."""

    async def invoke(*args: str, input: str | None = None) -> Result:
        runner = CliRunner()
        return await asyncio.to_thread(
            runner.invoke, buildmax_cli, list(args), input=input, catch_exceptions=False
        )

    return invoke


def as_admin(url: str, admin: Any) -> list[str]:
    return ["--url", url, "--token", admin.token]


def in_thread(url: str, token: str, call: Callable[[Client], Any]) -> Awaitable[Any]:
    """Run ``call`` with a client of ``url`` in a worker thread."""

    def work() -> Any:
        with Client(url, token) as bmx:
            return call(bmx)

    return asyncio.to_thread(work)


async def works(url: str, token: str) -> bool:
    """Whether ``token`` authenticates at ``url``."""
    try:
        await in_thread(url, token, lambda bmx: bmx.me())
    except Unauthenticated:
        return False
    return True


# -- login ---------------------------------------------------------------------


async def test_login_with_a_token_saves_a_private_file_that_later_commands_use(
    run: Invoke, live_server: str, admin: Any
) -> None:
    result = await run("login", "--url", live_server, "--token", admin.token)
    assert result.exit_code == 0, result.output
    assert f"Logged in to {live_server} as admin (human {admin.id}, system role admin)." in (
        result.stdout
    )
    path = login_path()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text()) == {"url": live_server, "token": admin.token}

    created = await run("space", "create", "from-login-file")
    assert created.exit_code == 0, created.output
    space = await in_thread(live_server, admin.token, lambda bmx: bmx.get_space("from-login-file"))
    assert space["role"] == "owner"


async def test_login_signs_in_with_name_and_password(
    run: Invoke, live_server: str, admin: Any
) -> None:
    await in_thread(
        live_server,
        admin.token,
        lambda bmx: bmx.create_principal("human", "alice", password="correct horse battery"),
    )
    result = await run("login", "--url", live_server, input="alice\ncorrect horse battery\n")
    assert result.exit_code == 0, result.output
    assert "as alice (human" in result.stdout
    assert "correct horse battery" not in result.output
    saved = json.loads(login_path().read_text())
    assert saved["token"] != admin.token
    me = await in_thread(live_server, saved["token"], lambda bmx: bmx.me())
    assert me["name"] == "alice"


async def test_a_failed_login_says_why_and_saves_nothing(
    run: Invoke, live_server: str, admin: Any
) -> None:
    result = await run("login", "--url", live_server, "--name", "admin", input="wrong password\n")
    assert result.exit_code == 1
    assert result.stderr == "error: 401 unauthenticated: wrong name or password\n"
    assert not login_path().exists()


# -- principals ----------------------------------------------------------------


async def test_principal_create_list_disable_enable(
    run: Invoke, live_server: str, admin: Any
) -> None:
    created = await run(
        "principal", "create", "builder-bot", "--json", *as_admin(live_server, admin)
    )
    assert created.exit_code == 0, created.output
    bot = json.loads(created.stdout)
    assert (bot["name"], bot["kind"], bot["disabled_at"]) == ("builder-bot", "agent", None)
    issued = await run(
        "token", "create", "--principal", "builder-bot", "--json", *as_admin(live_server, admin)
    )
    secret = json.loads(issued.stdout)["token"]
    assert await works(live_server, secret)

    disabled = await run("principal", "disable", "builder-bot", *as_admin(live_server, admin))
    assert disabled.exit_code == 0, disabled.output
    assert not await works(live_server, secret)
    listed = await run("principal", "list", "--json", *as_admin(live_server, admin))
    by_name = {p["name"]: p for p in json.loads(listed.stdout)}
    assert by_name["builder-bot"]["disabled_at"] is not None

    enabled = await run("principal", "enable", bot["id"], *as_admin(live_server, admin))
    assert enabled.exit_code == 0, enabled.output
    assert await works(live_server, secret)


async def test_principal_list_prints_a_table(run: Invoke, live_server: str, admin: Any) -> None:
    result = await run("principal", "list", *as_admin(live_server, admin))
    header, row = result.stdout.splitlines()
    assert header.split() == ["id", "name", "kind", "system_role", "display_name", "disabled_at"]
    assert row.split() == [admin.id, "admin", "human", "admin", "-", "-"]


async def test_a_human_gets_a_password_from_a_prompt(
    run: Invoke, live_server: str, admin: Any
) -> None:
    password = "a long enough password"
    result = await run(
        "principal",
        "create",
        "bob",
        "--kind",
        "human",
        "--set-password",
        *as_admin(live_server, admin),
        input=f"{password}\n{password}\n",
    )
    assert result.exit_code == 0, result.output
    login = await run("login", "--url", live_server, "--name", "bob", input=f"{password}\n")
    assert login.exit_code == 0, login.output


# -- tokens --------------------------------------------------------------------


async def test_token_create_prints_a_working_secret_once_and_revoke_ends_it(
    run: Invoke, live_server: str, admin: Any
) -> None:
    result = await run("token", "create", "--name", "ci", *as_admin(live_server, admin))
    assert result.exit_code == 0, result.output
    fields = dict(line.split(maxsplit=1) for line in result.stdout.splitlines())
    assert fields["name"] == "ci" and fields["token"].startswith("bmx_")
    assert SECRET_WARNING in result.stderr
    assert await works(live_server, fields["token"])

    listed = await run("token", "list", *as_admin(live_server, admin))
    assert fields["id"] in listed.stdout and fields["token"] not in listed.stdout

    revoked = await run("token", "revoke", fields["id"], *as_admin(live_server, admin))
    assert (revoked.exit_code, revoked.stdout) == (0, f"Revoked {fields['id']}.\n")
    assert not await works(live_server, fields["token"])
    tokens = await in_thread(live_server, admin.token, lambda bmx: bmx.list_tokens())
    assert next(t for t in tokens if t["id"] == fields["id"])["revoked_at"] is not None


async def test_token_rotate_replaces_the_secret(run: Invoke, live_server: str, admin: Any) -> None:
    created = await run("token", "create", "--json", *as_admin(live_server, admin))
    old = json.loads(created.stdout)
    rotated = await run("token", "rotate", old["id"], "--json", *as_admin(live_server, admin))
    assert rotated.exit_code == 0, rotated.output
    new = json.loads(rotated.stdout)
    assert SECRET_WARNING in rotated.stderr
    assert new["token"] != old["token"]
    assert not await works(live_server, old["token"])
    assert await works(live_server, new["token"])


# -- spaces --------------------------------------------------------------------


async def test_space_create_list_and_members(
    run: Invoke, live_server: str, admin: Any, make_principal: Any
) -> None:
    agent = await make_principal("agent")
    created = await run(
        "space", "create", "web", "--name", "Web shop", *as_admin(live_server, admin)
    )
    assert created.exit_code == 0, created.output
    listed = await run("space", "list", *as_admin(live_server, admin))
    assert listed.stdout.splitlines()[1].split()[1:] == ["web", "Web", "shop", "owner"]

    added = await run(
        "space",
        "member",
        "add",
        "web",
        agent.name,
        "--role",
        "admin",
        *as_admin(live_server, admin),
    )
    assert added.exit_code == 0, added.output
    members = await in_thread(live_server, admin.token, lambda bmx: bmx.list_members("web"))
    assert {m["name"]: m["role"] for m in members} == {"admin": "owner", agent.name: "admin"}

    removed = await run("space", "member", "remove", "web", agent.id, *as_admin(live_server, admin))
    assert removed.exit_code == 0, removed.output
    members = await in_thread(live_server, admin.token, lambda bmx: bmx.list_members("web"))
    assert [m["name"] for m in members] == ["admin"]


async def test_member_add_defaults_to_member(
    run: Invoke, live_server: str, admin: Any, make_principal: Any, make_space: Any
) -> None:
    agent = await make_principal("agent")
    space = await make_space(admin)
    result = await run(
        "space", "member", "add", space.slug, agent.id, "--json", *as_admin(live_server, admin)
    )
    assert json.loads(result.stdout)["role"] == "member"


# -- failures ------------------------------------------------------------------


async def test_a_server_error_is_one_line(run: Invoke, live_server: str, admin: Any) -> None:
    result = await run(
        "space", "member", "add", "no-such-space", "admin", *as_admin(live_server, admin)
    )
    assert result.exit_code == 1
    assert result.stderr == "error: 404 not-found: no such space\n"


async def test_a_validation_error_names_the_field(
    run: Invoke, live_server: str, admin: Any
) -> None:
    result = await run("space", "create", "Not A Slug", *as_admin(live_server, admin))
    assert result.exit_code == 1
    assert result.stderr.startswith("error: 422 validation-error: invalid fields: slug (slug: ")
    assert len(result.stderr.splitlines()) == 1


async def test_an_unreachable_server_is_named(run: Invoke, live_server: str) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = await run("space", "list", "--url", url, "--token", "bmx_x")
    assert result.exit_code == 1
    assert result.stderr.startswith(f"error: cannot reach BuildMax at {url}: ")
    assert "Traceback" not in result.output


async def test_without_a_token_the_command_says_how_to_log_in(
    run: Invoke, live_server: str
) -> None:
    result = await run("space", "list", "--url", live_server)
    assert result.exit_code == 1
    assert "run `buildmax login`" in result.stderr


async def test_help_describes_the_commands(run: Invoke) -> None:
    top = await run("--help")
    for name in ("login", "principal", "token", "space"):
        assert f"\n  {name} " in top.stdout
    add = await run("space", "member", "add", "--help")
    assert "Add PRINCIPAL to SPACE" in add.stdout
    assert "--role [viewer|member|admin|owner]" in add.stdout
    assert "default: member" in add.stdout
    assert "--url URL" in add.stdout and "--token TOKEN" in add.stdout
