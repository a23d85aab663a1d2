"""Browser tests of the dashboard: Playwright for Python driving Debian's
Chromium (launched by its path, ``BUILDMAX_CHROMIUM`` or
``/usr/bin/chromium``) against a real ``buildmax serve`` child process,
each test on SQLite and on PostgreSQL (the server of
``BUILDMAX_TEST_DATABASE_URL``, by default the local one; unreachable, the
tests fail, never skip). Screenshots go to ``.artifacts/dashboard/<engine>/``.

The people and the work are made through the HTTP API, as an operator and
an agent would; only the person in the browser uses the dashboard."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from axe_playwright_python.async_playwright import Axe
from playwright.async_api import Browser, BrowserContext, Page, async_playwright

from buildmax.config import Config
from buildmax.testing import start_server
from buildmax.testing.postgres import pg_create_database, pg_drop_database

PASSWORD = "correct horse battery staple"
CHROMIUM = os.environ.get("BUILDMAX_CHROMIUM", "/usr/bin/chromium")
#: The PostgreSQL server the PostgreSQL runs make their databases on.
PG_SERVER = os.environ.get(
    "BUILDMAX_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test"
)
ARTIFACTS = Path(__file__).resolve().parents[3] / ".artifacts" / "dashboard"
_ADMIN_TOKEN = re.compile(r"bmx_[A-Za-z0-9_-]{43}")


@dataclass
class Site:
    """A served BuildMax with a team made through its API."""

    url: str
    engine: str
    admin: httpx.AsyncClient
    owner: httpx.AsyncClient
    agent: httpx.AsyncClient
    viewer_name: str
    owner_name: str
    space: dict[str, Any]
    project: dict[str, Any]
    #: A person (with a password) holding the system admin role.
    admin_name: str = "sam"

    @property
    def base(self) -> str:
        """The space's API path."""
        return f"/v1/spaces/{self.space['id']}"

    def page_url(self, path: str) -> str:
        """The absolute URL of a dashboard path."""
        return self.url + path


async def _ok(answer: httpx.Response, status: int = 200) -> Any:
    assert answer.status_code == status, (answer.request.url, answer.status_code, answer.text)
    return answer.json() if answer.content else None


async def _as(url: str, token: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=15)


@pytest.fixture(scope="session")
def chromium_path() -> str:
    """Debian's Chromium, which the ``browser`` tox env installs."""
    if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
        pytest.exit(
            f"no Chromium at {CHROMIUM}: install Debian's chromium "
            "(sh tests/debian-packages.sh chromium:chromium) or set BUILDMAX_CHROMIUM",
            returncode=pytest.ExitCode.TESTS_FAILED,
        )
    return CHROMIUM


@pytest.fixture
async def browser(chromium_path: str) -> AsyncIterator[Browser]:
    """A headless Chromium (one per test: each test's event loop is its own)."""
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(
            executable_path=chromium_path, args=["--no-sandbox"], headless=True
        )
        try:
            yield launched
        finally:
            await launched.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest) -> str:
    """Each browser test runs on both engines."""
    return str(request.param)


@pytest.fixture
def server(engine: str, tmp_path: Path) -> Iterator[Any]:
    """``buildmax serve`` on a database of its own (a fresh SQLite data
    directory, or a new PostgreSQL database on :data:`PG_SERVER`, dropped
    after); review work joins the attention list as soon as it waits."""
    config = tmp_path / "buildmax.toml"
    config.write_text("[plugins.reviews]\nattention_wait_seconds = 0\n")
    name = f"bmx_ui_{os.getpid()}_{secrets.token_hex(4)}" if engine == "postgresql" else None
    database_url = pg_create_database(PG_SERVER, name) if name else ""
    try:
        settings = Config(data_dir=str(tmp_path / "data"), database_url=database_url)
        if name:  # a new PostgreSQL deployment migrates first; SQLite's serve does
            subprocess.run(
                [sys.executable, "-m", "buildmax", "db", "migrate", "--database-url", database_url],
                check=True,
                capture_output=True,
                env={k: v for k, v in os.environ.items() if not k.startswith("BUILDMAX_")},
            )
        served = start_server(
            settings, tmp_path / "server.log", extra_env={"BUILDMAX_CONFIG": str(config)}
        )
        try:
            yield served
        finally:
            served.stop()
    finally:
        if name:
            pg_drop_database(PG_SERVER, name)


@pytest.fixture
async def site(server: Any, engine: str) -> AsyncIterator[Site]:
    """A space with a project: a person who owns it (with a password), a
    viewer (with a password), a member agent (with a token), and a system
    admin person (with a password)."""
    token = _ADMIN_TOKEN.findall(server.log())[0]
    clients: list[httpx.AsyncClient] = []
    admin = await _as(server.url, token)
    clients.append(admin)
    try:
        people = {
            name: await _ok(
                await admin.post(
                    "/v1/principals", json={"kind": "human", "name": name, "password": PASSWORD}
                ),
                201,
            )
            for name in ("ada", "vic")
        }
        await _ok(
            await admin.post(
                "/v1/principals",
                json={"kind": "human", "name": "sam", "password": PASSWORD, "system_role": "admin"},
            ),
            201,
        )
        bot = await _ok(
            await admin.post("/v1/principals", json={"kind": "agent", "name": "bot"}), 201
        )
        bot_token = await _ok(
            await admin.post("/v1/tokens", json={"principal_id": bot["id"], "name": "bot"}), 201
        )
        session = await _ok(
            await admin.post("/v1/sessions", json={"name": "ada", "password": PASSWORD}), 201
        )
        owner = await _as(server.url, session["token"])
        agent = await _as(server.url, bot_token["token"])
        clients += [owner, agent]
        space = await _ok(
            await admin.post(
                "/v1/spaces",
                json={"slug": "team", "name": "Team", "owner_id": people["ada"]["id"]},
            ),
            201,
        )
        base = f"/v1/spaces/{space['id']}"
        await _ok(await owner.put(f"{base}/members/{bot['id']}", json={"role": "member"}))
        await _ok(await owner.put(f"{base}/members/{people['vic']['id']}", json={"role": "viewer"}))
        project = await _ok(await owner.post(f"{base}/projects", json={"name": "main"}), 201)
        yield Site(server.url, engine, admin, owner, agent, "vic", "ada", space, project)
    finally:
        for client in clients:
            await client.aclose()


@pytest.fixture
async def context(browser: Browser) -> AsyncIterator[BrowserContext]:
    """A fresh browser profile (no cookies), desktop-sized."""
    made = await browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        yield made
    finally:
        await made.close()


class Watch:
    """What a page must never do: open a dialog (a script that ran) or
    break the Content-Security-Policy."""

    def __init__(self, page: Page) -> None:
        self.dialogs: list[str] = []
        self.violations: list[str] = []
        page.on("dialog", self._dialog)
        page.on("console", self._console)

    async def _dialog(self, dialog: Any) -> None:
        self.dialogs.append(dialog.message)
        await dialog.dismiss()

    def _console(self, message: Any) -> None:
        if "Content Security Policy" in message.text or "Content-Security-Policy" in message.text:
            self.violations.append(message.text)


async def sign_in(page: Page, site: Site, name: str, next_path: str = "/ui/") -> None:
    """Sign in through the form as ``name``."""
    await page.goto(site.page_url(f"/ui/sign-in?next={next_path}"))
    await page.get_by_label("Name").fill(name)
    await page.get_by_label("Password").fill(PASSWORD)
    await page.get_by_role("button", name="Sign in").click()
    await page.wait_for_url(re.compile(re.escape(site.url + next_path) + r"$"))


def shots_dir(site: Site) -> Path:
    """Where this engine's screenshots go."""
    path = ARTIFACTS / site.engine
    path.mkdir(parents=True, exist_ok=True)
    return path


#: The variants (color scheme, size) a page is checked with axe in: each
#: scheme and each width once (the layout is measured in all four).
AXE_VARIANTS = frozenset({("light", "desktop"), ("dark", "phone")})


async def page_problems(page: Page, label: str, width: int, axe: bool = True) -> list[str]:
    """What is wrong with the page as shown: any horizontal scrolling, and
    (with ``axe``) serious or critical axe violations."""
    found: list[str] = []
    overflow = await page.evaluate(
        "document.documentElement.scrollWidth - document.documentElement.clientWidth"
    )
    if overflow > 0:
        found.append(f"{label}: scrolls {overflow} px sideways at {width} px")
    if not axe:
        return found
    results = await Axe().run(page)
    for violation in results.response["violations"]:
        if violation["impact"] in ("serious", "critical"):
            targets = [node["target"] for node in violation["nodes"]][:3]
            found.append(f"{label}: {violation['id']} ({violation['impact']}) at {targets}")
    return found


#: The widths and heights pages are shown at.
SIZES = (("desktop", 1280, 800), ("phone", 320, 640))


async def _visit(
    page: Page, site: Site, name: str, path: str, variant: tuple[str, str, int], status: int
) -> list[str]:
    """Open ``path`` in ``variant`` (scheme, size, width): what is wrong
    with it, and its screenshot saved."""
    scheme, size, width = variant
    answer = await page.goto(site.page_url(path))
    found = await page_problems(
        page, f"{name} {scheme} {size}", width, (scheme, size) in AXE_VARIANTS
    )
    if answer is None or answer.status != status:
        found.append(f"{name} {scheme} {size}: answered {answer and answer.status}")
    await page.screenshot(path=str(shots_dir(site) / f"{name}-{size}-{scheme}.png"), full_page=True)
    return found


async def every_variant(
    browser: Browser,
    site: Site,
    who: str,
    pages: Mapping[str, str],
    *,
    signed_out: Mapping[str, str] | None = None,
    statuses: Mapping[str, int] | None = None,
) -> list[str]:
    """Show each of ``pages`` (name to path) signed in as ``who``, and each
    of ``signed_out`` before that, light and dark at every size: what is
    wrong with each (:func:`page_problems`, and a status other than the one
    ``statuses`` names, 200 by default), with a screenshot of each saved."""
    expected = statuses or {}
    problems: list[str] = []
    for scheme in ("light", "dark"):
        for size, width, height in SIZES:
            context = await browser.new_context(
                viewport={"width": width, "height": height}, color_scheme=scheme
            )
            try:
                page = await context.new_page()
                variant = (scheme, size, width)
                for name, path in (signed_out or {}).items():
                    problems += await _visit(
                        page, site, name, path, variant, expected.get(name, 200)
                    )
                await sign_in(page, site, who)
                for name, path in pages.items():
                    problems += await _visit(
                        page, site, name, path, variant, expected.get(name, 200)
                    )
            finally:
                await context.close()
    return problems
