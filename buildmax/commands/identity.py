"""Commands that talk to a running server: login, principals, tokens, spaces."""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import click

from ..client import (
    DEFAULT_URL,
    URL_ENV,
    BuildMaxError,
    Client,
    IncompleteDownload,
    LoginFileError,
    Unreachable,
    save_login,
    sign_in,
)
from ..roles import PRINCIPAL_KINDS, SPACE_ROLES, SYSTEM_ROLES

PRINCIPAL_COLUMNS = ("id", "name", "kind", "system_role", "display_name", "disabled_at")
TOKEN_COLUMNS = ("id", "name", "principal_id", "origin", "created_at", "expires_at", "revoked_at")
SPACE_COLUMNS = ("id", "slug", "name", "role")
MEMBER_COLUMNS = ("principal_id", "name", "kind", "role")

SECRET_WARNING = "This is the only time the token is shown: store it now."


class CommandError(click.ClickException):
    """A one-line ``error: ...`` on stderr and exit code 1."""

    def show(self, file: Any = None) -> None:
        """Print the message the way every remote command reports failure."""
        click.echo(f"error: {self.format_message()}", err=True, file=file)


@contextlib.contextmanager
def reporting_errors() -> Iterator[None]:
    """Turn client failures into :class:`CommandError`."""
    try:
        yield
    except (BuildMaxError, IncompleteDownload, LoginFileError) as exc:
        raise CommandError(str(exc)) from None
    except Unreachable as exc:
        raise CommandError(f"{exc} (is the server running? set --url or {URL_ENV})") from None


# -- output --------------------------------------------------------------------


def _cell(value: Any) -> str:
    if value is None or value == "":
        return "-"
    return str(value)


def render_table(items: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """Aligned columns with a header row; ``-`` for empty cells."""
    rows = [list(columns)] + [[_cell(item.get(c)) for c in columns] for item in items]
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def _text(value: Any) -> Any:
    """A list or nested value as one cell."""
    if isinstance(value, list):
        return ", ".join(str(v.get("id", v)) if isinstance(v, dict) else str(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"))
    return value


def flat_fields(item: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``item`` with its nested objects also under dotted keys
    (``review.decision``); lists and objects as one line of text."""
    flat: dict[str, Any] = {}
    for key, value in item.items():
        flat[f"{prefix}{key}"] = _text(value)
        if isinstance(value, dict):
            flat.update(flat_fields(value, f"{prefix}{key}."))
    return flat


def render_record(item: dict[str, Any], fields: Sequence[str]) -> str:
    """One ``field: value`` line per field."""
    width = max(len(field) for field in fields)
    return "\n".join(f"{field.ljust(width)}  {_cell(item.get(field))}" for field in fields)


@dataclass
class Remote:
    """What a remote command works with: a connected client and an output mode."""

    client: Client
    as_json: bool

    def show(self, item: dict[str, Any], fields: Sequence[str]) -> None:
        """Print one object (nested fields as ``outer.inner``, text of several
        lines indented under its first)."""
        if self.as_json:
            click.echo(json.dumps(item, indent=2))
            return
        indent = "\n" + " " * (max(len(field) for field in fields) + 2)
        flat = {
            key: value.replace("\n", indent) if isinstance(value, str) else value
            for key, value in flat_fields(item).items()
        }
        click.echo(render_record(flat, fields))

    def show_all(self, items: list[dict[str, Any]], columns: Sequence[str]) -> None:
        """Print a list of objects (nested fields as ``outer.inner``)."""
        if self.as_json:
            click.echo(json.dumps(items, indent=2))
        else:
            click.echo(render_table([flat_fields(item) for item in items], columns))

    def done(self, message: str) -> None:
        """Report a change that has no body to show."""
        click.echo(json.dumps({"ok": True}) if self.as_json else message)


url_option = click.option(
    "--url",
    metavar="URL",
    help=f"Server URL [default: ${URL_ENV}, else the login file, else {DEFAULT_URL}].",
)
token_option = click.option(
    "--token",
    metavar="TOKEN",
    help="API token [default: $BUILDMAX_TOKEN, else the login file's token for its URL].",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
#: The variable naming the space remote commands of plugins work in.
SPACE_ENV = "BUILDMAX_SPACE"
space_option = click.option(
    "--space",
    envvar=SPACE_ENV,
    required=True,
    metavar="SPACE",
    help=f"The space to work in (id or slug) [default: ${SPACE_ENV}].",
)


def connected(command: Callable[..., None]) -> Callable[..., None]:
    """Give ``command`` --url, --token and --json and call it with a :class:`Remote`."""

    @url_option
    @token_option
    @json_option
    @functools.wraps(command)
    def run(url: str | None, token: str | None, as_json: bool, **arguments: Any) -> None:
        with reporting_errors(), Client(url, token) as client:
            if not client.token:
                raise CommandError(
                    f"no token for {client.url}: run `buildmax login`, "
                    "or pass --token or set BUILDMAX_TOKEN"
                )
            command(Remote(client, as_json), **arguments)

    return run


# -- login ---------------------------------------------------------------------


def _describe(me: dict[str, Any]) -> str:
    role = f", system role {me['system_role']}" if me.get("system_role") else ""
    return f"{me['name']} ({me['kind']} {me['id']}{role})"


@click.command()
@click.option(
    "--url",
    envvar=URL_ENV,
    default=DEFAULT_URL,
    show_default=True,
    metavar="URL",
    help=f"Server URL (also ${URL_ENV}).",
)
@click.option("--token", metavar="TOKEN", help="Save this API token instead of signing in.")
@click.option("--name", metavar="NAME", help="Your principal name (asked when missing).")
@json_option
def login(url: str, token: str | None, name: str | None, as_json: bool) -> None:
    """Sign in to a server and remember it for the other commands.

    Without --token, asks for your name and password and signs in as a
    human (a session token). The token is checked, then saved with the URL
    in ~/.config/buildmax/login.json ($XDG_CONFIG_HOME), readable only by you.
    """
    with reporting_errors():
        if token is None:
            name = name or click.prompt("Name")
            password = click.prompt("Password", hide_input=True)
            token = str(sign_in(url, name, password)["token"])
        with Client(url, token) as client:
            me = client.me()
        path = save_login(client.url, token)
    if as_json:
        click.echo(json.dumps(me, indent=2))
        return
    click.echo(f"Logged in to {client.url} as {_describe(me)}.")
    click.echo(f"Saved to {path}.")


# -- principals ----------------------------------------------------------------


@click.group("principal")
def principal_group() -> None:
    """Manage principals: the humans, agents and services that act."""


@principal_group.command("create")
@click.argument("name")
@click.option(
    "--kind",
    type=click.Choice(PRINCIPAL_KINDS),
    default="agent",
    show_default=True,
    help="What the principal is.",
)
@click.option("--display-name", default="", help="A name for people to read.")
@click.option("--system-role", type=click.Choice(SYSTEM_ROLES), help="A system-wide role.")
@click.option(
    "--set-password", is_flag=True, help="Ask for a password (humans only; 12+ characters)."
)
@connected
def principal_create(
    remote: Remote,
    name: str,
    kind: str,
    display_name: str,
    system_role: str | None,
    set_password: bool,
) -> None:
    """Create principal NAME (admins).

    Agents and services authenticate with tokens only: follow with
    `buildmax token create --principal NAME`.
    """
    password = (
        click.prompt("Password", hide_input=True, confirmation_prompt=True)
        if set_password
        else None
    )
    body = remote.client.create_principal(kind, name, display_name, system_role, password)
    remote.show(body, PRINCIPAL_COLUMNS)


@principal_group.command("list")
@connected
def principal_list(remote: Remote) -> None:
    """List every principal (admins and operators)."""
    remote.show_all(remote.client.list_principals(), PRINCIPAL_COLUMNS)


@principal_group.command("disable")
@click.argument("ref", metavar="PRINCIPAL")
@connected
def principal_disable(remote: Remote, ref: str) -> None:
    """Disable PRINCIPAL (id or name): all its tokens stop working at once (admins)."""
    remote.show(remote.client.update_principal(ref, disabled=True), PRINCIPAL_COLUMNS)


@principal_group.command("enable")
@click.argument("ref", metavar="PRINCIPAL")
@connected
def principal_enable(remote: Remote, ref: str) -> None:
    """Enable PRINCIPAL (id or name) again; its unrevoked tokens work again (admins)."""
    remote.show(remote.client.update_principal(ref, disabled=False), PRINCIPAL_COLUMNS)


# -- tokens --------------------------------------------------------------------


@click.group("token")
def token_group() -> None:
    """Manage API tokens. A token's secret is shown once, when it is made."""


def _show_secret(remote: Remote, body: dict[str, Any]) -> None:
    remote.show(body, (*TOKEN_COLUMNS, "token"))
    click.echo(SECRET_WARNING, err=True)


@token_group.command("create")
@click.option("--name", default="", help="A label to recognise the token by.")
@click.option(
    "--principal",
    "principal_ref",
    metavar="PRINCIPAL",
    help="Make it for this principal (id or name; admins). Default: yourself.",
)
@click.option(
    "--expires-in",
    type=int,
    metavar="SECONDS",
    help="Lifetime in seconds. Default: until revoked.",
)
@click.option(
    "--scope",
    type=click.Choice(["metrics"]),
    help="metrics: the token reads /metrics and nothing else (for a Prometheus scraper; "
    "system admins and operators).",
)
@connected
def token_create(
    remote: Remote,
    name: str,
    principal_ref: str | None,
    expires_in: int | None,
    scope: str | None,
) -> None:
    """Create a token and print its secret (only this once)."""
    _show_secret(remote, remote.client.create_token(name, principal_ref, expires_in, scope))


@token_group.command("list")
@click.option(
    "--principal",
    "principal_ref",
    metavar="PRINCIPAL",
    help="List this principal's tokens (admins). Default: yours.",
)
@connected
def token_list(remote: Remote, principal_ref: str | None) -> None:
    """List tokens, newest first; revoked and expired ones are included."""
    remote.show_all(remote.client.list_tokens(principal_ref), TOKEN_COLUMNS)


@token_group.command("revoke")
@click.argument("token_id", metavar="TOKEN_ID")
@connected
def token_revoke(remote: Remote, token_id: str) -> None:
    """Revoke TOKEN_ID (tk_...): it stops working on the next request."""
    remote.client.revoke_token(token_id)
    remote.done(f"Revoked {token_id}.")


@token_group.command("rotate")
@click.argument("token_id", metavar="TOKEN_ID")
@connected
def token_rotate(remote: Remote, token_id: str) -> None:
    """Replace TOKEN_ID with a twin that has a new secret; the old one stops working."""
    _show_secret(remote, remote.client.rotate_token(token_id))


# -- spaces --------------------------------------------------------------------


@click.group("space")
def space_group() -> None:
    """Manage spaces and who belongs to them."""


@space_group.command("create")
@click.argument("slug")
@click.option("--name", help="Display name. Default: the slug.")
@click.option("--owner", metavar="PRINCIPAL", help="Owner (id or name). Default: you.")
@connected
def space_create(remote: Remote, slug: str, name: str | None, owner: str | None) -> None:
    """Create space SLUG (admins and operators); the slug is permanent."""
    remote.show(remote.client.create_space(slug, name, owner), SPACE_COLUMNS)


@space_group.command("list")
@connected
def space_list(remote: Remote) -> None:
    """List your spaces (admins and operators: all) with your role in each."""
    remote.show_all(remote.client.list_spaces(), SPACE_COLUMNS)


@space_group.group("member")
def member_group() -> None:
    """Manage a space's members."""


@member_group.command("add")
@click.argument("space_ref", metavar="SPACE")
@click.argument("principal_ref", metavar="PRINCIPAL")
@click.option(
    "--role",
    type=click.Choice(SPACE_ROLES),
    default="member",
    show_default=True,
    help="The member's role; only owners grant owner.",
)
@connected
def member_add(remote: Remote, space_ref: str, principal_ref: str, role: str) -> None:
    """Add PRINCIPAL to SPACE, or change its role (space admins)."""
    remote.show(remote.client.put_member(space_ref, principal_ref, role), MEMBER_COLUMNS)


@member_group.command("remove")
@click.argument("space_ref", metavar="SPACE")
@click.argument("principal_ref", metavar="PRINCIPAL")
@connected
def member_remove(remote: Remote, space_ref: str, principal_ref: str) -> None:
    """Remove PRINCIPAL from SPACE (space admins; anyone may leave)."""
    remote.client.remove_member(space_ref, principal_ref)
    remote.done(f"Removed {principal_ref} from {space_ref}.")


@member_group.command("list")
@click.argument("space_ref", metavar="SPACE")
@connected
def member_list(remote: Remote, space_ref: str) -> None:
    """List SPACE's members and their roles."""
    remote.show_all(remote.client.list_members(space_ref), MEMBER_COLUMNS)


def register(cli: click.Group) -> None:
    """Add these commands to the root group."""
    for command in (login, principal_group, token_group, space_group):
        cli.add_command(command)
