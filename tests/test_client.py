"""``buildmax.client``: the kernel's routes over real HTTP, and the retry rules.

The sync client runs in a worker thread because the live server shares the
test's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import stat
import uuid
from typing import Any

import httpx
import pytest

from buildmax.client import (
    DEFAULT_URL,
    TOKEN_ENV,
    URL_ENV,
    AsyncClient,
    BuildMaxError,
    Client,
    Conflict,
    DiskReserveReached,
    Forbidden,
    ForeignOrigin,
    IdempotencyInProgress,
    IdempotencyKeyReused,
    NotFound,
    PayloadTooLarge,
    Redirected,
    ServerError,
    TokenScopeRefused,
    TooManyRequests,
    Unauthenticated,
    Unreachable,
    ValidationError,
    load_login,
    login_path,
    resolve,
    save_login,
    sign_in,
)
from buildmax.testing import free_port

FAKE_URL = "http://bmx.test"


@pytest.fixture(autouse=True)
def isolated_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """No BUILDMAX_URL/TOKEN from the outside; the login file lives in tmp_path."""
    monkeypatch.delenv(URL_ENV, raising=False)
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


def problem(status: int, slug: str, detail: str, **extra: Any) -> httpx.Response:
    """A problem+json answer as the server writes it."""
    body = {
        "type": f"urn:buildmax:problem:{slug}",
        "title": slug,
        "status": status,
        "detail": detail,
        **extra,
    }
    return httpx.Response(
        status, content=json.dumps(body), headers={"content-type": "application/problem+json"}
    )


class Recorder:
    """A fake server: answers from a script and keeps every request."""

    def __init__(self, *answers: httpx.Response | Exception) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []
        self.keys: list[str | None] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        self.keys.append(request.headers.get("Idempotency-Key"))
        answer = self.answers[min(len(self.requests), len(self.answers)) - 1]
        if isinstance(answer, Exception):
            raise answer
        return answer

    def client(self, **options: Any) -> Client:
        return Client(
            FAKE_URL, "bmx_fake", backoff=0, transport=httpx.MockTransport(self), **options
        )


# -- retries and errors, against a fake server ---------------------------------


@pytest.mark.engine_independent
def test_a_retry_after_503_reuses_the_idempotency_key_and_body() -> None:
    server = Recorder(
        problem(503, "service-unavailable", "restarting"),
        httpx.Response(201, json={"id": "sp_1", "slug": "web"}),
    )
    with server.client() as bmx:
        assert bmx.create_space("web") == {"id": "sp_1", "slug": "web"}
    assert len(server.requests) == 2
    first, second = server.keys
    assert first is not None and first == second
    assert uuid.UUID(first).version == 4
    assert server.requests[0].content == server.requests[1].content == b'{"slug":"web"}'


@pytest.mark.engine_independent
@pytest.mark.parametrize("status", [400, 401, 404, 409, 422, 429])
def test_a_4xx_is_never_retried(status: int) -> None:
    server = Recorder(problem(status, "some-problem", "no"), httpx.Response(201, json={}))
    with server.client() as bmx, pytest.raises(BuildMaxError) as caught:
        bmx.create_space("web")
    assert caught.value.status == status
    assert len(server.requests) == 1


@pytest.mark.engine_independent
def test_connection_errors_are_retried_a_bounded_number_of_times_with_one_key() -> None:
    server = Recorder(httpx.ConnectError("connection refused"))
    with server.client(retries=2) as bmx, pytest.raises(Unreachable) as caught:
        bmx.create_token(name="ci")
    assert len(server.requests) == 3
    assert len(set(server.keys)) == 1
    assert FAKE_URL in str(caught.value)


@pytest.mark.engine_independent
def test_timeouts_are_retried_then_the_answer_is_returned() -> None:
    server = Recorder(httpx.ReadTimeout("slow"), httpx.Response(200, json={"name": "admin"}))
    with server.client() as bmx:
        assert bmx.me() == {"name": "admin"}
    assert len(server.requests) == 2


@pytest.mark.engine_independent
def test_a_502_that_persists_becomes_a_server_error_after_the_last_retry() -> None:
    server = Recorder(httpx.Response(502, text="<html>Bad Gateway</html>"))
    with server.client(retries=1) as bmx, pytest.raises(ServerError) as caught:
        bmx.list_spaces()
    assert len(server.requests) == 2
    assert (caught.value.status, caught.value.slug) == (502, "http-502")
    assert caught.value.detail == "<html>Bad Gateway</html>"


@pytest.mark.engine_independent
def test_reads_carry_no_idempotency_key_and_a_given_key_is_sent_unchanged() -> None:
    server = Recorder(httpx.Response(200, json={"ok": True}))
    with server.client() as bmx:
        bmx.me()
        bmx.request("POST", "/v1/spaces", json={"slug": "web"}, idempotency_key="my-key")
    assert server.keys == [None, "my-key"]
    assert server.requests[0].headers["Authorization"] == "Bearer bmx_fake"


@pytest.mark.engine_independent
@pytest.mark.parametrize(
    ("status", "slug", "expected"),
    [
        (401, "unauthenticated", Unauthenticated),
        (403, "forbidden", Forbidden),
        (403, "token-scope-refused", TokenScopeRefused),
        (404, "not-found", NotFound),
        (409, "last-admin", Conflict),
        (409, "idempotency-in-progress", IdempotencyInProgress),
        (413, "payload-too-large", PayloadTooLarge),
        (422, "validation-error", ValidationError),
        (422, "idempotency-key-reused", IdempotencyKeyReused),
        (429, "too-many-requests", TooManyRequests),
        (500, "internal-error", ServerError),
        (507, "disk-reserve-reached", DiskReserveReached),
    ],
)
def test_problems_map_to_typed_exceptions(
    status: int, slug: str, expected: type[BuildMaxError]
) -> None:
    server = Recorder(problem(status, slug, "because"))
    with server.client(retries=0) as bmx, pytest.raises(BuildMaxError) as caught:
        bmx.me()
    assert type(caught.value) is expected
    assert (caught.value.status, caught.value.slug, caught.value.detail) == (
        status,
        slug,
        "because",
    )
    assert str(caught.value) == f"{status} {slug}: because"


@pytest.mark.engine_independent
def test_a_plain_error_answer_still_raises_buildmax_error() -> None:
    server = Recorder(httpx.Response(418, text="I'm a teapot"))
    with server.client() as bmx, pytest.raises(BuildMaxError) as caught:
        bmx.me()
    assert type(caught.value) is BuildMaxError
    assert (caught.value.slug, caught.value.detail) == ("http-418", "I'm a teapot")


@pytest.mark.engine_independent
def test_paginate_passes_the_cursor_back_and_keeps_the_callers_params() -> None:
    server = Recorder(
        httpx.Response(200, json={"items": [{"n": 1}, {"n": 2}], "next_cursor": "abc"}),
        httpx.Response(200, json={"items": [{"n": 3}], "next_cursor": None}),
    )
    with server.client() as bmx:
        assert [i["n"] for i in bmx.paginate("/v1/things", {"limit": 2})] == [1, 2, 3]
    assert [dict(r.url.params) for r in server.requests] == [
        {"limit": "2"},
        {"limit": "2", "cursor": "abc"},
    ]


# -- the login file and where the URL and token come from -----------------------


@pytest.mark.engine_independent
def test_the_login_file_is_private_and_read_back(tmp_path: Any) -> None:
    path = save_login("http://example.test:8420/", "bmx_secret")
    assert path == tmp_path / "config" / "buildmax" / "login.json" == login_path()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text()) == {
        "url": "http://example.test:8420",
        "token": "bmx_secret",
    }
    login = load_login()
    assert login is not None and (login.url, login.token) == (
        "http://example.test:8420",
        "bmx_secret",
    )


@pytest.mark.engine_independent
def test_arguments_beat_the_environment_which_beats_the_login_file(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert resolve() == (DEFAULT_URL, None)
    save_login("http://saved.test", "bmx_saved")
    assert resolve() == ("http://saved.test", "bmx_saved")
    monkeypatch.setenv(TOKEN_ENV, "bmx_env")
    assert resolve() == ("http://saved.test", "bmx_env")
    assert resolve(token="bmx_arg") == ("http://saved.test", "bmx_arg")
    monkeypatch.setenv(URL_ENV, "http://env.test/")
    assert resolve("http://arg.test") == ("http://arg.test", "bmx_env")
    assert resolve() == ("http://env.test", "bmx_env")


@pytest.mark.engine_independent
def test_the_saved_token_never_goes_to_another_server(monkeypatch: pytest.MonkeyPatch) -> None:
    save_login("http://saved.test", "bmx_saved")
    assert resolve("http://other.test") == ("http://other.test", None)
    monkeypatch.setenv(URL_ENV, "http://other.test")
    assert resolve() == ("http://other.test", None)


ELSEWHERE = [
    "http://elsewhere.test/v1/principals/me",  # another host
    "https://bmx.test/v1/principals/me",  # another scheme
    "http://bmx.test:8080/v1/principals/me",  # another port
    "http://bmx.test@elsewhere.test/v1/principals/me",  # a host behind user info
]


@pytest.mark.engine_independent
@pytest.mark.parametrize("url", ELSEWHERE)
def test_a_request_for_another_origin_is_refused_and_nothing_is_sent(url: str) -> None:
    """The token goes to the client's own server only, whatever URL a caller
    passes (one a server handed it, say). Mutation: drop the origin check in
    ``_own`` and the token reaches the other server."""
    server = Recorder(httpx.Response(200, json={}))
    with server.client() as bmx:
        with pytest.raises(ForeignOrigin, match="not on the server this client talks to"):
            bmx.request("GET", url)
        with pytest.raises(ForeignOrigin), bmx.stream("GET", url):
            pass
        with pytest.raises(ForeignOrigin):
            bmx.url_for(url)
        assert bmx.url_for("http://bmx.test:80/v1/x") == "http://bmx.test/v1/x"
        assert bmx.url_for("//elsewhere.test/x").startswith("http://bmx.test/")
        bmx.request("GET", "http://BMX.test/v1/principals/me")  # the same origin, spelled so
    assert [str(r.url) for r in server.requests] == ["http://bmx.test/v1/principals/me"]
    assert server.requests[0].headers["Authorization"] == "Bearer bmx_fake"


@pytest.mark.engine_independent
async def test_the_async_client_refuses_another_origin_too() -> None:
    seen: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={})

    transport = httpx.MockTransport(record)
    async with AsyncClient(FAKE_URL, "bmx_fake", transport=transport) as bmx:
        for url in ELSEWHERE:
            with pytest.raises(ForeignOrigin):
                await bmx.request("GET", url)
            with pytest.raises(ForeignOrigin):
                async with bmx.stream("GET", url):
                    pass
    assert seen == []


@pytest.mark.engine_independent
@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
async def test_a_redirect_is_an_error_naming_where_it_points_and_is_never_followed(
    status: int,
) -> None:
    """A server (or a proxy sending ``http`` to ``https``) answering 3xx:
    the client neither follows it, which would carry the token to another
    server, nor takes the redirect's empty body for the answer (before, a
    listing read as ``None`` and the commands ended in a ``TypeError``).
    Mutation: treat only 4xx and 5xx as refusals (``response.is_error``)
    and ``me()`` returns ``None``, the stream yields the redirect."""
    where = {"Location": "https://elsewhere.test/v1/x"}
    server = Recorder(httpx.Response(status, headers=where))
    with server.client(retries=0) as bmx:
        with pytest.raises(
            Redirected, match=re.escape("redirects to 'https://elsewhere.test/v1/x'")
        ):
            bmx.me()
        with pytest.raises(Redirected), bmx.stream("GET", "/v1/x"):
            pass
    seen: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(status, headers=where)

    transport = httpx.MockTransport(record)
    async with AsyncClient(FAKE_URL, "bmx_fake", transport=transport, retries=0) as bmx:
        with pytest.raises(Redirected) as caught:
            await bmx.me()
        async with contextlib.AsyncExitStack() as stack:
            with pytest.raises(Redirected):
                await stack.enter_async_context(bmx.stream("GET", "/v1/x"))
    assert caught.value.status == status and caught.value.slug == f"http-{status}"
    hosts = {r.url.host for r in [*server.requests, *seen]}
    assert hosts == {"bmx.test"} and len(server.requests) == len(seen) == 2


# -- the kernel's routes over real HTTP -------------------------------------------


async def test_spaces_and_members_round_trip(
    live_server: str, admin: Any, make_principal: Any
) -> None:
    agent = await make_principal("agent")

    def scenario() -> None:
        with Client(live_server, admin.token) as bmx:
            assert bmx.me()["name"] == "admin"
            created = bmx.create_space("web", name="Web shop")
            assert (created["slug"], created["name"], created["role"]) == (
                "web",
                "Web shop",
                "owner",
            )
            assert bmx.get_space("web")["id"] == created["id"]
            assert [s["slug"] for s in bmx.list_spaces()] == ["web"]
            member = bmx.put_member("web", agent.name, "member")
            assert (member["principal_id"], member["role"]) == (agent.id, "member")
            roles = {m["name"]: m["role"] for m in bmx.list_members(created["id"])}
            assert roles == {"admin": "owner", agent.name: "member"}
            assert bmx.remove_member("web", agent.id) is None
            assert [m["name"] for m in bmx.list_members("web")] == ["admin"]

    await asyncio.to_thread(scenario)


class LosesFirstAnswer(httpx.BaseTransport):
    """Delivers every request but replaces the first answer with a 502, as a
    proxy does when the server answered after the proxy gave up."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.keys: list[str | None] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.keys.append(request.headers.get("Idempotency-Key"))
        response = self.inner.handle_request(request)
        if len(self.keys) > 1:
            return response
        response.read()
        response.close()
        return httpx.Response(502)

    def close(self) -> None:
        self.inner.close()


async def test_a_retried_create_whose_first_answer_was_lost_makes_one_space(
    live_server: str, admin: Any
) -> None:
    """Catches a client that mints a new key per attempt: the server would
    then create the space twice (the second as a slug conflict)."""
    transport = LosesFirstAnswer()

    def scenario() -> tuple[dict[str, Any], list[dict[str, Any]]]:
        with Client(live_server, admin.token, backoff=0, transport=transport) as bmx:
            created = bmx.create_space("lost-answer")
        with Client(live_server, admin.token) as bmx:
            return created, bmx.list_spaces()

    created, spaces = await asyncio.to_thread(scenario)
    assert len(transport.keys) == 2 and transport.keys[0] == transport.keys[1]
    assert [s["id"] for s in spaces if s["slug"] == "lost-answer"] == [created["id"]]


async def test_the_same_key_twice_answers_once_and_another_body_is_refused(
    live_server: str, admin: Any
) -> None:
    def scenario() -> None:
        with Client(live_server, admin.token) as bmx:
            body = {"slug": "once"}
            first = bmx.request("POST", "/v1/spaces", json=body, idempotency_key="k-1")
            again = bmx.request("POST", "/v1/spaces", json=body, idempotency_key="k-1")
            assert again == first
            assert [s["slug"] for s in bmx.list_spaces()].count("once") == 1
            with pytest.raises(IdempotencyKeyReused) as caught:
                bmx.request("POST", "/v1/spaces", json={"slug": "twice"}, idempotency_key="k-1")
            assert caught.value.slug == "idempotency-key-reused"
            assert "twice" not in [s["slug"] for s in bmx.list_spaces()]

    await asyncio.to_thread(scenario)


async def test_server_problems_arrive_as_typed_exceptions(
    live_server: str, admin: Any, make_principal: Any
) -> None:
    agent = await make_principal("agent")

    def scenario() -> None:
        with Client(live_server, admin.token) as bmx:
            with pytest.raises(NotFound) as missing:
                bmx.get_space("no-such-space")
            assert (missing.value.status, missing.value.detail) == (404, "no such space")
            with pytest.raises(ValidationError) as invalid:
                bmx.create_space("Not A Slug")
            assert invalid.value.slug == "validation-error"
            assert "slug" in invalid.value.errors
            with pytest.raises(Conflict) as last_admin:
                bmx.update_principal("admin", disabled=True)
            assert last_admin.value.slug == "last-admin"
        with Client(live_server, agent.token) as bmx, pytest.raises(Forbidden) as refused:
            bmx.create_space("agents-may-not")
        assert refused.value.slug == "forbidden"
        with Client(live_server, "bmx_not-a-real-token") as bmx, pytest.raises(Unauthenticated):
            bmx.me()

    await asyncio.to_thread(scenario)


async def test_paginate_walks_every_page_of_a_real_list(live_server: str, admin: Any) -> None:
    slugs = [f"page-{n}" for n in range(5)]

    def scenario() -> list[str]:
        with Client(live_server, admin.token) as bmx:
            for slug in slugs:
                bmx.create_space(slug)
            first_page = bmx.request("GET", "/v1/spaces", params={"limit": 2})
            assert len(first_page["items"]) == 2 and first_page["next_cursor"]
            return [s["slug"] for s in bmx.paginate("/v1/spaces", {"limit": 2})]

    assert await asyncio.to_thread(scenario) == slugs


async def test_tokens_work_until_rotated_or_revoked(live_server: str, admin: Any) -> None:
    def scenario() -> None:
        with Client(live_server, admin.token) as bmx:
            issued = bmx.create_token(name="ci", expires_in_seconds=3600)
            assert issued["token"].startswith("bmx_") and issued["expires_at"]
            with Client(live_server, issued["token"]) as ci:
                assert ci.me()["name"] == "admin"
            listed = {t["id"]: t for t in bmx.list_tokens()}
            assert "token" not in listed[issued["id"]]
            rotated = bmx.rotate_token(issued["id"])
            with Client(live_server, issued["token"]) as old, pytest.raises(Unauthenticated):
                old.me()
            with Client(live_server, rotated["token"]) as new:
                assert new.me()["name"] == "admin"
            assert bmx.revoke_token(rotated["id"]) is None
            with (
                Client(live_server, rotated["token"]) as new,
                pytest.raises(Unauthenticated) as gone,
            ):
                new.me()
            assert gone.value.detail == "the token was revoked"
            assert bmx.get_token(rotated["id"])["revoked_at"] is not None

    await asyncio.to_thread(scenario)


async def test_principals_sign_in_and_are_disabled(live_server: str, admin: Any) -> None:
    def scenario() -> None:
        with Client(live_server, admin.token) as bmx:
            alice = bmx.create_principal(
                "human", "alice", "Alice", password="correct horse battery"
            )
            assert "password" not in alice
            session = sign_in(live_server, "alice", "correct horse battery")
            assert session["principal_id"] == alice["id"]
            with Client(live_server, session["token"]) as as_alice:
                assert as_alice.me()["display_name"] == "Alice"
                bmx.update_principal("alice", disabled=True)
                with pytest.raises(Unauthenticated):
                    as_alice.me()
            listed = {p["name"]: p for p in bmx.list_principals()}
            assert listed["alice"]["disabled_at"] is not None
        with pytest.raises(Unauthenticated) as refused:
            sign_in(live_server, "alice", "wrong password!!")
        assert refused.value.detail == "wrong name or password"

    await asyncio.to_thread(scenario)


async def test_a_client_with_no_arguments_uses_the_login_file(live_server: str, admin: Any) -> None:
    save_login(live_server, admin.token)

    def scenario() -> dict[str, Any]:
        with Client() as bmx:
            return bmx.me()

    assert (await asyncio.to_thread(scenario))["id"] == admin.id


async def test_an_unreachable_server_is_named(live_server: str) -> None:
    url = f"http://127.0.0.1:{free_port()}"

    def scenario() -> None:
        with Client(url, "bmx_x", retries=1, backoff=0) as bmx:
            bmx.me()

    with pytest.raises(Unreachable) as caught:
        await asyncio.to_thread(scenario)
    assert caught.value.url == url and url in str(caught.value)


async def test_the_async_client_offers_the_same_calls(live_server: str, admin: Any) -> None:
    async with AsyncClient(live_server, admin.token) as bmx:
        created = await bmx.create_space("async-space")
        assert (await bmx.get_space("async-space"))["id"] == created["id"]
        assert [s["slug"] async for s in bmx.paginate("/v1/spaces", {"limit": 1})] == [
            "async-space"
        ]
        assert [m["name"] for m in await bmx.list_members("async-space")] == ["admin"]
        with pytest.raises(NotFound):
            await bmx.get_space("missing")
