"""Uploading, listing, downloading and deleting artifacts (J08), and what a
refused upload must not leave behind."""

from __future__ import annotations

import asyncio
import os

import pytest
from buildmax_artifacts.tables import artifacts, quotas, uploads

from buildmax.spaces import put_member

from .conftest import MAX_BYTES, PROBLEM, QUOTA_BYTES, sha

DATA = os.urandom(100 * 1024) + b"the end"


async def test_j08_upload_list_download_in_the_owning_space_only(shelf, audit_log):
    made = await shelf.upload(DATA, name="run.log", sha256=sha(DATA))
    assert (made["size"], made["sha256"], made["media_type"]) == (
        len(DATA),
        sha(DATA),
        "text/plain",
    )
    assert made["created_by"] == shelf.member.id

    listed = await shelf.client.get(shelf.base, headers=shelf.owner.headers)
    assert [a["id"] for a in (await listed.get_json())["items"]] == [made["id"]]
    meta = await shelf.client.get(f"{shelf.base}/{made['id']}", headers=shelf.owner.headers)
    assert (await meta.get_json())["sha256"] == sha(DATA)

    got = await shelf.client.get(made["url"], headers=shelf.owner.headers)
    body = await got.get_data()
    assert got.status_code == 200 and sha(body) == made["sha256"] == sha(DATA)
    assert got.headers["Content-Length"] == str(len(DATA))
    assert got.headers["ETag"] == f'"{sha(DATA)}"'
    assert got.headers["Content-Type"].startswith("text/plain")
    assert got.headers["Content-Disposition"].startswith("inline")

    # Someone from another space sees nothing, by any route.
    for path in (shelf.base, f"{shelf.base}/{made['id']}", made["url"]):
        refused = await shelf.client.get(path, headers=shelf.outsider.headers)
        assert refused.status_code == 404
    # Nor through their own space.
    theirs = f"/v1/spaces/{shelf.other_space.id}/artifacts/{made['id']}"
    assert (await shelf.client.get(theirs, headers=shelf.outsider.headers)).status_code == 404

    [event] = audit_log.of("artifact.uploaded", made["id"])
    assert event.details["sha256"] == sha(DATA) and "content" not in event.details


async def test_the_list_filters_by_media_type_task_and_attempt(shelf):
    text = await shelf.upload(b"a", name="a.txt")
    xml = await shelf.upload(b"<a/>", name="a.xml", media_type="Application/XML; charset=utf-8")
    assert xml["media_type"] == "application/xml"

    async def ids(**query: str) -> list[str]:
        got = await shelf.client.get(shelf.base, headers=shelf.member.headers, query_string=query)
        assert got.status_code == 200, await got.get_json()
        return [a["id"] for a in (await got.get_json())["items"]]

    assert await ids() == [xml["id"], text["id"]]
    assert await ids(media_type="application/xml") == [xml["id"]]
    assert await ids(media_type="TEXT/PLAIN") == [text["id"]]
    assert await ids(media_type="image/png") == []
    assert await ids(task="tk_none") == [] and await ids(attempt="at_none") == []
    bad = await shelf.client.get(
        shelf.base, headers=shelf.member.headers, query_string={"media_type": "text"}
    )
    assert bad.status_code == 422
    assert (await bad.get_json())["errors"] == {"media_type": ["Invalid."]}


async def test_identical_bytes_are_stored_once_per_space(shelf):
    first = await shelf.upload(DATA, name="a")
    second = await shelf.upload(DATA, name="b")
    assert first["id"] != second["id"]
    assert len([f for f in shelf.blob_files() if "/sha256/" in f]) == 1


async def test_a_range_is_served_exactly(shelf):
    made = await shelf.upload(DATA)
    got = await shelf.client.get(
        made["url"], headers={**shelf.member.headers, "Range": "bytes=10-19"}
    )
    assert got.status_code == 206
    assert await got.get_data() == DATA[10:20]
    assert got.headers["Content-Range"] == f"bytes 10-19/{len(DATA)}"
    assert got.headers["Content-Length"] == "10"
    tail = await shelf.client.get(
        made["url"], headers={**shelf.member.headers, "Range": "bytes=-7"}
    )
    assert await tail.get_data() == b"the end"
    beyond = await shelf.client.get(
        made["url"], headers={**shelf.member.headers, "Range": f"bytes={len(DATA) + 5}-"}
    )
    assert beyond.status_code == 416
    assert (await beyond.get_json())["type"] == PROBLEM + "range-not-satisfiable"
    assert beyond.headers["Content-Range"] == f"bytes */{len(DATA)}"


@pytest.mark.parametrize(
    ("asked", "if_range", "status", "part"),
    [
        ("bytes=-1000000", None, 206, slice(None)),  # a suffix longer than the artifact
        ("bytes=5-1000000", None, 206, slice(5, None)),  # an end past the artifact
        ("bytes=0-0", None, 206, slice(0, 1)),
        ("bytes=0-1,5-6", None, 200, slice(None)),  # several ranges: served whole
        ("lines=0-1", None, 200, slice(None)),
        ("bytes=0-1", '"' + "0" * 64 + '"', 200, slice(None)),  # If-Range of another version
        ("bytes=0-1", "SHA", 206, slice(0, 2)),  # If-Range of this version
    ],
)
async def test_range_edge_cases_follow_rfc_9110(shelf, asked, if_range, status, part):
    made = await shelf.upload(DATA)
    headers = {**shelf.member.headers, "Range": asked}
    if if_range is not None:
        headers["If-Range"] = if_range.replace("SHA", f'"{made["sha256"]}"')
    got = await shelf.client.get(made["url"], headers=headers)
    assert got.status_code == status
    assert await got.get_data() == DATA[part]
    assert got.headers["Content-Length"] == str(len(DATA[part]))
    if status == 206:
        start = part.start or 0
        end = len(DATA) - 1 if part.stop is None else part.stop - 1
        assert got.headers["Content-Range"] == f"bytes {start}-{end}/{len(DATA)}"


async def test_an_empty_artifact_downloads_empty_and_refuses_any_range(shelf):
    made = await shelf.upload(b"")
    assert made["size"] == 0 and made["sha256"] == sha(b"")
    whole = await shelf.client.get(made["url"], headers=shelf.member.headers)
    assert whole.status_code == 200 and await whole.get_data() == b""
    for asked in ("bytes=0-", "bytes=-1"):
        got = await shelf.client.get(made["url"], headers={**shelf.member.headers, "Range": asked})
        assert got.status_code == 416
        assert got.headers["Content-Range"] == "bytes */0"


async def test_a_name_beyond_ascii_is_sent_as_rfc_6266_filename_star(shelf):
    made = await shelf.upload(b"x", name="résumé ✓.txt")
    assert made["name"] == "résumé ✓.txt"
    got = await shelf.client.get(made["url"], headers=shelf.member.headers)
    disposition = got.headers["Content-Disposition"]
    assert disposition == (
        "inline; filename=\"r_sum_ _.txt\"; filename*=UTF-8''r%C3%A9sum%C3%A9%20%E2%9C%93.txt"
    )
    disposition.encode("latin-1")  # a header value any client can read


async def test_what_is_not_safe_to_render_comes_as_an_attachment(shelf):
    made = await shelf.upload(b"<script>alert(1)</script>", name="x.html", media_type="text/html")
    got = await shelf.client.get(made["url"], headers=shelf.member.headers)
    assert got.headers["Content-Disposition"] == "attachment; filename=x.html"
    assert got.headers["X-Content-Type-Options"] == "nosniff"


async def test_an_upload_over_the_limit_is_refused_and_leaves_nothing(shelf):
    before = await shelf.leftovers()
    refused = await shelf.upload(b"x" * (MAX_BYTES + 1), expect=413)
    assert refused["type"] == PROBLEM + "payload-too-large"
    assert await shelf.leftovers() == before


async def test_a_wrong_digest_is_refused_and_leaves_nothing(shelf):
    before = await shelf.leftovers()
    refused = await shelf.upload(DATA, sha256="0" * 64, expect=422)
    assert refused["type"] == PROBLEM + "digest-mismatch"
    assert sha(DATA) in refused["detail"]
    assert await shelf.leftovers() == before
    await shelf.upload(DATA, sha256="NOTHEX", expect=422)


@pytest.mark.parametrize(
    ("query", "media_type"),
    [({"name": ""}, "text/plain"), ({"name": "a/b"}, "text/plain"), ({}, "not a type")],
)
async def test_bad_metadata_is_refused_before_any_byte_is_stored(shelf, query, media_type):
    before = await shelf.leftovers()
    response = await shelf.client.post(
        shelf.base,
        data=DATA,
        headers={**shelf.member.headers, "Content-Type": media_type},
        query_string={"name": "ok", **query},
    )
    assert response.status_code == 422
    assert await shelf.leftovers() == before


async def test_viewers_read_but_do_not_upload_and_outsiders_do_neither(shelf, make_principal):
    await shelf.upload(DATA, shelf.outsider, expect=404)
    viewer = await make_principal("agent")
    async with shelf.app.db.write() as tx:
        await put_member(tx, shelf.space.pk, viewer.pk, "viewer", shelf.app.clock.now_ms())
    await shelf.upload(DATA, viewer, expect=403)


async def test_an_upload_of_unknown_size_reserves_the_limit_and_counts_what_it_stored(shelf):
    await shelf.upload(DATA)  # the test client sends no Content-Length
    [row] = [r for r in await shelf.rows(quotas) if r["scope"] == "deployment"]
    assert (row["used"], row["reserved"]) == (len(DATA), 0)


async def test_concurrent_uploads_never_exceed_the_quota_together(shelf):
    piece = os.urandom(200 * 1024)
    answers = await asyncio.gather(
        *(
            shelf.client.post(
                shelf.base,
                data=piece + bytes([n]),
                headers={
                    **shelf.member.headers,
                    "Content-Type": "application/octet-stream",
                    "Content-Length": str(len(piece) + 1),
                },
                query_string={"name": f"p{n}"},
            )
            for n in range(8)
        )
    )
    statuses = sorted(a.status_code for a in answers)
    stored = statuses.count(201)
    assert stored == QUOTA_BYTES // (len(piece) + 1) == 5
    assert statuses == [201] * stored + [409] * (8 - stored)
    rows = {row["scope"]: row for row in await shelf.rows(quotas)}
    assert rows["deployment"]["used"] == stored * (len(piece) + 1) <= QUOTA_BYTES
    assert rows["deployment"]["reserved"] == 0


async def test_delete_leaves_a_tombstone_and_hides_the_artifact(shelf, audit_log):
    made = await shelf.upload(DATA)
    gone = await shelf.client.delete(f"{shelf.base}/{made['id']}", headers=shelf.owner.headers)
    assert gone.status_code == 204
    for path in (f"{shelf.base}/{made['id']}", made["url"]):
        assert (await shelf.client.get(path, headers=shelf.owner.headers)).status_code == 404
    [row] = await shelf.rows(artifacts)
    assert row["deleted_at"] is not None and row["deleted_by"] == shelf.owner.pk
    # Its quota is given back.
    assert {r["scope"]: r["used"] for r in await shelf.rows(quotas)}["deployment"] == 0
    assert audit_log.of("artifact.deleted", made["id"])
    again = await shelf.client.delete(f"{shelf.base}/{made['id']}", headers=shelf.owner.headers)
    assert again.status_code == 404


async def test_bytes_missing_from_the_store_are_a_clear_410(shelf):
    made = await shelf.upload(DATA)
    for path in shelf.blob_files():
        shelf.backend.remove(path)
    got = await shelf.client.get(made["url"], headers=shelf.member.headers)
    assert got.status_code == 410
    assert (await got.get_json())["type"] == PROBLEM + "blob-missing"


async def test_an_attempts_token_uploads_for_its_own_attempt(shelf):
    call = shelf.client
    owner = shelf.owner.headers
    base = f"/v1/spaces/{shelf.space.id}"
    made = await call.post(f"{base}/projects", headers=owner, json={"name": "main"})
    assert made.status_code == 201
    task = await (
        await call.post(f"{base}/tasks", headers=owner, json={"project": "main", "title": "t"})
    ).get_json()
    claim = await (
        await call.post(f"{base}/tasks/{task['id']}/claim", headers=shelf.member.headers, json={})
    ).get_json()
    uploaded = await shelf.upload(DATA, claim["token"])
    assert (uploaded["attempt_id"], uploaded["task_id"]) == (claim["attempt"]["id"], task["id"])
    refused = await shelf.upload(DATA, claim["token"], attempt="at_someone_else", expect=403)
    assert refused["type"] == PROBLEM + "forbidden"
    # A member names a task of the space, not one elsewhere.
    linked = await shelf.upload(DATA, task=task["id"])
    assert (linked["task_id"], linked["attempt_id"]) == (task["id"], None)
    await shelf.upload(DATA, task="tk_nowhere", expect=404)


async def test_an_upload_cut_off_mid_stream_leaves_nothing(shelf):
    before = await shelf.leftovers()
    sent = 0

    async def receive() -> dict[str, object]:
        nonlocal sent
        sent += 1
        if sent <= 3:
            return {"type": "http.request", "body": b"x" * 16384, "more_body": True}
        return {"type": "http.disconnect"}

    answers = await shelf.raw_upload(receive, "cut", 100000)
    assert not [a for a in answers if a["type"] == "http.response.start"]
    assert await shelf.leftovers() == before


class FailsAfterStoring:
    """A blob store that stores the bytes, then fails (a crash between the
    store and the database)."""

    def __init__(self, store: object) -> None:
        self.store = store

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)

    async def put(self, *args: object, **kwargs: object) -> object:
        await self.store.put(*args, **kwargs)  # type: ignore[attr-defined]
        raise OSError("injected: the store failed after storing the bytes")


async def test_bytes_stored_without_a_row_are_collected_and_nothing_is_visible(
    shelf, monkeypatch, clock, audit_log
):
    from buildmax_artifacts import routes
    from buildmax_artifacts.gc import collect

    real = routes.blob_store(shelf.app)
    monkeypatch.setattr(routes, "blob_store", lambda app: FailsAfterStoring(real))
    await shelf.upload(DATA, expect=500)
    monkeypatch.undo()
    assert await shelf.rows(artifacts) == []
    assert await shelf.rows(uploads) == []
    [orphan] = [f for f in shelf.blob_files() if "/sha256/" in f]

    # Young orphans are left alone (an upload may still be in flight).
    young = await collect(shelf.app, grace_ms=3_600_000)
    assert (young.orphans, young.young_orphans) == ([], 1)
    clock.advance(seconds=5)  # the blob's time is the wall clock's
    dry = await collect(shelf.app, grace_ms=0, dry_run=True)
    assert dry.orphans == [orphan] and shelf.blob_files() == [orphan]
    assert "artifact.blob_collected" not in audit_log.actions()
    done = await collect(shelf.app, grace_ms=0)
    assert done.orphans == [orphan] and shelf.blob_files() == []
    [event] = [e for e in audit_log.events if e.action == "artifact.blob_collected"]
    assert (event.space_id, event.details) == (
        shelf.space.id,
        {"sha256": sha(DATA), "size": len(DATA)},
    )
    assert (await collect(shelf.app, grace_ms=0)).orphans == []


async def test_gc_removes_what_a_dead_server_left_mid_upload_once_it_is_old(shelf, clock):
    from buildmax_artifacts.gc import collect

    kept = await shelf.upload(DATA)
    shelf.backend.leave_temporary()
    assert len(shelf.blob_files()) > 1
    assert (await collect(shelf.app, grace_ms=3_600_000, dry_run=True)).temporary_removed == 0
    if shelf.backend.kind == "file":  # moto dates every multipart upload in 2010
        young = await collect(shelf.app, grace_ms=3_600_000)
        assert young.temporary_removed == 0 and len(shelf.blob_files()) == 2
    clock.advance(seconds=7200)
    done = await collect(shelf.app, grace_ms=3_600_000)
    assert done.temporary_removed >= 1
    assert [k for k in shelf.blob_files()] == [
        f"artifacts/space/{shelf.space.id}/sha256/{sha(DATA)}"
    ]
    got = await shelf.client.get(kept["url"], headers=shelf.member.headers)
    assert await got.get_data() == DATA


async def test_an_artifact_whose_bytes_vanished_is_410_then_tombstoned_by_gc(shelf, audit_log):
    from buildmax_artifacts.gc import collect

    made = await shelf.upload(DATA)
    kept = await shelf.upload(b"other bytes")
    for path in shelf.blob_files():
        if sha(DATA) in path:
            shelf.backend.remove(path)
    got = await shelf.client.get(made["url"], headers=shelf.member.headers)
    assert got.status_code == 410
    report = await collect(shelf.app, grace_ms=0)
    assert report.lost == [made["id"]]
    used = {r["scope"]: r["used"] for r in await shelf.rows(quotas)}["deployment"]
    assert used == len(b"other bytes")
    assert audit_log.of("artifact.lost", made["id"])
    gone = await shelf.client.get(f"{shelf.base}/{made['id']}", headers=shelf.member.headers)
    assert gone.status_code == 404
    still = await shelf.client.get(kept["url"], headers=shelf.member.headers)
    assert await still.get_data() == b"other bytes"


async def test_gc_leaves_other_plugins_blobs_alone(shelf):
    from buildmax_artifacts import routes
    from buildmax_artifacts.gc import collect

    store = routes.blob_store(shelf.app)

    async def one(data: bytes):
        yield data

    theirs = await store.put("catalog/packages", one(b"a plugin package"))
    await collect(shelf.app, grace_ms=0)
    assert await store.head(theirs.key) is not None


async def test_a_reservation_left_by_a_dead_upload_is_released_once(shelf, clock):
    from buildmax_artifacts.gc import collect
    from buildmax_artifacts.quota import reserve, settle
    from buildmax_artifacts.settings import artifact_settings

    settings = artifact_settings(shelf.app)
    stuck = await reserve(
        shelf.app, settings, shelf.space.pk, shelf.space.id, 1000, shelf.member.pk
    )
    clock.advance(seconds=7200)
    assert (await collect(shelf.app, grace_ms=3_600_000)).stale_uploads == 1
    rows = {row["scope"]: row for row in await shelf.rows(quotas)}
    assert rows["deployment"]["reserved"] == 0
    # The upload finishing after all does not release it twice.
    async with shelf.app.db.write() as tx:
        await settle(tx, stuck, 600, settings)
    rows = {row["scope"]: row for row in await shelf.rows(quotas)}
    assert (rows["deployment"]["reserved"], rows["deployment"]["used"]) == (0, 600)


async def test_retention_expires_old_unpinned_artifacts_and_gc_frees_their_bytes(
    shelf, clock, audit_log
):
    from buildmax_artifacts.gc import collect
    from buildmax_artifacts.retention import expire

    old = await shelf.upload(b"old evidence", name="old")
    kept = await shelf.upload(b"kept evidence", name="kept")
    pinned = await shelf.client.post(f"{shelf.base}/{kept['id']}/pin", headers=shelf.member.headers)
    assert (await pinned.get_json())["pinned"] is True
    clock.advance(seconds=91 * 86400)
    fresh = await shelf.upload(b"fresh evidence", name="fresh")

    assert await expire(shelf.app) == [old["id"]]
    assert [e.details for e in audit_log.of("artifact.expired", old["id"])] == [
        {"retention_days": 90}
    ]
    listed = await (await shelf.client.get(shelf.base, headers=shelf.member.headers)).get_json()
    assert sorted(a["id"] for a in listed["items"]) == sorted([kept["id"], fresh["id"]])
    clock.advance(seconds=5)
    assert len((await collect(shelf.app, grace_ms=0)).orphans) == 1
    assert len([f for f in shelf.blob_files() if "/sha256/" in f]) == 2
    assert await expire(shelf.app) == []
    assert await expire(shelf.app, retention_days=0) == []


async def test_pin_and_unpin_are_audited_once(shelf, audit_log):
    made = await shelf.upload(DATA)
    for _ in range(2):
        await shelf.client.post(f"{shelf.base}/{made['id']}/pin", headers=shelf.member.headers)
    unpinned = await shelf.client.post(
        f"{shelf.base}/{made['id']}/unpin", headers=shelf.member.headers
    )
    assert (await unpinned.get_json())["pinned"] is False
    assert len(audit_log.of("artifact.pinned", made["id"])) == 1
    assert len(audit_log.of("artifact.unpinned", made["id"])) == 1
    missing = await shelf.client.post(f"{shelf.base}/af_nope/pin", headers=shelf.member.headers)
    assert missing.status_code == 404


async def test_the_routes_an_attempts_token_may_use_say_so(client):
    document = await (await client.get("/v1/openapi.json")).get_json()
    base = "/v1/spaces/{space}/artifacts"
    scoped = {
        (method.upper(), path)
        for path, operations in document["paths"].items()
        for method, operation in operations.items()
        if path.startswith(base) and operation.get("x-token-scopes") == ["attempt"]
    }
    assert scoped == {
        ("POST", base),
        ("GET", f"{base}/{{artifact}}"),
        ("GET", f"{base}/{{artifact}}/content"),
    }


async def test_an_attempts_token_reads_only_its_own_tasks_artifacts(shelf):
    call, owner, base = shelf.client, shelf.owner.headers, f"/v1/spaces/{shelf.space.id}"
    await call.post(f"{base}/projects", headers=owner, json={"name": "main"})
    tasks = []
    for title in ("mine", "theirs"):
        response = await call.post(
            f"{base}/tasks", headers=owner, json={"project": "main", "title": title}
        )
        tasks.append(await response.get_json())
    claim = await (
        await call.post(
            f"{base}/tasks/{tasks[0]['id']}/claim", headers=shelf.member.headers, json={}
        )
    ).get_json()
    token = {"Authorization": f"Bearer {claim['token']}"}
    mine = await shelf.upload(DATA, claim["token"])
    theirs = await shelf.upload(DATA, task=tasks[1]["id"])
    loose = await shelf.upload(DATA)
    assert (await call.get(f"{shelf.base}/{mine['id']}", headers=token)).status_code == 200
    assert (await call.get(mine["url"], headers=token)).status_code == 200
    for other in (theirs, loose):
        assert (await call.get(f"{shelf.base}/{other['id']}", headers=token)).status_code == 404
        assert (await call.get(other["url"], headers=token)).status_code == 404


async def test_two_sweeps_at_once_expire_an_artifact_once(shelf, clock, audit_log):
    """Two servers sweep at about the same moment: each artifact is
    tombstoned, freed and audited once, and a pinned one never."""
    from buildmax_artifacts.retention import expire

    old = await shelf.upload(b"old evidence", name="old")
    kept = await shelf.upload(b"kept evidence", name="kept")
    await shelf.client.post(f"{shelf.base}/{kept['id']}/pin", headers=shelf.member.headers)
    clock.advance(seconds=91 * 86400)
    first, second = await asyncio.gather(expire(shelf.app), expire(shelf.app))
    assert sorted(first + second) == [old["id"]]
    assert len(audit_log.of("artifact.expired", old["id"])) == 1
    assert audit_log.of("artifact.expired", kept["id"]) == []
    used = {r["scope"]: r["used"] for r in await shelf.rows(quotas)}["deployment"]
    assert used == len(b"kept evidence")


class RunsWhileStoring:
    """A blob store that runs ``during`` after storing an upload's bytes and
    before the upload's row is written (a collector or another upload racing
    it)."""

    def __init__(self, store: object, during) -> None:
        self.store = store
        self.during = during

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)

    async def put(self, *args: object, **kwargs: object) -> object:
        ref = await self.store.put(*args, **kwargs)  # type: ignore[attr-defined]
        await self.during()
        return ref


async def test_gc_never_deletes_the_bytes_of_an_upload_in_flight(shelf, monkeypatch, clock):
    from buildmax_artifacts import routes
    from buildmax_artifacts.gc import collect

    reports = []

    async def collect_now() -> None:
        clock.advance(seconds=5)  # the fresh blob is past a zero grace period
        reports.append(await collect(shelf.app, grace_ms=0))

    real = routes.blob_store(shelf.app)
    monkeypatch.setattr(routes, "blob_store", lambda app: RunsWhileStoring(real, collect_now))
    made = await shelf.upload(DATA)
    monkeypatch.undo()
    [report] = reports
    assert (report.orphans, report.young_orphans) == ([], 1)
    got = await shelf.client.get(made["url"], headers=shelf.member.headers)
    assert got.status_code == 200 and await got.get_data() == DATA


async def test_an_upload_that_outlived_its_reservation_cannot_overshoot_the_quota(
    shelf, monkeypatch, clock
):
    from buildmax_artifacts import routes
    from buildmax_artifacts.gc import collect

    piece = os.urandom(MAX_BYTES)
    for _ in range(3):
        await shelf.upload(os.urandom(MAX_BYTES))
    late = os.urandom(200 * 1024)
    real = routes.blob_store(shelf.app)

    async def reservation_expires_and_another_upload_takes_the_room() -> None:
        clock.advance(seconds=7200)
        assert (await collect(shelf.app, grace_ms=3_600_000)).stale_uploads == 1
        monkeypatch.setattr(routes, "blob_store", lambda app: real)
        await shelf.upload(piece[: 200 * 1024])

    monkeypatch.setattr(
        routes,
        "blob_store",
        lambda app: RunsWhileStoring(real, reservation_expires_and_another_upload_takes_the_room),
    )
    refused = await shelf.upload(late, expect=409)
    assert refused["type"] == PROBLEM + "quota-exceeded"
    rows = await shelf.rows(artifacts)
    assert sha(late) not in {r["sha256"] for r in rows} and len(rows) == 4
    quota = {r["scope"]: r for r in await shelf.rows(quotas)}["deployment"]
    assert (quota["used"], quota["reserved"]) == (3 * MAX_BYTES + 200 * 1024, 0)
    assert quota["used"] <= QUOTA_BYTES
    assert await shelf.rows(uploads) == []


async def test_an_answer_whose_body_is_never_read_still_closes_the_blob(shelf, live_server):
    """A client that reads the headers and hangs up, and HEAD, open the blob
    (a missing one is a 410) but take no body: the blob is closed all the
    same (an open file would warn when collected)."""
    import gc

    import httpx

    made = await shelf.upload(os.urandom(MAX_BYTES))
    async with httpx.AsyncClient(base_url=live_server, headers=shelf.member.headers) as http:
        for _ in range(3):
            async with http.stream("GET", made["url"]) as got:
                assert got.status_code == 200  # and hang up without reading
            head = await http.head(made["url"])
            assert head.status_code == 200
    await asyncio.sleep(0.2)
    gc.collect()
