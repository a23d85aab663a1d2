"""Guards each shown by a refusal and by what did not change: declared sizes,
other spaces' artifacts and tasks, a failed finalize, the space quota, the
collector's rechecks, dry runs, retention and pins, a short body, an admin
acting without membership, the collector's command."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from pathlib import Path

import pytest
from buildmax_artifacts import routes
from buildmax_artifacts.gc import collect
from buildmax_artifacts.quota import reserve
from buildmax_artifacts.settings import artifact_settings
from buildmax_artifacts.tables import artifacts, quotas, uploads
from click.testing import CliRunner

from buildmax.cli import _register_commands, cli

from .conftest import MAX_BYTES, PROBLEM, sha

DATA = os.urandom(50 * 1024)


async def _project_task(shelf, headers, space_id: str) -> dict:
    base = f"/v1/spaces/{space_id}"
    await shelf.client.post(f"{base}/projects", headers=headers, json={"name": "main"})
    made = await shelf.client.post(
        f"{base}/tasks", headers=headers, json={"project": "main", "title": "t"}
    )
    assert made.status_code == 201
    return await made.get_json()


async def test_a_declared_size_over_the_limit_is_refused_before_a_byte_is_read(shelf):
    before = await shelf.leftovers()
    data = b"x" * (MAX_BYTES + 1)
    got = await shelf.client.post(
        shelf.base,
        data=data,
        headers={**shelf.member.headers, "Content-Length": str(len(data))},
        query_string={"name": "big"},
    )
    assert got.status_code == 413
    assert got.headers.get("Connection") == "close"
    assert await shelf.leftovers() == before


async def test_nobody_deletes_or_pins_another_spaces_artifact_through_their_own_space(
    shelf, audit_log
):
    made = await shelf.upload(DATA)
    theirs = f"/v1/spaces/{shelf.other_space.id}/artifacts/{made['id']}"
    ours = f"{shelf.base}/{made['id']}"
    headers = shelf.outsider.headers  # owner of the other space
    for path in (theirs, ours):
        assert (await shelf.client.delete(path, headers=headers)).status_code == 404
        for action in ("pin", "unpin"):
            got = await shelf.client.post(f"{path}/{action}", headers=headers)
            assert got.status_code == 404
    [row] = await shelf.rows(artifacts)
    assert (row["deleted_at"], row["pinned"]) == (None, 0)
    assert audit_log.actions().count("artifact.deleted") == 0
    assert "artifact.pinned" not in audit_log.actions()


async def test_a_task_or_attempt_of_another_space_cannot_be_linked(shelf):
    elsewhere = await _project_task(shelf, shelf.outsider.headers, shelf.other_space.id)
    claim = await shelf.client.post(
        f"/v1/spaces/{shelf.other_space.id}/tasks/{elsewhere['id']}/claim",
        headers=shelf.outsider.headers,
        json={},
    )
    attempt = (await claim.get_json())["attempt"]["id"]
    before = await shelf.leftovers()
    for query in ({"task": elsewhere["id"]}, {"attempt": attempt, "generation": "1"}):
        refused = await shelf.upload(DATA, **query, expect=404)
        assert refused["type"] == PROBLEM + "not-found"
    assert await shelf.leftovers() == before


async def test_a_failed_finalize_gives_the_quota_back_at_once(shelf, monkeypatch):
    async def broken(*args, **kwargs):
        raise RuntimeError("injected: the database failed at finalize")

    monkeypatch.setattr(routes, "_finalize", broken)
    await shelf.upload(DATA, expect=500)
    assert await shelf.rows(uploads) == [] and await shelf.rows(artifacts) == []
    assert {r["reserved"] for r in await shelf.rows(quotas)} == {0}


async def test_the_space_quota_limits_one_space_and_not_another(shelf, make_space):
    app = shelf.app
    app.extensions["artifacts.settings"] = dataclasses.replace(
        artifact_settings(app), space_quota_bytes=3 * len(DATA)
    )

    async def sized(space_id: str, who) -> int:
        got = await shelf.client.post(
            f"/v1/spaces/{space_id}/artifacts",
            data=os.urandom(len(DATA)),
            headers={**who.headers, "Content-Length": str(len(DATA))},
            query_string={"name": "x"},
        )
        return got.status_code

    assert [await sized(shelf.space.id, shelf.member) for _ in range(4)] == [201, 201, 201, 409]
    # Another space has a quota of its own.
    assert await sized(shelf.other_space.id, shelf.outsider) == 201


class ListsThenRaces:
    """A store whose listing lets ``during`` run after the collector read the
    live rows and before it judges the first blob it lists."""

    def __init__(self, store: object, during) -> None:
        self.store, self.during = store, during

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)

    async def list(self, prefix: str):
        refs = [ref async for ref in self.store.list(prefix)]  # type: ignore[attr-defined]
        await self.during()
        for ref in refs:
            yield ref


async def test_gc_keeps_bytes_a_new_artifact_took_while_it_was_listing(shelf, monkeypatch, clock):
    first = await shelf.upload(DATA)
    await shelf.client.delete(f"{shelf.base}/{first['id']}", headers=shelf.member.headers)
    clock.advance(seconds=5)
    again = {}

    async def same_bytes_uploaded_again() -> None:
        monkeypatch.setattr(routes, "blob_store", lambda app: real)
        again.update(await shelf.upload(DATA))
        clock.advance(seconds=5)  # even its fresh bytes look old to a zero grace

    real = routes.blob_store(shelf.app)
    monkeypatch.setattr(
        "buildmax_artifacts.gc.blob_store",
        lambda app: ListsThenRaces(real, same_bytes_uploaded_again),
    )
    report = await collect(shelf.app, grace_ms=0)
    assert report.orphans == []
    got = await shelf.client.get(again["url"], headers=shelf.member.headers)
    assert got.status_code == 200 and await got.get_data() == DATA


async def test_gc_deletes_an_orphan_holding_the_spaces_quota_lock(shelf, monkeypatch, clock):
    """An upload of the space cannot reserve between the collector's checks
    and its delete (the quota row is locked; on SQLite the writer is)."""
    made = await shelf.upload(DATA)
    await shelf.client.delete(f"{shelf.base}/{made['id']}", headers=shelf.member.headers)
    clock.advance(seconds=5)
    real = routes.blob_store(shelf.app)
    settings = artifact_settings(shelf.app)
    blocked = []

    class ReservesDuringDelete:
        def __getattr__(self, name: str) -> object:
            return getattr(real, name)

        async def delete(self, key: str) -> bool:
            racing = asyncio.ensure_future(
                reserve(shelf.app, settings, shelf.space.pk, shelf.space.id, 10, shelf.member.pk)
            )
            await asyncio.sleep(0.3)
            blocked.append(not racing.done())
            deleted = await real.delete(key)
            blocked.append(racing)
            return deleted

    monkeypatch.setattr("buildmax_artifacts.gc.blob_store", lambda app: ReservesDuringDelete())
    report = await collect(shelf.app, grace_ms=0)
    assert len(report.orphans) == 1
    assert blocked[0] is True  # the reservation waited for the collector's transaction
    await blocked[1]


async def test_a_young_reservation_is_kept_and_dry_runs_change_nothing(shelf, clock):
    settings = artifact_settings(shelf.app)
    await reserve(shelf.app, settings, shelf.space.pk, shelf.space.id, 1000, shelf.member.pk)
    made = await shelf.upload(DATA)
    for key in shelf.blob_files():
        shelf.backend.remove(key)
    young = await collect(shelf.app, grace_ms=3_600_000, dry_run=True)
    assert (young.stale_uploads, young.lost) == (0, [made["id"]])
    kept = await collect(shelf.app, grace_ms=3_600_000)
    assert kept.stale_uploads == 0 and len(await shelf.rows(uploads)) == 1
    clock.advance(seconds=7200)
    dry = await collect(shelf.app, grace_ms=3_600_000, dry_run=True)
    assert dry.stale_uploads == 1
    assert len(await shelf.rows(uploads)) == 1  # a dry run released nothing
    [row] = await shelf.rows(artifacts)
    assert row["lost_at"] is not None  # tombstoned by the real run above, not the dry one


async def test_retention_keeps_pinned_artifacts(shelf, clock):
    from buildmax_artifacts.retention import expire

    pinned = await shelf.upload(DATA, name="keep")
    loose = await shelf.upload(os.urandom(10), name="go")
    await shelf.client.post(f"{shelf.base}/{pinned['id']}/pin", headers=shelf.member.headers)
    clock.advance(seconds=91 * 86400)
    await expire(shelf.app)
    rows = {r["public_id"]: r for r in await shelf.rows(artifacts)}
    assert rows[pinned["id"]]["deleted_at"] is None
    assert rows[loose["id"]]["deleted_at"] is not None


async def test_a_body_shorter_than_its_content_length_is_refused(shelf):
    before = await shelf.leftovers()
    messages = iter(
        [
            {"type": "http.request", "body": b"x" * 1000, "more_body": False},
        ]
    )

    async def receive() -> dict[str, object]:
        message = next(messages, None)
        if message is None:
            await asyncio.Future()  # the client waits for its answer
        return message

    answers = await shelf.raw_upload(receive, "short", 100000)
    [start] = [a for a in answers if a["type"] == "http.response.start"]
    assert start["status"] == 400
    assert await shelf.leftovers() == before


async def test_an_admin_outside_the_space_uploads_as_an_audited_override(
    shelf, make_principal, audit_log
):
    admin = await make_principal("human", system_role="admin")
    made = await shelf.upload(DATA, admin)
    [event] = audit_log.of("artifact.uploaded", made["id"])
    assert event.admin_override is True
    member_upload = await shelf.upload(b"mine")
    [own] = audit_log.of("artifact.uploaded", member_upload["id"])
    assert own.admin_override is False


async def test_a_weak_if_range_gets_the_whole_artifact(shelf):
    made = await shelf.upload(DATA)
    got = await shelf.client.get(
        made["url"],
        headers={
            **shelf.member.headers,
            "Range": "bytes=0-1",
            "If-Range": f'W/"{made["sha256"]}"',
        },
    )
    assert got.status_code == 200 and await got.get_data() == DATA
    assert got.headers["Content-Security-Policy"] == "sandbox"
    assert got.headers["X-Content-Type-Options"] == "nosniff"


def _toml(settings) -> str:
    """The test app's blob store and plugin tables as a configuration file."""
    lines = [f'blob_store_url = "{settings.blob_store_url}"']
    for plugin, table in settings.plugins.items():
        lines.append(f"[plugins.{plugin}]")
        lines += [f"{k} = {v!r}".replace("'", '"') for k, v in table.items()]
    return "\n".join(lines) + "\n"


async def test_the_gc_command_reports_and_refuses_an_unmigrated_database(
    shelf, buildmax_settings, clock, tmp_path
):
    made = await shelf.upload(DATA)
    await shelf.client.delete(f"{shelf.base}/{made['id']}", headers=shelf.member.headers)
    _register_commands()
    args = ["artifacts", "gc", "--grace-seconds", "0"]
    args += ["--data-dir", buildmax_settings.data_dir]
    if buildmax_settings.database_url:
        args += ["--database-url", buildmax_settings.database_url]
    config = tmp_path / "buildmax.toml"
    config.write_text(_toml(buildmax_settings))
    args += ["--config", str(config)]
    env = {"BUILDMAX_CONFIG": None}
    await asyncio.sleep(1.1)  # the blob's write time is the wall clock's, in whole ms
    dry = await asyncio.to_thread(
        CliRunner().invoke, cli, [*args, "--dry-run"], env=env, catch_exceptions=False
    )
    assert dry.exit_code == 0, dry.output
    key = f"artifacts/space/{shelf.space.id}/sha256/{sha(DATA)}"
    assert "would remove 1 orphan(s)" in dry.output and key in dry.output
    assert key in shelf.blob_files()
    empty = tmp_path / "empty"
    refused = await asyncio.to_thread(
        CliRunner().invoke,
        cli,
        ["artifacts", "gc", "--config", str(config), "--data-dir", str(empty)],
        env={**env, "BUILDMAX_DATABASE_URL": ""},
    )
    assert refused.exit_code != 0
    assert "buildmax db migrate" in refused.output and "Traceback" not in refused.output


@pytest.mark.parametrize("backend", ["file"], indirect=True)
async def test_gc_pointed_at_a_blob_directory_that_does_not_exist_tombstones_nothing(
    shelf, buildmax_settings, tmp_path
):
    """Run from the wrong directory, the collector would see no blob and
    tombstone every live artifact as lost: it refuses, naming the blob
    directory it looked for and --data-dir, and the artifact stays live.

    Mutation caught: commands.py ``gc_command`` without
    ``_refuse_a_missing_blob_root`` (the artifact is tombstoned as lost)."""
    made = await shelf.upload(DATA)
    database = buildmax_settings.database_url or (
        f"sqlite:///{Path(buildmax_settings.data_dir) / 'buildmax.db'}"
    )
    elsewhere = tmp_path / "elsewhere"
    _register_commands()

    refused = await asyncio.to_thread(
        CliRunner().invoke,
        cli,
        ["artifacts", "gc", "--database-url", database, "--data-dir", str(elsewhere)],
        env={"BUILDMAX_CONFIG": None, "BUILDMAX_BLOB_STORE_URL": None},
    )

    assert refused.exit_code == 1, refused.output
    assert f"no blob store at {elsewhere / 'blobs'}, and the database holds 1" in refused.output
    assert "--data-dir" in refused.output
    assert not elsewhere.exists()
    shown = await shelf.client.get(f"{shelf.base}/{made['id']}", headers=shelf.member.headers)
    assert shown.status_code == 200
