"""Fixtures of the dashboard's tests: people with passwords, a browser-like
client that signs in through the form and keeps its cookies, and a space
with a project, a member agent and a viewer."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
import sqlalchemy as sa

from buildmax.passwords import hash_password
from buildmax.spaces import put_member
from buildmax.tables import principals
from buildmax.testing import PrincipalHandle, SpaceHandle, call

PASSWORD = "correct horse battery staple"
_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def csrf_of(html: str) -> str:
    """The CSRF token a page's forms carry."""
    found = _CSRF.search(html)
    assert found, "the page has no form with a CSRF token"
    return found.group(1)


class Browser:
    """A test client used as a browser would: cookies kept, forms posted
    with the token the page gave."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.client = app.test_client()
        self.csrf = ""

    async def get(self, path: str, **kw: Any) -> Any:
        """``GET path`` accepting HTML."""
        headers = {"Accept": "text/html", **kw.pop("headers", {})}
        return await self.client.get(path, headers=headers, **kw)

    async def text(self, path: str, status: int = 200) -> str:
        """The HTML of a page that must answer ``status``."""
        answer = await self.get(path)
        body = await answer.get_data(as_text=True)
        assert answer.status_code == status, (path, answer.status_code, body[:2000])
        return str(body)

    async def post(self, path: str, form: dict[str, str], **kw: Any) -> Any:
        """Post a form (the CSRF token is the caller's to add)."""
        return await self.client.post(path, form=form, **kw)

    async def sign_in(self, name: str, password: str = PASSWORD, next: str = "/ui/") -> Any:
        """Sign in through the form; the answer of the post."""
        page = await self.text(f"/ui/sign-in?next={next}")
        answer = await self.post(
            "/ui/sign-in",
            {"csrf": csrf_of(page), "name": name, "password": password, "next": next},
        )
        if answer.status_code == 303:
            self.csrf = csrf_of(await self.text("/ui/"))
        return answer

    def cookie(self, name: str) -> Any:
        """The stored cookie ``name`` (or ``None``)."""
        for cookie in self.client.cookie_jar:
            if cookie.name == name:
                return cookie
        return None


@dataclass
class Team:
    """A space with a project; its owner and viewer are people with
    passwords, its agent a member."""

    space: SpaceHandle
    owner: PrincipalHandle
    agent: PrincipalHandle
    viewer: PrincipalHandle
    project: str

    @property
    def base(self) -> str:
        """The space's API path."""
        return f"/v1/spaces/{self.space.id}"


async def set_password(app: Any, who: PrincipalHandle, password: str = PASSWORD) -> None:
    """Give a person a password, as ``buildmax principal`` would."""
    digest = await hash_password(password)
    async with app.db.write() as tx:
        await tx.execute(
            sa.update(principals).where(principals.c.id == who.pk).values(password_hash=digest)
        )


async def signed_in(browser: Callable[[], Browser], who: PrincipalHandle) -> Browser:
    """A fresh browser signed in as ``who``."""
    b = browser()
    assert (await b.sign_in(who.name)).status_code == 303
    return b


async def make_task(client: Any, team: Team, title: str = "some work", **extra: Any) -> Any:
    """A task of the team's project, made by its owner over the API."""
    body = {"project": "main", "title": title, **extra}
    return await call(client, "POST", f"{team.base}/tasks", team.owner, json=body, expect=201)


async def ask(client: Any, team: Team, task_id: str, question: str, options: list[str]) -> Any:
    """A decision the team's agent asks on ``task_id``."""
    body = {"question": question, "options": options}
    return await call(
        client, "POST", f"{team.base}/tasks/{task_id}/decisions", team.agent, json=body, expect=201
    )


async def pending_states(client: Any, team: Team) -> list[str]:
    """The states of the decisions the API lists as pending (by default)."""
    shown = await call(client, "GET", f"{team.base}/decisions", team.owner, expect=200)
    return [d["state"] for d in shown["items"]]


@pytest.fixture
def browser(app: Any) -> Callable[[], Browser]:
    """``browser()``: a fresh browser (no cookies)."""
    return lambda: Browser(app)


@pytest.fixture
def person(
    app: Any, make_principal: Callable[..., Awaitable[PrincipalHandle]]
) -> Callable[..., Awaitable[PrincipalHandle]]:
    """``await person(name=None)``: a human with :data:`PASSWORD`."""

    async def make(name: str | None = None) -> PrincipalHandle:
        who = await make_principal("human", name=name)
        await set_password(app, who)
        return who

    return make


@pytest.fixture
async def team(
    app: Any,
    client: Any,
    person: Callable[..., Awaitable[PrincipalHandle]],
    make_principal: Callable[..., Awaitable[PrincipalHandle]],
    make_space: Callable[..., Awaitable[SpaceHandle]],
) -> Team:
    owner = await person()
    viewer = await person()
    agent = await make_principal("agent")
    space = await make_space(owner)
    async with app.db.write() as tx:
        now = app.clock.now_ms()
        await put_member(tx, space.pk, agent.pk, "member", now)
        await put_member(tx, space.pk, viewer.pk, "viewer", now)
    project = await call(
        client, "POST", f"/v1/spaces/{space.id}/projects", owner, json={"name": "main"}, expect=201
    )
    return Team(space, owner, agent, viewer, project["id"])
