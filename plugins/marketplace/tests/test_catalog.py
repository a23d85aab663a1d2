"""The catalog over HTTP: publish (who may, what is refused, what is stored),
browse, download, yank, archive and eligibility."""

from __future__ import annotations

import asyncio
import hashlib

import pytest
from buildmax_marketplace.tables import plugins, releases

from .archives import FILES, SKILL_ONLY, member, tar_gz, zip64_locator_past_the_end, zip_file
from .conftest import MAX_PACKAGE_BYTES

NAME = "lint-helpers"


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


async def stored_keys(market) -> list[str]:
    from buildmax.app import blob_store

    return sorted([ref.key async for ref in blob_store(market.app).list("marketplace")])


async def test_publish_records_the_release_with_its_report_and_exact_bytes(market, tmp_path):
    archive = tar_gz(tmp_path / "r.tar.gz")
    made = await market.publish(archive, NAME)
    assert (made["name"], made["version"], made["sha256"], made["size"]) == (
        NAME,
        "1.2.0",
        digest(archive),
        archive.stat().st_size,
    )
    assert made["report"]["hooks"] == [{"event": "PreToolUse", "executable": "hooks/check.sh"}]
    assert made["executable"] is True and made["eligible"] is False
    assert made["published_by"] == market.admin.id

    got = await market.call("GET", made["package_url"], market.agent, expect=200)
    assert got == archive.read_bytes()
    assert await stored_keys(market) == [f"marketplace/sha256/{digest(archive)}"]
    (event,) = await market.audited("catalog.release.published")
    assert event["target_id"] == NAME and digest(archive)[:12] in event["details"]
    assert not list((market.app.settings.data_path / "tmp").iterdir())

    again = await market.publish(archive, NAME, market.operator, expect=200)
    assert again == made
    other = zip_file(tmp_path / "r.zip")
    refused = await market.publish(other, NAME, expect=409, problem="release-exists")
    assert refused["sha256"] == digest(archive)
    assert len(await market.rows(releases)) == 1
    assert len(await market.audited("catalog.release.published")) == 1


async def test_only_system_admins_and_operators_publish(market, tmp_path):
    archive = tar_gz(tmp_path / "r.tar.gz")
    for who in (market.owner, market.agent):
        await market.publish(archive, NAME, who, expect=403, problem="forbidden")
    assert await market.rows(plugins) == []
    await market.publish(archive, NAME, market.operator)


async def test_a_refused_archive_leaves_nothing(market, tmp_path):
    hostile = tar_gz(tmp_path / "h.tar.gz", {**SKILL_ONLY, "../escape": "x"})
    refused = await market.publish(hostile, "notes", expect=422, problem="package-invalid")
    assert "'..'" in refused["reason"] and refused["path"] == "../escape"
    mismatch = await market.publish(
        tar_gz(tmp_path / "n.tar.gz", SKILL_ONLY), NAME, expect=422, problem="package-invalid"
    )
    assert "names 'notes'" in mismatch["detail"]
    big = tmp_path / "big.tar.gz"
    big.write_bytes(b"\x1f\x8b" + b"\0" * MAX_PACKAGE_BYTES)
    await market.publish(big, "notes", expect=413)
    assert await market.rows(plugins) == [] and await market.rows(releases) == []
    assert await stored_keys(market) == []
    assert not list((market.app.settings.data_path / "tmp").iterdir())
    assert await market.audited("catalog.release.published") == []


async def test_browse_show_and_the_latest_unyanked_release(market, tmp_path):
    first = await market.publish(tar_gz(tmp_path / "1.tar.gz"), NAME)
    files = {
        **FILES,
        "buildmax-plugin.toml": FILES["buildmax-plugin.toml"].replace("1.2.0", "1.10"),
    }
    second = await market.publish(tar_gz(tmp_path / "2.tar.gz", files), NAME)
    shown = await market.call("GET", f"/v1/catalog/{NAME}", market.agent, expect=200)
    assert [r["version"] for r in shown["releases"]] == ["1.10", "1.2.0"]
    assert shown["latest"] == "1.10"

    await market.call(
        "POST", f"/v1/catalog/{NAME}/releases/1.10/yank", market.operator, json={}, expect=422
    )
    yanked = await market.call(
        "POST",
        f"/v1/catalog/{NAME}/releases/1.10/yank",
        market.operator,
        json={"reason": "breaks on windows"},
        expect=200,
    )
    assert yanked["yanked"] is True and yanked["yank_reason"] == "breaks on windows"
    again = await market.call(
        "POST",
        f"/v1/catalog/{NAME}/releases/1.10/yank",
        market.admin,
        json={"reason": "other"},
        expect=200,
    )
    assert again["yank_reason"] == "breaks on windows"
    assert len(await market.audited("catalog.release.yanked")) == 1
    listed = await market.call("GET", "/v1/catalog", market.agent, expect=200)
    assert [(p["name"], p["latest"]) for p in listed["items"]] == [(NAME, first["version"])]
    await market.call(
        "POST",
        f"/v1/catalog/{NAME}/releases/1.2.0/yank",
        market.owner,
        json={"reason": "x"},
        expect=403,
    )
    assert second["version"] == "1.10"
    await market.call("GET", f"/v1/catalog/{NAME}/releases/9.9", market.agent, expect=404)
    await market.call("GET", "/v1/catalog/Not_A_Name", market.agent, expect=404)


async def test_archiving_stops_publishing_and_hides_the_plugin(market, tmp_path):
    await market.publish(tar_gz(tmp_path / "1.tar.gz"), NAME)
    await market.call(
        "POST", f"/v1/catalog/{NAME}/archive", market.agent, json={"reason": "x"}, expect=403
    )
    archived = await market.call(
        "POST",
        f"/v1/catalog/{NAME}/archive",
        market.operator,
        json={"reason": "superseded"},
        expect=200,
    )
    assert archived["archived"] is True and archived["archive_reason"] == "superseded"
    files = {**FILES, "buildmax-plugin.toml": FILES["buildmax-plugin.toml"].replace("1.2.0", "2.0")}
    await market.publish(
        tar_gz(tmp_path / "2.tar.gz", files), NAME, expect=409, problem="plugin-archived"
    )
    assert (await market.call("GET", "/v1/catalog", market.agent, expect=200))["items"] == []
    every = await market.call("GET", "/v1/catalog?archived=true", market.agent, expect=200)
    assert [p["name"] for p in every["items"]] == [NAME]


async def test_only_a_system_admin_marks_a_release_eligible_and_it_does_not_carry(market, tmp_path):
    archive = tar_gz(tmp_path / "1.tar.gz")
    made = await market.publish(archive, NAME)
    path = f"/v1/catalog/{NAME}/releases/1.2.0/eligibility"
    body = {"eligible": True, "sha256": made["sha256"]}
    for who in (market.operator, market.owner, market.agent):
        await market.call("POST", path, who, json=body, expect=403)
    wrong = {"eligible": True, "sha256": "0" * 64}
    await market.call(
        "POST", path, market.admin, json=wrong, expect=409, problem="release-digest-mismatch"
    )
    assert (await market.rows(releases))[0]["eligible_at"] is None

    marked = await market.call("POST", path, market.admin, json=body, expect=200)
    assert marked["eligible"] is True and marked["eligible_by"] == market.admin.id
    (event,) = await market.audited("catalog.release.eligible")
    assert '"version":"1.2.0"' in event["details"] and made["sha256"][:12] in event["details"]

    files = {**FILES, "buildmax-plugin.toml": FILES["buildmax-plugin.toml"].replace("1.2.0", "1.3")}
    newer = await market.publish(tar_gz(tmp_path / "2.tar.gz", files), NAME)
    assert newer["eligible"] is False

    withdrawn = await market.call(
        "POST", path, market.admin, json={**body, "eligible": False}, expect=200
    )
    assert withdrawn["eligible"] is False
    assert len(await market.audited("catalog.release.ineligible")) == 1


async def test_a_run_token_cannot_read_the_catalog(market, tmp_path):
    """A token scoped to an attempt is refused by every catalog route."""
    from buildmax.tokens import issue_token

    await market.publish(tar_gz(tmp_path / "1.tar.gz"), NAME)
    async with market.app.db.write() as tx:
        scoped = await issue_token(
            tx,
            principal_pk=market.agent.pk,
            now=market.app.clock.now_ms(),
            name="run",
            origin="claim",
            scope_type="attempt",
            scope_id="at_x",
        )
    for path in (
        "/v1/catalog",
        f"/v1/catalog/{NAME}",
        f"/v1/catalog/{NAME}/releases/1.2.0",
        f"/v1/catalog/{NAME}/releases/1.2.0/package",
    ):
        await market.call("GET", path, scoped.secret, expect=403, problem="token-scope-refused")


DEEP = "x = " + "[" * 3000 + "]" * 3000 + "\n"
#: Archives whose reading once escaped the reader: (the file, its text, a word of the reason).
UNREADABLE = {
    "nested manifest": ("buildmax-plugin.toml", DEEP + FILES["buildmax-plugin.toml"], "nested"),
    "nested servers": ("mcp/servers.toml", DEEP + FILES["mcp/servers.toml"], "nested"),
    "nested hooks": ("hooks/hooks.toml", DEEP + FILES["hooks/hooks.toml"], "nested"),
    "malformed url": ("mcp/servers.toml", '[servers.d]\nurl = "http://[::1/x"\n', "malformed"),
    "NUL in the description": (
        "buildmax-plugin.toml",
        FILES["buildmax-plugin.toml"].replace("for linting", "for\\u0000linting"),
        "description",
    ),
}


@pytest.mark.parametrize("case", sorted(UNREADABLE))
async def test_any_archive_the_reader_cannot_read_is_a_422_that_stores_nothing(
    market, tmp_path, case
):
    """Publish answered 500 for these (RecursionError, ValueError, and on
    PostgreSQL a NUL the column cannot hold); every one is now the reader's
    refusal (mutation: drop the reader's guards and this answers 500)."""
    path, text, word = UNREADABLE[case]
    archive = tar_gz(tmp_path / "x.tar.gz", {**FILES, path: text})
    refused = await market.publish(archive, NAME, expect=422, problem="package-invalid")
    assert refused["path"] == path and word in refused["reason"]
    assert await market.rows(plugins) == [] and await market.rows(releases) == []
    assert await stored_keys(market) == []
    assert await market.audited("catalog.release.published") == []


async def test_an_archive_with_undecodable_names_or_a_broken_zip64_directory_is_a_422(
    market, tmp_path
):
    """A tar entry named with bytes that are not UTF-8 made a refusal the
    answer could not encode, and a zip64 locator past the largest file an
    ``OSError``: both answered 500 (mutation: drop the escaping in
    ``PackageRefused`` or the offset check in ``_zip64_directory``)."""
    undecodable = tar_gz(tmp_path / "u.tar.gz", SKILL_ONLY, [member("\udcff", size=1)])
    refused = await market.publish(undecodable, "notes", expect=422, problem="package-invalid")
    assert refused["path"] == "\\udcff" and "not UTF-8" in refused["reason"]
    broken = zip64_locator_past_the_end(tmp_path / "z.zip")
    refused = await market.publish(broken, "notes", expect=422, problem="package-invalid")
    assert "zip64" in refused["reason"]
    assert await market.rows(plugins) == [] and await market.rows(releases) == []
    assert await stored_keys(market) == []


@pytest.mark.parametrize("named", [False, True], ids=["inspected here", "named"])
async def test_catalog_publish_reports_an_unreadable_archive_in_one_line(
    market, live_server, tmp_path, monkeypatch, named
):
    """The command inspects the archive itself unless ``--name`` is given;
    either way an unreadable archive is one ``error:`` line, no traceback."""
    from click.testing import CliRunner

    from buildmax.cli import _register_commands, cli
    from buildmax.client import TOKEN_ENV, URL_ENV

    for variable in (URL_ENV, TOKEN_ENV):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    archive = tar_gz(tmp_path / "x.tar.gz", {**FILES, "mcp/servers.toml": DEEP})
    _register_commands()
    argv = ["catalog", "publish", str(archive), "--url", live_server, "--token", market.admin.token]
    argv += ["--name", NAME] if named else []
    result = await asyncio.to_thread(CliRunner().invoke, cli, argv, catch_exceptions=False)
    assert result.exit_code == 1
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: ") and "mcp/servers.toml: nested deeper than" in line
    assert "422 package-invalid" in line if named else str(archive) in line
    assert await market.rows(releases) == []
