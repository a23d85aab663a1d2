"""``buildmax backup``: a backup taken while the server works, restored into
an empty target under a new authority epoch, on both engines.

The server here is the test app with every installed plugin (tasks,
artifacts, audit, marketplace, ...); the restored deployment is a second
app on the restored database, reached over HTTP like any client would."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from buildmax_hookspecs import hookimpl

from buildmax.app import blob_store, create_app
from buildmax.backups.create import create_backup
from buildmax.backups.layout import (
    BLOB_LIST,
    MANIFEST,
    PARTIAL_PREFIX,
    BackupError,
    backups_in,
    blob_path,
)
from buildmax.backups.manifest import listed_blobs
from buildmax.backups.restore import restore_backup
from buildmax.backups.runs import backup_running
from buildmax.backups.verify import check_database, verify_files
from buildmax.config import Config
from buildmax.spaces import put_member
from buildmax.tables import backup_runs, spaces
from buildmax.testing import (
    PrincipalHandle,
    SpaceHandle,
    call,
    serving,
)
from buildmax.tokens import issue_token


@pytest.fixture
def restore_target(buildmax_restore_target: Config) -> Config:
    """An empty target of the test's engine."""
    return buildmax_restore_target


class Deployment:
    """A space with an owner and an agent, a project, and helpers."""

    def __init__(
        self,
        app: Any,
        client: Any,
        owner: PrincipalHandle,
        agent: PrincipalHandle,
        space: SpaceHandle,
    ) -> None:
        self.app, self.client = app, client
        self.owner, self.agent, self.space = owner, agent, space
        self.base = f"/v1/spaces/{space.id}"

    async def task(self, title: str) -> str:
        body = {"project": "main", "title": title}
        created = await call(
            self.client, "POST", f"{self.base}/tasks", self.owner, json=body, expect=201
        )
        return str(created["id"])

    async def claim(self, task_id: str) -> dict[str, Any]:
        return await call(
            self.client,
            "POST",
            f"{self.base}/tasks/{task_id}/claim",
            self.agent,
            json={},
            expect=201,
        )

    async def upload(self, data: bytes, name: str) -> str:
        body = await call(
            self.client,
            "POST",
            f"{self.base}/artifacts?name={name}",
            self.agent,
            data=data,
            content_type="text/plain",
            expect=201,
        )
        return str(body["id"])

    async def increment(self, times: int = 1) -> None:
        for _ in range(times):
            await call(
                self.client, "POST", f"{self.base}/testplugin/increment", self.owner, expect=200
            )

    async def event_seq(self) -> int:
        async with self.app.db.read() as conn:
            return int(
                await conn.fetch_val(
                    sa.select(spaces.c.event_seq).where(spaces.c.id == self.space.pk)
                )
            )


@pytest.fixture
async def deployment(app, client, make_principal, make_space) -> Deployment:
    owner = await make_principal("human")
    agent = await make_principal("agent")
    space = await make_space(owner)
    async with app.db.write() as tx:
        await put_member(tx, space.pk, agent.pk, "member", app.clock.now_ms())
    d = Deployment(app, client, owner, agent, space)
    await call(client, "POST", f"{d.base}/projects", owner, json={"name": "main"}, expect=201)
    return d


async def backup(app: Any, target: Path, **kwargs: Any) -> Any:
    """A backup, a millisecond after the last (backups are named by time)."""
    app.clock.advance(ms=1)
    return await create_backup(app, target, **kwargs)


async def test_a_backup_restores_as_a_pair_under_a_new_epoch(
    deployment: Deployment, clock, restore_target: Config, tmp_path: Path
):
    """The whole journey: what the backup holds comes back, what came after
    it does not, and nothing issued before the restore is honoured or
    issued again. Catches: a restore that keeps the old tokens, leases or
    event ids, or loses a blob."""
    d = deployment
    claimed = await d.task("claimed before the backup")
    claim = await d.claim(claimed)
    assert claim["attempt"]["generation"] == 1
    async with d.app.db.write() as tx:
        session = await issue_token(
            tx, principal_pk=d.owner.pk, now=d.app.clock.now_ms(), origin="session"
        )
    kept = await d.upload(b"kept bytes", "kept.txt")
    await d.increment(3)
    seq_at_backup = await d.event_seq()

    created = await backup(d.app, tmp_path / "backups")

    # The lost timeline: more work after the backup.
    later = await d.upload(b"uploaded after the backup", "later.txt")
    await d.increment(5)
    lost_timeline_id = await d.event_seq()
    assert lost_timeline_id > seq_at_backup

    report = await restore_backup(restore_target, created.path)
    assert report.manifest_sha256 == created.manifest_sha256
    assert report.blobs_restored == 1 and report.lost_blobs == []
    assert report.admin_token is not None

    restored = create_app(restore_target, clock=clock)
    async with restored.test_app():
        client = restored.test_client()
        fresh = report.admin_token.secret
        # Every credential from before the restore is refused; the fresh one works.
        for old in (d.owner.token, d.agent.token, claim["token"], session.secret):
            await call(client, "GET", f"/v1/spaces/{d.space.id}", old, expect=401)
        await call(
            client,
            "POST",
            f"{d.base}/attempts/{claim['attempt']['id']}/renew",
            claim["token"],
            json={"generation": 1},
            expect=401,
        )
        await call(client, "GET", f"/v1/spaces/{d.space.id}", fresh, expect=200)
        # The artifact of the backup is back, byte for byte; the later one is not.
        content = await call(client, "GET", f"{d.base}/artifacts/{kept}/content", fresh, expect=200)
        assert content == b"kept bytes"
        await call(client, "GET", f"{d.base}/artifacts/{later}", fresh, expect=404)
        # The attempt active in the backup ended, uncharged; the task is claimable
        # again, past every generation handed out before.
        task = await call(client, "GET", f"{d.base}/tasks/{claimed}", fresh, expect=200)
        assert task["state"] == "ready"
        assert task["generation"] == 1 + 2**20
        attempts = await call(
            client, "GET", f"{d.base}/tasks/{claimed}/attempts", fresh, expect=200
        )
        assert [(a["state"], a["generation"]) for a in attempts["items"]] == [("expired", 1)]
        # A new agent token (the old one is revoked) claims it at the next generation.
        agent_token = await call(
            client,
            "POST",
            "/v1/tokens",
            fresh,
            json={"principal_id": d.agent.id, "name": "after"},
            expect=201,
        )
        again = await call(
            client,
            "POST",
            f"{d.base}/tasks/{claimed}/claim",
            agent_token["token"],
            json={},
            expect=201,
        )
        assert again["attempt"]["generation"] == 2 + 2**20
        # The audit trail records the restore and still verifies.
        events = await call(client, "GET", "/v1/audit?action=system.restored", fresh, expect=200)
        [restored_event] = events["items"]
        assert restored_event["details"]["manifest_sha256"] == created.manifest_sha256
        # The run that took the backup was running in its snapshot: it is
        # recorded as the success it was, holding no collector back.
        async with restored.db.read() as conn:
            runs = [dict(r) for r in await conn.fetch_all(sa.select(backup_runs))]
        assert [(r["state"], r["manifest_sha256"]) for r in runs] == [
            ("succeeded", created.manifest_sha256)
        ]
        # A subscriber resuming with an id of the lost timeline gets every new event.
        async with serving(restored) as base, httpx.AsyncClient(base_url=base, timeout=10) as http:
            headers = {"Authorization": f"Bearer {fresh}", "Last-Event-ID": str(lost_timeline_id)}
            async with http.stream("GET", f"{d.base}/events", headers=headers) as stream:
                assert stream.status_code == 200
                await call(client, "POST", f"{d.base}/testplugin/increment", fresh, expect=200)
                frame = await _next_event(stream)
        assert int(frame["id"]) == seq_at_backup + 2**32 + 1
        # The first is the restore's own: the attempt it ended.
        assert frame["event"] == "attempt.expired"
    from buildmax_audit.verify import verify_database

    check = create_app(restore_target, clock=clock)
    await check.db.connect()
    try:
        assert all(report.ok for report in await verify_database(check))
    finally:
        await check.db.close()


async def _next_event(stream: httpx.Response) -> dict[str, str]:
    event: dict[str, str] = {}

    async def read() -> dict[str, str]:
        async for line in stream.aiter_lines():
            if line == "" and "event" in event:
                return event
            if line and not line.startswith(":"):
                field, _, value = line.partition(": ")
                event[field] = value
        raise AssertionError("the stream ended")

    return await asyncio.wait_for(read(), 10)


class ThirdParty:
    """A plugin with its own blob, facts, check and epoch: the backup hooks
    as an extender meets them."""

    def __init__(self, *refs: tuple[str, int, str]) -> None:
        self.refs = refs
        self.checked: list[Any] = []
        self.restorations: list[Any] = []

    @hookimpl
    def buildmax_backup_blobs(self, conn: Any) -> Any:
        from buildmax_hookspecs import BlobRef

        async def blobs() -> AsyncIterator[BlobRef]:
            for ref in self.refs:
                yield BlobRef(*ref)
                yield BlobRef(*ref)  # named twice: listed and copied once

        return blobs()

    @hookimpl
    async def buildmax_backup_facts(self, conn: Any) -> dict[str, Any]:
        return {"principals": int(await conn.fetch_val(sa.text("SELECT count(*) FROM principals")))}

    @hookimpl
    def buildmax_backup_check(self, app: Any, facts: Any) -> list[str]:
        self.checked.append(dict(facts))
        return [] if facts.get("principals", 0) > 0 else ["thirdparty: no principal"]

    @hookimpl
    async def buildmax_restored(self, app: Any, tx: Any, restoration: Any) -> list[str]:
        self.restorations.append(restoration)
        return [f"thirdparty: {len(restoration.lost_blobs)} lost"]


async def test_a_plugins_blobs_facts_check_and_epoch_go_through_the_backup_hooks(
    app, clock, restore_target: Config, tmp_path: Path, make_principal
):
    """A plugin's referenced blob is copied (once), its facts land in the
    manifest under its name and come back to its check, and its restore
    hook gets the lost keys. Catches: a hook the backup forgets to call."""
    data = b"third-party bytes"
    await make_principal("human")
    ghost = ("thirdparty/sha256/" + "0" * 64, 5, "0" * 64)
    server = create_app(app.settings, clock=clock)
    await server.db.connect()
    try:
        ref = await blob_store(server).put("thirdparty", _stream(data))
        plugin = ThirdParty((ref.key, ref.size, ref.sha256), ghost)
        server.plugins.pm.register(plugin, name="thirdparty")
        created = await create_backup(server, tmp_path / "backups")
    finally:
        await server.db.close()
    manifest = created.manifest
    assert manifest.facts["thirdparty"] == {"principals": 1}
    assert [b.key for b in listed_blobs(created.path / BLOB_LIST)] == [ref.key, ghost[0]]
    assert manifest.missing_blobs == [ghost[0]]
    assert blob_path(created.path.parent, ref.sha256).read_bytes() == data
    report = await restore_backup(
        restore_target, created.path, extra_plugins=[("thirdparty", plugin)]
    )
    assert plugin.checked == [{"principals": 1}]
    [restoration] = plugin.restorations
    assert restoration.lost_blobs == frozenset({ghost[0]})
    assert restoration.manifest_sha256 == created.manifest_sha256
    assert "thirdparty: 1 lost" in report.lines
    assert report.lost_blobs == [ghost[0]]


async def _stream(data: bytes) -> AsyncIterator[bytes]:
    yield data


# -- the files -------------------------------------------------------------------------


async def test_a_backup_is_private_incremental_and_pruned(deployment: Deployment, tmp_path: Path):
    """Owner-only files and folders; a second backup into the same target
    copies no blob it already holds; ``keep`` removes older backups and the
    blobs only they used. Catches: a world-readable backup, a full copy each
    time, a prune that removes a blob a kept backup needs."""
    d = deployment
    first_id = await d.upload(b"first", "first.txt")
    target = tmp_path / "backups"
    first = await backup(d.app, target)
    assert first.blobs_copied == 1
    for path in [target, first.path, *first.path.iterdir(), *target.rglob("blobs/*/*")]:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o700 if path.is_dir() else 0o600), (path, oct(mode))
    second = await backup(d.app, target)
    assert second.blobs_copied == 0
    await call(d.client, "DELETE", f"{d.base}/artifacts/{first_id}", d.owner, expect=204)
    await d.upload(b"second", "second.txt")
    third = await backup(d.app, target, keep=2)
    assert third.blobs_copied == 1
    assert third.removed == [first.path]
    assert backups_in(target) == [second.path, third.path]
    # "first" is kept: the second backup still lists it.
    pooled = sorted(p.name for p in target.glob("blobs/*/*"))
    assert pooled == sorted(
        {b.sha256 for b in listed_blobs(second.path / BLOB_LIST)}
        | {b.sha256 for b in listed_blobs(third.path / BLOB_LIST)}
    )
    fourth = await backup(d.app, target, keep=1)
    assert backups_in(target) == [fourth.path]
    assert [p.read_bytes() for p in target.glob("blobs/*/*")] == [b"second"]
    async with d.app.db.read() as conn:
        runs = [dict(r) for r in await conn.fetch_all(sa.select(backup_runs))]
    assert [r["state"] for r in runs] == ["succeeded"] * 4
    assert runs[-1]["manifest_sha256"] == fourth.manifest_sha256
    assert runs[-1]["path"] == str(fourth.path)


async def test_a_failed_backup_leaves_nothing_that_looks_like_one(
    deployment: Deployment, tmp_path: Path, monkeypatch
):
    """A blob store failing mid-copy: no backup folder, no partial folder,
    the run recorded as failed with the reason, its lease ended. Catches:
    a partial backup left under a backup's name, a run left 'running'."""
    d = deployment
    await d.upload(b"will fail", "fail.txt")
    store = blob_store(d.app)

    async def broken(key: str, byte_range: Any = None) -> AsyncIterator[bytes]:
        yield b"partial"
        raise OSError("the disk went away")

    monkeypatch.setattr(store, "open", broken)
    target = tmp_path / "backups"
    with pytest.raises(OSError, match="the disk went away"):
        await backup(d.app, target)
    # The target's lock file and the blob pool's folders, nothing more.
    assert [p.name for p in target.iterdir() if p.name not in ("blobs", ".lock")] == []
    assert not any(p.is_file() for p in target.glob("blobs/**/*"))
    async with d.app.db.read() as conn:
        [run] = [dict(r) for r in await conn.fetch_all(sa.select(backup_runs))]
        assert not await backup_running(conn, d.app.clock.now_ms())
    assert run["state"] == "failed" and "the disk went away" in run["error"]


async def test_the_collector_keeps_blobs_while_a_backup_holds_its_lease(
    deployment: Deployment, tmp_path: Path
):
    """A blob deleted from the database after the backup's snapshot must
    still be there when the backup copies it. Catches: gc deleting orphans
    while a backup runs."""
    from buildmax_artifacts.gc import collect

    from buildmax.backups.runs import finish_run, start_run

    d = deployment
    artifact = await d.upload(b"deleted after the snapshot", "gone.txt")
    await call(d.client, "DELETE", f"{d.base}/artifacts/{artifact}", d.owner, expect=204)
    d.app.clock.advance(seconds=3600)
    run = await start_run(d.app, str(tmp_path / "b"))
    report = await collect(d.app, grace_ms=0)
    assert report.orphans == []
    await finish_run(d.app, run, ok=True)
    report = await collect(d.app, grace_ms=0)
    assert len(report.orphans) == 1


# -- verify and bad inputs ------------------------------------------------------------


@pytest.fixture
async def taken(deployment: Deployment, tmp_path: Path) -> Any:
    await deployment.upload(b"verified bytes", "v.txt")
    return await backup(deployment.app, tmp_path / "backups")


@pytest.mark.engine_independent
async def test_verify_passes_a_whole_backup_and_names_a_skipped_blob(taken: Any, app):
    """Catches: a backup missing one blob passing verification."""
    assert verify_files(taken.path).blob_count == 1
    await check_database(app.settings, taken.path, taken.manifest)
    [blob] = listed_blobs(taken.path / BLOB_LIST)
    blob_path(taken.path.parent, blob.sha256).unlink()
    with pytest.raises(BackupError, match=f"blob {blob.key} .* is missing from the backup"):
        verify_files(taken.path)


@pytest.mark.engine_independent
@pytest.mark.parametrize(
    "damage, message",
    [
        ("truncate-db", "database.sqlite holds .* bytes where the manifest says"),
        ("flip-db", "database.sqlite: its sha256 is not the manifest's"),
        ("wrong-digest", "database.sqlite: its sha256 is not the manifest's"),
        ("truncate-manifest", "is not JSON"),
        ("damage-blob", "is damaged in the backup"),
        ("drop-list-line", "lists 0 blob"),
    ],
)
async def test_a_damaged_backup_is_refused_naming_the_damage(
    taken: Any, restore_target: Config, damage: str, message: str
):
    """Each damage refused by verify and by restore with one line, the
    target left empty. Catches: a digest not checked, a restore that
    starts before checking."""
    folder = taken.path
    _damage(folder, damage)
    with pytest.raises(BackupError, match=message):
        verify_files(folder)
    with pytest.raises(BackupError, match=message):
        await restore_backup(restore_target, folder)
    assert not _exists(restore_target.data_dir)


def _exists(path: str) -> bool:
    return os.path.exists(path)


def _damage(folder: Path, damage: str) -> None:
    """Damage the backup in ``folder`` the way ``damage`` names."""
    database = folder / "database.sqlite"
    if damage == "truncate-db":
        database.write_bytes(database.read_bytes()[:4096])
    elif damage == "flip-db":
        raw = bytearray(database.read_bytes())
        raw[-1] ^= 1
        database.write_bytes(bytes(raw))
    elif damage == "wrong-digest":
        body = json.loads((folder / MANIFEST).read_text())
        body["parts"]["database.sqlite"]["sha256"] = "0" * 64
        (folder / MANIFEST).write_text(json.dumps(body))
    elif damage == "truncate-manifest":
        (folder / MANIFEST).write_bytes((folder / MANIFEST).read_bytes()[:100])
    elif damage == "damage-blob":
        [blob] = listed_blobs(folder / BLOB_LIST)
        blob_path(folder.parent, blob.sha256).write_bytes(b"tampered bytes")
    elif damage == "drop-list-line":
        body = json.loads((folder / MANIFEST).read_text())
        (folder / BLOB_LIST).write_bytes(b"")
        body["parts"][BLOB_LIST] = {"size": 0, "sha256": hashlib.sha256(b"").hexdigest()}
        (folder / MANIFEST).write_text(json.dumps(body))


@pytest.mark.engine_independent
async def test_a_backup_of_a_newer_schema_is_refused(taken: Any, restore_target: Config):
    """Catches: restoring tables this code cannot read."""
    body = json.loads((taken.path / MANIFEST).read_text())
    body["migrations"]["kernel"] += 1
    (taken.path / MANIFEST).write_text(json.dumps(body))
    with pytest.raises(BackupError, match="the backup's schema is newer than this BuildMax"):
        await restore_backup(restore_target, taken.path)
    assert not _exists(restore_target.data_dir)


async def test_a_target_holding_a_database_is_refused_unless_replaced(
    taken: Any, restore_target: Config
):
    """The second restore into the same target is refused and changes
    nothing; with ``replace`` the old SQLite files are moved aside.
    Catches: a restore over a live deployment."""
    first = await restore_backup(restore_target, taken.path)
    assert first.admin_token is not None
    with pytest.raises(BackupError, match=r"exists|is not empty"):
        await restore_backup(restore_target, taken.path)
    check = create_app(restore_target)
    await check.db.connect()
    try:
        async with check.db.read() as conn:
            tokens_live = await conn.fetch_val(
                sa.text("SELECT count(*) FROM tokens WHERE revoked_at IS NULL")
            )
    finally:
        await check.db.close()
    assert tokens_live == 1  # the first restore's admin token, untouched
    second = await restore_backup(restore_target, taken.path, replace=True)
    assert second.admin_token is not None
    [aside] = second.set_aside
    assert aside.startswith(
        "moved the old buildmax.db aside to"
        if restore_target.engine == "sqlite"
        else "renamed the old schema public to before_restore_"
    )


async def test_keep_tokens_keeps_api_tokens_and_ends_the_rest(
    deployment: Deployment, clock, restore_target: Config, tmp_path: Path
):
    """Catches: --keep-tokens keeping an attempt token alive."""
    d = deployment
    claim = await d.claim(await d.task("kept tokens"))
    created = await backup(d.app, tmp_path / "backups")
    await restore_backup(restore_target, created.path, keep_tokens=True)
    restored = create_app(restore_target, clock=clock)
    async with restored.test_app():
        client = restored.test_client()
        await call(client, "GET", f"/v1/spaces/{d.space.id}", d.owner.token, expect=200)
        await call(
            client,
            "POST",
            f"{d.base}/attempts/{claim['attempt']['id']}/renew",
            claim["token"],
            json={"generation": 1},
            expect=401,
        )


async def test_an_artifact_whose_blob_is_lost_is_tombstoned_and_listed(
    deployment: Deployment, clock, restore_target: Config, tmp_path: Path
):
    """A blob the store had lost before the backup: listed as missing by the
    backup, tombstoned as lost by the restore (audited, quota given back).
    Catches: a restored row naming a blob that is not there."""
    d = deployment
    lost = await d.upload(b"lost before the backup", "lost.txt")
    kept = await d.upload(b"kept", "kept.txt")
    async with d.app.db.read() as conn:
        key = await conn.fetch_val(
            sa.text(f"SELECT blob_key FROM artifact_artifacts WHERE public_id = '{lost}'")
        )
    await blob_store(d.app).delete(key)
    created = await backup(d.app, tmp_path / "backups")
    assert created.manifest.missing_blobs == [key]
    verify_files(created.path)  # a declared loss is not damage
    report = await restore_backup(restore_target, created.path)
    assert report.lost_blobs == [key]
    assert any(lost in line for line in report.lines)
    restored = create_app(restore_target, clock=clock)
    assert report.admin_token is not None
    fresh = report.admin_token.secret
    async with restored.test_app():
        client = restored.test_client()
        await call(client, "GET", f"{d.base}/artifacts/{lost}", fresh, expect=404)
        assert (
            await call(client, "GET", f"{d.base}/artifacts/{kept}/content", fresh, expect=200)
            == b"kept"
        )
        audit = await call(client, "GET", "/v1/audit?action=artifact.lost", fresh, expect=200)
        assert [e["target"]["id"] for e in audit["items"]] == [lost]
        async with restored.db.read() as conn:
            used = await conn.fetch_val(
                sa.text(f"SELECT used FROM artifact_quotas WHERE scope = 'space:{d.space.id}'")
            )
        assert used == len(b"kept")


# -- the commands ---------------------------------------------------------------------


@pytest.mark.engine_independent
def test_the_commands_take_verify_and_restore_a_backup(tmp_path: Path, monkeypatch) -> None:
    """What an operator sees: one line per backup, a verify naming the first
    problem with exit 1, a restore that prints a working admin token once
    and refuses a second time. Catches: a command exiting 0 on a failure."""
    from click.testing import CliRunner

    from buildmax.cli import _register_commands, cli

    for name in list(os.environ):
        if name.startswith("BUILDMAX_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    _register_commands()
    runner = CliRunner()

    def run(*args: str) -> tuple[int, str]:
        result = runner.invoke(cli, list(args))
        return result.exit_code, result.output

    assert run("admin", "bootstrap", "--data-dir", "live")[0] == 0
    code, out = run("backup", "create", "--data-dir", "live", "--output", "bk")
    assert code == 0, out
    [line] = out.splitlines()
    assert line.startswith(f"backup {tmp_path / 'bk' / 'buildmax-'}") and "(sqlite)" in line
    code, out = run("backup", "verify", "bk")
    assert code == 0 and "verifies (files and database)" in out, out
    code, out = run("backup", "restore", "bk", "--data-dir", "restored")
    assert code == 0, out
    assert "revoked 1 token(s)" in out
    token = out.split("shown once, keep it safe):")[1].split()[0]
    assert token.startswith("bmx_") and out.count(token) == 1
    code, out = run("backup", "restore", "bk", "--data-dir", "restored")
    assert code == 1 and "exists: restore into an empty data directory" in out, out
    assert "Traceback" not in out
    [folder] = backups_in(tmp_path / "bk")
    (folder / "database.sqlite").write_bytes(b"")
    code, out = run("backup", "verify", str(folder))
    assert code == 1, out
    assert out.strip() == (
        "Error: database.sqlite holds 0 bytes where the manifest says "
        f"{json.loads((folder / MANIFEST).read_text())['parts']['database.sqlite']['size']} "
        "bytes (truncated?)"
    )
    assert PARTIAL_PREFIX not in "".join(p.name for p in (tmp_path / "bk").iterdir())


@pytest.mark.postgres_only
async def test_a_missing_or_older_pg_dump_is_refused_writing_nothing(app, tmp_path: Path):
    """Catches: a backup started without a dump tool, or with one too old
    to read the server."""
    empty = tmp_path / "no-tools"
    empty.mkdir()
    app.settings = app.settings.replace(pg_bin_dir=str(empty))
    with pytest.raises(
        BackupError, match=re.escape(f"pg_dump is not installed (looked in {empty})")
    ):
        await create_backup(app, tmp_path / "backups")
    old = tmp_path / "old-tools"
    old.mkdir()
    (old / "pg_dump").write_text("#!/bin/sh\necho 'pg_dump (PostgreSQL) 9.6.24'\n")
    (old / "pg_dump").chmod(0o755)
    app.settings = app.settings.replace(pg_bin_dir=str(old))
    with pytest.raises(BackupError, match="pg_dump is version 9, older than the PostgreSQL server"):
        await create_backup(app, tmp_path / "backups")
    assert not (tmp_path / "backups").exists()
    async with app.db.read() as conn:
        runs = [dict(r) for r in await conn.fetch_all(sa.select(backup_runs))]
    # Each refusal is recorded for diagnostics, as a failed run with its reason.
    assert [(r["state"], r["error"][:24]) for r in runs] == [
        ("failed", "pg_dump is not installed"),
        ("failed", "pg_dump is version 9, ol"),
    ]


@pytest.mark.engine_independent
async def test_a_database_password_reaches_the_tool_only_through_a_private_passfile(
    tmp_path: Path,
):
    """Catches: the password on pg_dump's command line (any user of the
    machine reads it there) or a passfile left behind."""
    from buildmax.backups import pg_tools

    seen = tmp_path / "seen"
    tool = tmp_path / "pg_dump"
    tool.write_text(
        "#!/bin/sh\n"
        f'echo "$@" > {seen}.args\n'
        f'cat "$PGPASSFILE" > {seen}.pass\n'
        f'stat -c %a "$PGPASSFILE" > {seen}.mode\n'
        f'echo "$PGPASSFILE" > {seen}.path\n'
    )
    tool.chmod(0o755)
    await pg_tools.run_tool(str(tool), "postgresql://bm:s3cr:et@db.example:5433/prod", ["-Fc"])
    found = _what_the_tool_saw(seen)
    assert "s3cr" not in found["args"]
    assert "--dbname=postgresql://bm@db.example:5433/prod" in found["args"]
    assert found["pass"] == "*:*:*:*:s3cr\\:et\n"
    assert found["mode"].strip() == "600"
    assert not found["left"]


def _what_the_tool_saw(seen: Path) -> dict[str, Any]:
    found: dict[str, Any] = {
        part: Path(f"{seen}.{part}").read_text() for part in ("args", "pass", "mode", "path")
    }
    found["left"] = Path(found["path"].strip()).exists()
    return found


# -- what happened after the backup ----------------------------------------------------


async def _export(app: Any, path: Path) -> None:
    from buildmax_audit.export import export_lines

    lines = [line async for line in export_lines(app, await _plan(app))]
    await asyncio.to_thread(path.write_text, "".join(lines))


async def _plan(app: Any) -> Any:
    from buildmax_audit.export import plan

    return await plan(app)


async def test_what_an_audit_export_shows_after_the_backup_is_reapplied(
    deployment: Deployment, admin, make_principal, clock, restore_target: Config, tmp_path: Path
):
    """A token revoked, a principal disabled, a member removed and a password
    changed after the backup do not come back with it. Catches: a restore
    that hands back rights taken away since (here with --keep-tokens, where
    the old tokens would otherwise all work)."""
    d = deployment
    departed = await make_principal("agent")
    demoted = await make_principal("agent")
    async with d.app.db.write() as tx:
        await put_member(tx, d.space.pk, demoted.pk, "member", d.app.clock.now_ms())
    spare = await call(d.client, "POST", "/v1/tokens", d.owner, json={"name": "spare"}, expect=201)
    twin = await call(d.client, "POST", "/v1/tokens", d.owner, json={"name": "twin"}, expect=201)
    await call(
        d.client,
        "PATCH",
        f"/v1/principals/{d.owner.id}",
        admin,
        json={"password": "the password of the backup"},
        expect=200,
    )
    created = await backup(d.app, tmp_path / "backups")
    await call(d.client, "DELETE", f"/v1/tokens/{spare['id']}", d.owner, expect=204)
    await call(d.client, "POST", f"/v1/tokens/{twin['id']}/rotate", d.owner, expect=201)
    await call(
        d.client,
        "PUT",
        f"{d.base}/members/{demoted.id}",
        d.owner,
        json={"role": "viewer"},
        expect=200,
    )
    await call(
        d.client,
        "PATCH",
        f"/v1/principals/{departed.id}",
        admin,
        json={"disabled": True},
        expect=200,
    )
    await call(d.client, "DELETE", f"{d.base}/members/{d.agent.id}", d.owner, expect=204)
    await call(
        d.client,
        "PATCH",
        f"/v1/principals/{d.owner.id}",
        admin,
        json={"password": "a new long password"},
        expect=200,
    )
    trail = tmp_path / "trail.jsonl"
    await _export(d.app, trail)

    report = await restore_backup(
        restore_target, created.path, keep_tokens=True, audit_export=str(trail)
    )
    assert any("revoked again" in line for line in report.lines), report.lines
    restored = create_app(restore_target, clock=clock)
    async with restored.test_app():
        client = restored.test_client()
        await call(client, "GET", f"/v1/spaces/{d.space.id}", spare["token"], expect=401)
        await call(client, "GET", f"/v1/spaces/{d.space.id}", twin["token"], expect=401)
        await call(
            client,
            "POST",
            f"{d.base}/tasks",
            demoted.token,
            json={"project": "main", "title": "a viewer cannot"},
            expect=403,
        )
        await call(client, "GET", "/v1/principals/me", departed.token, expect=401)
        await call(client, "GET", f"/v1/spaces/{d.space.id}", d.agent.token, expect=404)
        await call(client, "GET", f"/v1/spaces/{d.space.id}", d.owner.token, expect=200)
        async with restored.db.read() as conn:
            hash_ = await conn.fetch_val(
                sa.text(f"SELECT password_hash FROM principals WHERE public_id = '{d.owner.id}'")
            )
        assert hash_ is None
        audit = await call(
            client, "GET", "/v1/audit?action=system.restored", admin.token, expect=200
        )
        assert audit["items"][0]["details"]["replayed_events"] >= 6


async def test_an_audit_export_of_another_timeline_is_refused_changing_nothing(
    deployment: Deployment, restore_target: Config, tmp_path: Path
):
    """Catches: re-applying the events of a trail that does not continue
    the backup's (another deployment's, or taken before the backup)."""
    d = deployment
    trail = tmp_path / "early.jsonl"
    await d.increment()
    await call(d.client, "POST", "/v1/tokens", d.owner, json={"name": "x"}, expect=201)
    await _export(d.app, trail)
    await call(d.client, "POST", "/v1/tokens", d.owner, json={"name": "y"}, expect=201)
    created = await backup(d.app, tmp_path / "backups")
    with pytest.raises(BackupError, match="does not continue the backup's audit chain"):
        await restore_backup(restore_target, created.path, audit_export=str(trail))
    assert not _exists(restore_target.data_dir)


async def test_a_damaged_blob_in_the_pool_is_copied_again(deployment: Deployment, tmp_path: Path):
    """An earlier backup's pooled blob damaged on disk (same size): the next
    backup does not reuse it, it copies it again. Catches: reusing a pooled
    blob by its size alone."""
    d = deployment
    await d.upload(b"precious bytes", "p.txt")
    target = tmp_path / "backups"
    first = await backup(d.app, target)
    [blob] = listed_blobs(first.path / BLOB_LIST)
    pooled = blob_path(target, blob.sha256)
    _rewrite(pooled, b"PRECIOUS BYTES")
    second = await backup(d.app, target)
    assert second.blobs_copied == 1
    verify_files(first.path)  # the first backup is whole again too
    assert _read(pooled) == b"precious bytes"


def _rewrite(path: Path, data: bytes) -> None:
    path.chmod(0o600)
    path.write_bytes(data)


def _read(path: Path) -> bytes:
    return path.read_bytes()


@pytest.mark.engine_independent
def test_a_terminal_gets_a_progress_bar_and_a_pipe_does_not(tmp_path: Path) -> None:
    """Catches: a backup that shows nothing on a terminal for minutes, or
    that writes bar frames into a timer's log."""
    import pty
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("BUILDMAX_")}
    command = [sys.executable, "-m", "buildmax"]
    subprocess.run(
        [*command, "db", "migrate", "--data-dir", "d"],
        cwd=tmp_path,
        env=env,
        check=True,
        capture_output=True,
    )
    leader, follower = pty.openpty()
    done = subprocess.run(
        [*command, "backup", "create", "--data-dir", "d", "--output", "tty"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=follower,
        timeout=120,
    )
    os.close(follower)
    shown = _drain(leader)
    assert done.returncode == 0
    assert "database" in shown and "100%" in shown, shown
    piped = subprocess.run(
        [*command, "backup", "create", "--data-dir", "d", "--output", "pipe"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert piped.returncode == 0 and piped.stderr == "", piped.stderr
    assert piped.stdout.startswith("backup ")


def _drain(fd: int) -> str:
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks).decode(errors="replace")


async def test_a_restore_failing_after_the_database_is_placed_leaves_the_target_as_it_was(
    taken: Any, restore_target: Config, monkeypatch
):
    """The epoch's transaction fails: the target is emptied again (no
    database with the old credentials in it is left to serve) and, with
    --replace, the old files come back. Catches: a half-restored target."""
    from buildmax.backups import restore as restore_module

    first = await restore_backup(restore_target, taken.path)
    assert first.admin_token is not None

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the disk filled up")

    monkeypatch.setattr(restore_module, "enter_epoch", broken)
    with pytest.raises(RuntimeError, match="the disk filled up"):
        await restore_backup(restore_target, taken.path, replace=True)
    monkeypatch.undo()
    # The first restore's deployment is back, its admin token working.
    check = create_app(restore_target)
    async with check.test_app():
        await call(
            check.test_client(), "GET", "/v1/principals/me", first.admin_token.secret, expect=200
        )


async def test_a_blob_damaged_in_the_store_is_left_out_and_listed(
    deployment: Deployment, tmp_path: Path
):
    """The store holds other bytes than the row's digest: the backup goes
    on without them and lists the key as lost. Catches: copying damaged
    bytes into a backup that then verifies."""
    d = deployment
    artifact = await d.upload(b"original bytes", "o.txt")
    async with d.app.db.read() as conn:
        key = await conn.fetch_val(
            sa.text(f"SELECT blob_key FROM artifact_artifacts WHERE public_id = '{artifact}'")
        )
    store = blob_store(d.app)
    _rewrite(Path(store.root) / key, b"damaged bytes!")  # type: ignore[attr-defined]
    created = await backup(d.app, tmp_path / "backups")
    assert created.manifest.missing_blobs == [key]
    verify_files(created.path)


async def test_a_second_backup_into_the_same_target_is_refused_while_one_runs(
    deployment: Deployment, tmp_path: Path
):
    """Catches: two backups pruning each other's blobs."""
    from buildmax.backups.layout import target_lock

    target = tmp_path / "backups"
    target.mkdir(mode=0o700)
    with target_lock(target), pytest.raises(BackupError, match="another backup is being"):
        await backup(deployment.app, target)
    assert (await backup(deployment.app, target)).path.parent == target


@pytest.mark.engine_independent
def test_backup_list_shows_the_backups_and_the_last_runs(tmp_path: Path, monkeypatch) -> None:
    """What an operator checks each morning: the backups there are, the last
    run and the last success, with the failure's reason. Catches: a failed
    run that looks like a success."""
    from click.testing import CliRunner

    from buildmax.cli import _register_commands, cli

    for name in list(os.environ):
        if name.startswith("BUILDMAX_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    _register_commands()

    def run(*args: str) -> tuple[int, str]:
        result = CliRunner().invoke(cli, list(args))
        return result.exit_code, result.output

    assert run("db", "migrate", "--data-dir", "d")[0] == 0
    code, out = run("backup", "list", "--data-dir", "d", "--output", "bk")
    assert code == 0, out
    assert out.splitlines() == [
        f"no backup in {tmp_path / 'bk'}",
        "last run: none recorded",
        "last success: none recorded",
    ]
    assert run("backup", "create", "--data-dir", "d", "--output", "bk")[0] == 0
    monkeypatch.setattr("buildmax.backups.create.private_dir", _refuse)
    code, out = run("backup", "create", "--data-dir", "d", "--output", "bk")
    assert code == 1, out
    code, out = run("backup", "list", "--data-dir", "d", "--output", "bk")
    lines = out.splitlines()
    assert code == 0 and len(lines) == 3, out
    assert lines[0].startswith("buildmax-") and " sqlite " in lines[0]
    assert lines[1].startswith("last run: failed, started ") and "disk full" in lines[1]
    assert lines[2].startswith("last success: succeeded, started ")


def _refuse(path: Path) -> Path:
    raise OSError(28, "disk full")


def test_the_events_after_a_backup_come_from_buildmax_restore_replay(tmp_path: Path) -> None:
    """Each plugin is asked with the facts it recorded; what they return is
    the replay, in their order; a ValueError refuses the file. Catches:
    facts handed to the wrong plugin."""
    from buildmax_hookspecs import AuditEvent

    asked: list[tuple[str, Any]] = []
    event = AuditEvent(
        time=1,
        action="token.revoked",
        actor_id=None,
        actor_kind="system",
        space_id=None,
        target_type="token",
        target_id="tk_1",
    )

    class Trail:
        @hookimpl
        def buildmax_restore_replay(self, path: str, facts: Any) -> list[AuditEvent]:
            asked.append((path, dict(facts)))
            if facts.get("refuse"):
                raise ValueError("not this file")
            return [event]

    app = create_app(
        Config(data_dir=str(tmp_path), load_plugins=""), extra_plugins=[("trail", Trail())]
    )
    assert app.hooks.restore_replay("x.jsonl", {"trail": {"n": 1}, "other": {"n": 2}}) == [event]
    assert asked == [("x.jsonl", {"n": 1})]
    with pytest.raises(ValueError, match="not this file"):
        app.hooks.restore_replay("x.jsonl", {"trail": {"refuse": True}})


@pytest.mark.engine_independent
async def test_replace_is_refused_while_a_server_has_the_database_open(
    taken: Any, restore_target: Config
):
    """Catches: moving a live database aside under a running server (its
    writes would land in neither database)."""
    first = await restore_backup(restore_target, taken.path)
    assert first.admin_token is not None
    db = Path(restore_target.data_dir) / "buildmax.db"
    holder = _hold_open(db)
    try:
        with pytest.raises(BackupError, match=r"is open in a running server: stop it first"):
            await restore_backup(restore_target, taken.path, replace=True)
        assert _exists(str(db)) and not _exists(str(db) + "-wal.before-restore")
        assert not [p for p in os.listdir(db.parent) if ".before-restore-" in p]
    finally:
        _release(holder)


def _hold_open(db: Path) -> Any:
    """Another process with the database open, as a server has it."""
    import subprocess
    import sys

    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_OPEN, str(db)], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
    return holder


def _release(holder: Any) -> None:
    holder.kill()
    holder.wait()
    holder.stdout.close()


_HOLD_OPEN = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1])
conn.execute("PRAGMA journal_mode = WAL").fetchall()
conn.execute("SELECT count(*) FROM principals").fetchall()
print("open", flush=True)
time.sleep(60)
"""


@pytest.mark.engine_independent
async def test_a_data_dir_holding_only_a_log_is_not_empty(taken: Any, restore_target: Config):
    """A ``buildmax.db-wal`` alone may hold committed writes. Catches:
    restoring over it as if the directory were empty."""
    data = Path(restore_target.data_dir)
    _write_log(data)
    with pytest.raises(BackupError, match=r"buildmax\.db-wal exists"):
        await restore_backup(restore_target, taken.path)


def _write_log(data: Path) -> None:
    data.mkdir(parents=True)
    (data / "buildmax.db-wal").write_bytes(bytes(32))


@pytest.mark.engine_independent
async def test_a_blob_list_that_disagrees_with_the_rows_is_refused(
    taken: Any, restore_target: Config, app
):
    """A list naming a blob no row references (its digests fixed up): the
    database and the list are not one pair. Catches: a restore storing
    bytes under keys no row names, or a row's blob left unchecked."""
    _forge_list(taken.path)
    with pytest.raises(BackupError, match="which no row references"):
        await check_database(app.settings, taken.path, verify_files(taken.path))
    with pytest.raises(BackupError, match="which no row references"):
        await restore_backup(restore_target, taken.path)


def _forge_list(folder: Path) -> None:
    """Add a well-formed blob entry, its bytes in the pool, digests fixed up."""
    data = b"smuggled"
    sha = hashlib.sha256(data).hexdigest()
    pooled = blob_path(folder.parent, sha)
    pooled.parent.mkdir(parents=True, exist_ok=True)
    pooled.write_bytes(data)
    listing = folder / BLOB_LIST
    listing.write_bytes(
        listing.read_bytes()
        + (
            json.dumps({"key": f"artifacts/x/sha256/{sha}", "sha256": sha, "size": 8}) + "\n"
        ).encode()
    )
    body = json.loads((folder / MANIFEST).read_text())
    body["parts"][BLOB_LIST] = {
        "size": listing.stat().st_size,
        "sha256": hashlib.sha256(listing.read_bytes()).hexdigest(),
    }
    body["blob_count"] += 1
    body["blob_bytes"] += 8
    (folder / MANIFEST).write_text(json.dumps(body))


async def test_the_lease_is_renewed_while_the_database_is_copied(
    deployment: Deployment, tmp_path: Path, monkeypatch
):
    """A database copy or dump longer than the lease: the lease is renewed
    meanwhile, so the collector keeps every blob. Catches: renewing only
    while blobs are copied."""
    from buildmax.backups import create as create_module
    from buildmax.backups.runs import LEASE_MS

    d = deployment
    await d.upload(b"kept by the lease", "k.txt")
    monkeypatch.setattr(create_module, "RENEW_AFTER_MS", 10)
    seen: list[bool] = []
    dump = create_module._dump

    async def slow_dump(*args: Any) -> Any:
        d.app.clock.advance(ms=LEASE_MS + 1000)  # past the lease the run started with
        await asyncio.sleep(0.2)  # the keeper renews meanwhile
        async with d.app.db.read() as conn:
            seen.append(await backup_running(conn, d.app.clock.now_ms()))
        return await dump(*args)

    monkeypatch.setattr(create_module, "_dump", slow_dump)
    await backup(d.app, tmp_path / "backups")
    assert seen == [True]


@pytest.mark.postgres_only
async def test_a_postgresql_restore_cut_off_before_its_epoch_is_not_served(
    taken: Any, restore_target: Config, monkeypatch
):
    """A restore killed after pg_restore committed and before the epoch did
    (simulated: the epoch fails and nothing is undone): the database holds
    the backup's credentials, and a server refuses to start on it. Catches:
    serving a half-restored database."""
    from buildmax.backups import restore as restore_module

    async def killed(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("killed")

    async def nothing(*args: Any, **kwargs: Any) -> None:
        return None

    monkeypatch.setattr(restore_module, "enter_epoch", killed)
    monkeypatch.setattr(restore_module, "undo_placement", nothing)
    with pytest.raises(RuntimeError, match="killed"):
        await restore_backup(restore_target, taken.path)
    server = create_app(restore_target)
    with pytest.raises(Exception, match="a restore into this database did not finish"):
        async with server.test_app():
            pass
    monkeypatch.undo()
    report = await restore_backup(restore_target, taken.path, replace=True)
    assert report.admin_token is not None
    server = create_app(restore_target)
    async with server.test_app():
        await call(
            server.test_client(), "GET", "/v1/principals/me", report.admin_token.secret, expect=200
        )
