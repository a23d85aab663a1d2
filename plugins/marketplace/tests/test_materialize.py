"""The worker side over real HTTP: the run-scoped package routes and
``buildmax run materialize`` (bullets of seed 001 §14, named after them).

The sync client and the command run in worker threads because the live
server shares the test's event loop.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from buildmax_marketplace.materialize import MaterializationFailed, materialize
from buildmax_tasks.tables import attempts
from click.testing import CliRunner

from buildmax.cli import _register_commands, cli
from buildmax.client import TOKEN_ENV, URL_ENV, Client

from .archives import FILES, SKILL_ONLY, tar_gz

HOOKED, SKILLS = "lint-helpers", "notes"


@pytest.fixture(autouse=True)
def isolated_environment(monkeypatch, tmp_path):
    for name in (URL_ENV, TOKEN_ENV, "GITHUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


@pytest.fixture
async def run(market, tmp_path):
    """An agent naming both plugins (the hooked one eligible) and a claimed
    attempt of its task: (claim answer, published releases)."""
    base = f"/v1/spaces/{market.space.id}"
    hooked = await market.publish(tar_gz(tmp_path / "h.tar.gz"), HOOKED)
    skills = await market.publish(tar_gz(tmp_path / "s.tar.gz", SKILL_ONLY), SKILLS)
    await market.call(
        "POST",
        f"/v1/catalog/{HOOKED}/releases/1.2.0/eligibility",
        market.admin,
        json={"eligible": True, "sha256": hooked["sha256"]},
        expect=200,
    )
    await market.call("POST", f"{base}/projects", market.owner, json={"name": "main"}, expect=201)
    body = {"name": "worker", "instructions": "", "plugins": [HOOKED, SKILLS]}
    await market.call("POST", f"{base}/agents", market.owner, json=body, expect=201)
    claim = await market.claim_new(base, "work", "worker")
    return claim, {HOOKED: hooked, SKILLS: skills}


def in_thread(url, token, work):
    def go():
        with Client(url, token, retries=0) as client:
            return work(client)

    return asyncio.to_thread(go)


async def test_a_worker_materializes_exactly_the_pinned_release_verified_against_its_digest_before_extraction_into_its_run_scoped_home(
    market, run, live_server, tmp_path
):
    claim, published = run
    home = tmp_path / "run-home"
    placed = await in_thread(
        live_server, claim["token"], lambda c: materialize(c, claim["attempt"]["id"], home)
    )
    assert [(p["name"], p["version"]) for p in placed.pins] == [(HOOKED, "1.2.0"), (SKILLS, "0.1")]
    assert placed.lock.read_text() == "".join(
        f"{name} {published[name]['version']} {published[name]['sha256']}\n"
        for name in (HOOKED, SKILLS)
    )
    for name, content in FILES.items():
        assert (home / "plugins" / HOOKED / name).read_text() == content
    assert (home / "plugins" / SKILLS / "skills/note/SKILL.md").exists()
    assert sorted(p.name for p in (home / "plugins").iterdir()) == [
        "environment.lock",
        HOOKED,
        SKILLS,
    ]
    assert sorted(p.name for p in home.iterdir()) == ["plugins"]


async def test_a_run_token_can_download_only_the_packages_its_own_runs_pins_name_and_cannot_read_the_catalog(
    market, run, tmp_path
):
    claim, _ = run
    token, attempt = claim["token"], claim["attempt"]["id"]
    listing = await market.call("GET", f"/v1/attempts/{attempt}/packages", token, expect=200)
    assert [p["name"] for p in listing["pins"]] == [HOOKED, SKILLS]
    await market.call("GET", f"/v1/attempts/{attempt}/packages/{SKILLS}", token, expect=200)
    await market.publish(
        tar_gz(
            tmp_path / "o.tar.gz",
            {
                **SKILL_ONLY,
                "buildmax-plugin.toml": SKILL_ONLY["buildmax-plugin.toml"].replace(
                    '"notes"', '"other"'
                ),
            },
        ),
        "other",
    )
    await market.call("GET", f"/v1/attempts/{attempt}/packages/other", token, expect=404)
    await market.call("GET", "/v1/attempts/at_someone_else/packages", token, expect=404)
    for path in ("/v1/catalog", f"/v1/catalog/{SKILLS}/releases/0.1/package"):
        await market.call("GET", path, token, expect=403, problem="token-scope-refused")
    # Another principal's unscoped token is not the run's either.
    await market.call("GET", f"/v1/attempts/{attempt}/packages", market.owner, expect=404)


async def test_a_package_that_fails_verification_or_inspection_fails_the_run_rather_than_starting_it_without_that_plugin(
    market, run, live_server, tmp_path
):
    claim, published = run
    blob = (
        market.app.settings.data_path
        / "blobs"
        / "marketplace"
        / "sha256"
        / published[SKILLS]["sha256"]
    )
    data = bytearray(blob.read_bytes())
    data[-1] ^= 0xFF
    blob.write_bytes(bytes(data))
    home = tmp_path / "run-home"
    with pytest.raises(MaterializationFailed, match="sha256"):
        await in_thread(
            live_server, claim["token"], lambda c: materialize(c, claim["attempt"]["id"], home)
        )
    assert not (home / "plugins").exists()
    assert list(home.iterdir()) == []

    _register_commands()
    argv = [
        "run",
        "materialize",
        "--attempt",
        claim["attempt"]["id"],
        "--home",
        str(home),
        "--url",
        live_server,
        "--token",
        claim["token"],
    ]
    result = await asyncio.to_thread(CliRunner().invoke, cli, argv, catch_exceptions=False)
    assert result.exit_code != 0 and "materialization failed" in result.stderr
    assert not (home / "plugins").exists()
    (row,) = await market.rows(attempts)
    assert row["state"] == "failed" and "sha256" in row["end_reason"]


async def test_a_spaces_declared_environment_variables_that_are_unset_are_reported_by_the_run_rather_than_silently_ignored(
    market, run, live_server, tmp_path
):
    claim, _ = run
    _register_commands()
    argv = [
        "run",
        "materialize",
        "--attempt",
        claim["attempt"]["id"],
        "--home",
        str(tmp_path / "home"),
        "--url",
        live_server,
        "--token",
        claim["token"],
        "--json",
    ]
    result = await asyncio.to_thread(CliRunner().invoke, cli, argv, catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    assert "lint-helpers reads GITHUB_TOKEN, not set here" in result.stderr
    assert json.loads(result.stdout)["unset_environment"] == {HOOKED: ["GITHUB_TOKEN"]}


async def test_j09_a_space_activates_a_skill_only_release_and_a_claimed_attempt_materializes_exactly_it(
    market, live_server, tmp_path
):
    """J09: a space activates a skill-only release; a claimed attempt
    resolves exactly the pinned release; materialization verifies the
    digest; the trace names the activation, version and digest.
    (J10-J12 are the bullet tests of test_activation.py: eligibility and its
    carry-over, open mode's automatic pin, agentless and suspended runs.)"""
    base = f"/v1/spaces/{market.space.id}"
    made = await market.publish(tar_gz(tmp_path / "s.tar.gz", SKILL_ONLY), SKILLS)
    await market.call(
        "PUT", f"{base}/plugins/{SKILLS}", market.owner, json={"version": "0.1"}, expect=201
    )
    await market.call("POST", f"{base}/projects", market.owner, json={"name": "main"}, expect=201)
    body = {"name": "scribe", "instructions": "", "plugins": [SKILLS]}
    await market.call("POST", f"{base}/agents", market.owner, json=body, expect=201)
    claim = await market.claim_new(base, "write", "scribe")
    (pin,) = claim["attempt"]["run_environment"]["plugins"]["pins"]
    assert (pin["name"], pin["version"], pin["sha256"], pin["origin"], pin["activated_by"]) == (
        SKILLS,
        "0.1",
        made["sha256"],
        "curated",
        market.owner.id,
    )
    placed = await in_thread(
        live_server,
        claim["token"],
        lambda c: materialize(c, claim["attempt"]["id"], tmp_path / "h"),
    )
    assert placed.lock.read_text() == f"{SKILLS} 0.1 {made['sha256']}\n"
    assert (tmp_path / "h/plugins/notes/skills/note/SKILL.md").read_text() == SKILL_ONLY[
        "skills/note/SKILL.md"
    ]
    (event,) = await market.audited("activation.created")
    assert made["sha256"][:12] in event["details"]


async def test_a_package_refused_by_inspection_on_the_worker_leaves_nothing(
    market, run, live_server, tmp_path
):
    """The worker's reader may be stricter than the server's: a package it
    refuses fails the whole materialization all the same."""
    from buildmax_marketplace.package import Limits

    claim, _ = run
    home = tmp_path / "run-home"
    with pytest.raises(MaterializationFailed, match="more than 3 entries"):
        await in_thread(
            live_server,
            claim["token"],
            lambda c: materialize(c, claim["attempt"]["id"], home, Limits(max_entries=3)),
        )
    assert list(home.iterdir()) == []


async def test_a_run_token_reads_its_own_attempts_packages_only(market, run, live_server, tmp_path):
    claim, _ = run
    base = f"/v1/spaces/{market.space.id}"
    other = await market.claim_new(base, "another", "worker")
    mine, theirs = claim["attempt"]["id"], other["attempt"]["id"]
    await market.call("GET", f"/v1/attempts/{theirs}/packages", claim["token"], expect=404)
    await market.call("GET", f"/v1/attempts/{theirs}/packages/{SKILLS}", claim["token"], expect=404)
    # The claimant's own token reads both; after the attempt ends, neither.
    await market.call("GET", f"/v1/attempts/{theirs}/packages", market.agent, expect=200)
    attempt = claim["attempt"]
    await market.call(
        "POST",
        f"{base}/attempts/{mine}/release",
        claim["token"],
        json={"generation": attempt["generation"]},
        expect=200,
    )
    ended = await market.call("GET", f"/v1/attempts/{mine}/packages", market.agent, expect=409)
    assert ended["state"] != "active"
    # A home that already has plugins/ is refused before anything is fetched.
    home = tmp_path / "h"
    (home / "plugins").mkdir(parents=True)
    with pytest.raises(MaterializationFailed, match="exists already"):
        await in_thread(live_server, other["token"], lambda c: materialize(c, theirs, home))


async def test_publishing_to_an_archived_plugin_stores_nothing(market, tmp_path):
    await market.publish(tar_gz(tmp_path / "a.tar.gz", SKILL_ONLY), SKILLS)
    await market.call(
        "POST", f"/v1/catalog/{SKILLS}/archive", market.admin, json={"reason": "old"}, expect=200
    )
    files = {
        **SKILL_ONLY,
        "buildmax-plugin.toml": SKILL_ONLY["buildmax-plugin.toml"].replace('"0.1"', '"0.2"'),
    }
    await market.publish(
        tar_gz(tmp_path / "b.tar.gz", files), SKILLS, expect=409, problem="plugin-archived"
    )
    blobs = market.app.settings.data_path / "blobs" / "marketplace" / "sha256"
    assert len(list(blobs.iterdir())) == 1


def _cli_materialize(url: str, token: str, attempt: str, home) -> list[str]:
    _register_commands()
    argv = ["run", "materialize", "--attempt", attempt, "--home", str(home)]
    argv += ["--url", url, "--token", token]
    return argv


def _quiet_server(caplog) -> None:
    """Nothing was logged with a traceback, and nothing by the HTTP server
    (an h11 protocol error, an error in the ASGI framework)."""
    assert [r.getMessage() for r in caplog.records if r.exc_info] == []
    assert [r.getMessage() for r in caplog.records if r.name.startswith("hypercorn")] == []
    assert "h11" not in caplog.text and "LocalProtocolError" not in caplog.text


#: A damage done to the stored package behind the server's back, and what
#: the one error line says: (a word of it, what the server logs).
DAMAGE = {
    "same size": ("410 blob-corrupted", "its sha256 is"),
    "same size, sent in pieces": ("incomplete download", "its sha256 is"),
    "larger": ("410 blob-corrupted", "bytes, not the recorded"),
    "smaller": ("410 blob-corrupted", "bytes, not the recorded"),
    "deleted": ("410 blob-missing", "missing"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
async def test_a_corrupted_package_blob_is_never_sent_and_the_run_names_it_and_fails(
    market, run, live_server, tmp_path, caplog, monkeypatch, damage
):
    """Item 7: a stored package whose size changed made the server abort
    the body with an h11 traceback, the client say "cannot reach" and the
    attempt stay active. The size is checked before sending (mutation: drop
    the size check and "larger"/"smaller" abort mid-body again), a blob of
    one chunk is checked whole before sending (drop it: "same size" is cut
    short instead of a 410), and one sent in pieces holds back its last
    piece until its digest matches (drop that: the wrong bytes arrive whole
    and only the client's own sha256 check refuses them)."""
    claim, published = run
    blob = (
        market.app.settings.data_path
        / "blobs"
        / "marketplace"
        / "sha256"
        / published[SKILLS]["sha256"]
    )
    data = blob.read_bytes()
    if damage.startswith("same size"):
        blob.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
        if damage.endswith("pieces"):
            monkeypatch.setattr("buildmax.blobstore.CHUNK", 64)
    elif damage == "larger":
        blob.write_bytes(data + b"\0" * 4096)
    elif damage == "smaller":
        blob.write_bytes(data[:-10])
    else:
        blob.unlink()
    home = tmp_path / "run-home"
    argv = _cli_materialize(live_server, claim["token"], claim["attempt"]["id"], home)
    result = await asyncio.to_thread(CliRunner().invoke, cli, argv, catch_exceptions=False)

    said, logged = DAMAGE[damage]
    assert result.exit_code == 1
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: materialization failed: notes 0.1") and said in line, line
    assert "cannot reach" not in line
    assert list(home.iterdir()) == []
    (row,) = await market.rows(attempts)
    assert row["state"] == "failed" and said in row["end_reason"]
    (record,) = [r for r in caplog.records if r.name == "buildmax.downloads"]
    assert "notes 0.1" in record.getMessage() and logged in record.getMessage()
    _quiet_server(caplog)


async def test_a_package_the_workers_reader_cannot_read_fails_the_run_in_one_line(
    market, live_server, tmp_path, monkeypatch
):
    """Item 3: a package an older, laxer server accepted (here: its reader
    replaced at publish) whose manifest nests 3000 levels deep. The worker's
    reader used to raise RecursionError: a traceback, and the attempt left
    active. Now it is the reader's refusal, one line, the attempt failed."""
    import buildmax_marketplace.catalog as catalog

    base = f"/v1/spaces/{market.space.id}"
    deep = "x = " + "[" * 3000 + "]" * 3000 + "\n"
    hostile = {**SKILL_ONLY, "buildmax-plugin.toml": deep + SKILL_ONLY["buildmax-plugin.toml"]}
    lenient = catalog.inspect(tar_gz(tmp_path / "good.tar.gz", SKILL_ONLY))
    monkeypatch.setattr(catalog, "inspect", lambda path, limits: lenient)
    await market.publish(tar_gz(tmp_path / "deep.tar.gz", hostile), SKILLS)
    monkeypatch.undo()
    await market.call(
        "PUT", f"{base}/plugins/{SKILLS}", market.owner, json={"version": "0.1"}, expect=201
    )
    await market.call("POST", f"{base}/projects", market.owner, json={"name": "main"}, expect=201)
    body = {"name": "scribe", "instructions": "", "plugins": [SKILLS]}
    await market.call("POST", f"{base}/agents", market.owner, json=body, expect=201)
    claim = await market.claim_new(base, "write", "scribe")
    home = tmp_path / "run-home"
    argv = _cli_materialize(live_server, claim["token"], claim["attempt"]["id"], home)
    result = await asyncio.to_thread(CliRunner().invoke, cli, argv, catch_exceptions=False)

    assert result.exit_code == 1
    (line,) = result.stderr.splitlines()
    assert line == (
        "error: materialization failed: notes 0.1 was refused: "
        "buildmax-plugin.toml: nested deeper than 16 levels"
    )
    assert list(home.iterdir()) == []
    (row,) = await market.rows(attempts)
    assert row["state"] == "failed" and "nested deeper than 16 levels" in row["end_reason"]
