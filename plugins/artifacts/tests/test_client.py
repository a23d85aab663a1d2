"""``buildmax_artifacts.client`` over real HTTP: upload from disk and from
bytes, list, download verified into place, and the typed errors.

The sync client runs in a worker thread because the live server shares the
test's event loop.
"""

from __future__ import annotations

import asyncio
import json
import os

import httpx
import pytest
from buildmax_artifacts.client import (
    ArtifactsClient,
    AsyncArtifactsClient,
    BlobMissing,
    CorruptDownload,
    QuotaExceeded,
)
from buildmax_artifacts.tables import artifacts as artifacts_table

from buildmax.client import (
    AsyncClient,
    BlobCorrupted,
    Client,
    Conflict,
    IncompleteDownload,
    NotFound,
    PayloadTooLarge,
)

from .conftest import MAX_BYTES, QUOTA_BYTES, sha


def _sync(url: str, token: str, scenario):
    def run():
        with Client(url, token, retries=0) as bmx:
            return scenario(ArtifactsClient(bmx))

    return asyncio.to_thread(run)


async def test_upload_list_and_download_a_file_through_the_sync_client(
    shelf, live_server, tmp_path
):
    data = os.urandom(MAX_BYTES - 10)
    source = tmp_path / "report.xml"
    source.write_bytes(data)
    dest = tmp_path / "out" / "copy.xml"
    dest.parent.mkdir()

    def scenario(artifacts: ArtifactsClient):
        made = artifacts.upload(shelf.space.id, source)
        listed = artifacts.list(shelf.space.id, media_type="text/xml")
        got = artifacts.download(shelf.space.id, made["id"], dest)
        return made, listed, got

    made, listed, got = await _sync(live_server, shelf.member.token, scenario)
    assert (made["name"], made["media_type"], made["size"]) == (
        "report.xml",
        "text/xml",
        len(data),
    )
    assert made["sha256"] == sha(data)
    assert [a["id"] for a in listed] == [made["id"]]
    assert got == made
    assert dest.read_bytes() == data
    assert sorted(p.name for p in dest.parent.iterdir()) == ["copy.xml"]  # no temporary left


async def test_the_async_client_uploads_bytes_and_downloads_them(shelf, live_server, tmp_path):
    async with AsyncClient(live_server, shelf.member.token, retries=0) as bmx:
        artifacts = AsyncArtifactsClient(bmx)
        made = await artifacts.upload(shelf.space.id, b"hello", name="note.txt")
        assert made["media_type"] == "text/plain" and made["sha256"] == sha(b"hello")
        got = await artifacts.download(shelf.space.id, made["id"], tmp_path / "note.txt")
        assert got["id"] == made["id"] and (tmp_path / "note.txt").read_bytes() == b"hello"
        pinned = await artifacts.pin(shelf.space.id, made["id"])
        assert pinned["pinned"] is True
        await artifacts.delete(shelf.space.id, made["id"])
        assert await artifacts.list(shelf.space.id) == []
        with pytest.raises(NotFound):
            await artifacts.get(shelf.space.id, made["id"])


async def test_refusals_are_typed_and_leave_no_file(shelf, live_server, tmp_path):
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(MAX_BYTES + 1))
    dest = tmp_path / "never.bin"

    def scenario(artifacts: ArtifactsClient):
        errors = []
        with pytest.raises(PayloadTooLarge) as caught:
            artifacts.upload(shelf.space.id, big)
        errors.append(caught.value)
        for _ in range(QUOTA_BYTES // MAX_BYTES):
            artifacts.upload(shelf.space.id, os.urandom(MAX_BYTES), name="fill.bin")
        with pytest.raises(QuotaExceeded):
            artifacts.upload(shelf.space.id, b"one more", name="x.txt")
        with pytest.raises(NotFound):
            artifacts.download(shelf.space.id, "af_nothing", dest)
        return errors

    await _sync(live_server, shelf.member.token, scenario)
    assert not dest.exists()
    assert list(tmp_path.glob(".never.bin.*")) == []


async def test_a_download_whose_bytes_vanished_or_changed_writes_nothing(
    shelf, live_server, tmp_path
):
    made = await shelf.upload(b"the evidence")
    out = tmp_path / "downloads"
    out.mkdir()
    async with AsyncClient(live_server, shelf.member.token, retries=0) as bmx:
        artifacts = AsyncArtifactsClient(bmx)
        for key in shelf.blob_files():
            shelf.backend.remove(key)
        with pytest.raises(BlobMissing):
            await artifacts.download(shelf.space.id, made["id"], out / "gone")
        assert list(out.iterdir()) == []
        # Other bytes behind the same key: the server refuses to send them.
        await shelf.upload(b"the evidence")  # the blob is back...
        [key] = [k for k in shelf.blob_files() if "/sha256/" in k]
        shelf.backend.remove(key)
        shelf.backend.put(key, b"the evidencE")  # ...and then replaced, same length
        with pytest.raises(BlobCorrupted, match="its sha256 is"):
            await artifacts.download(shelf.space.id, made["id"], out / "bad")
        assert list(out.iterdir()) == []


@pytest.mark.engine_independent
def test_bytes_a_server_sends_that_are_not_the_artifacts_are_never_kept(tmp_path):
    """The client's own check, for a server that sends other bytes anyway
    (mutation: drop ``_check`` and the wrong bytes land at the destination)."""

    def lying(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/content"):
            return httpx.Response(200, content=b"other bytes", headers={"ETag": f'"{"0" * 64}"'})
        return httpx.Response(200, json={"id": "af_1"})

    with (
        Client("http://buildmax.test", "bmx_x", transport=httpx.MockTransport(lying)) as bmx,
        pytest.raises(CorruptDownload),
    ):
        ArtifactsClient(bmx).download("s", "af_1", tmp_path / "kept")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("damage", ["larger", "same size, sent in pieces"])
async def test_a_corrupted_artifact_is_never_sent_whole_and_the_clients_name_it(
    shelf, live_server, tmp_path, caplog, monkeypatch, damage
):
    """A blob that grew used to make the server break the connection at the
    declared length with an h11 traceback, and the clients say "cannot
    reach": now it is a 410 ``blob-corrupted``, and bytes of the same size
    found wrong while sending end the body before its last piece, which the
    clients and the command report as an incomplete download (mutation:
    report it as an unreachable server and the command adds "is the server
    running?"). Neither leaves a file, and the server logs why without a
    traceback."""
    data = os.urandom(4000)
    made = await shelf.upload(data)
    [key] = [k for k in shelf.blob_files() if "/sha256/" in k]
    shelf.backend.remove(key)
    if damage == "larger":
        shelf.backend.put(key, data + b"and then some" * 10000)
        expected: type[Exception] = BlobCorrupted
    else:
        shelf.backend.put(key, data[:-1] + bytes([data[-1] ^ 1]))
        monkeypatch.setattr("buildmax.blobstore.CHUNK", 512)
        monkeypatch.setattr("buildmax_s3.store.CHUNK", 512)
        expected = IncompleteDownload
    out = tmp_path / "downloads"
    out.mkdir()

    def sync_download():
        with (
            Client(live_server, shelf.member.token, retries=0) as bmx,
            pytest.raises(expected),
        ):
            ArtifactsClient(bmx).download(shelf.space.id, made["id"], out / "sync")

    await asyncio.to_thread(sync_download)
    async with AsyncClient(live_server, shelf.member.token, retries=0) as bmx:
        with pytest.raises(expected) as caught:
            await AsyncArtifactsClient(bmx).download(shelf.space.id, made["id"], out / "async")
    assert "cannot reach" not in str(caught.value)
    command = await _cli(
        live_server,
        shelf.member.token,
        shelf.space.id,
        "download",
        made["id"],
        "-o",
        str(out / "cli"),
    )
    assert command.exit_code == 1
    (line,) = command.stderr.splitlines()
    said = "410 blob-corrupted" if damage == "larger" else "error: incomplete download from"
    assert said in line and "is the server running" not in line, line
    assert list(out.iterdir()) == []
    logged = [r.getMessage() for r in caplog.records if r.name == "buildmax.downloads"]
    assert len(logged) == 3 and all(made["id"] in message for message in logged)
    assert [r.getMessage() for r in caplog.records if r.exc_info] == []
    assert [r.getMessage() for r in caplog.records if r.name.startswith("hypercorn")] == []


def _cli(url: str, token: str, space: str, *args: str):
    from click.testing import CliRunner

    from buildmax.cli import _register_commands, cli

    _register_commands()
    argv = ["artifacts", *args, "--url", url, "--token", token, "--space", space]
    return asyncio.to_thread(CliRunner().invoke, cli, argv, catch_exceptions=False)


async def test_the_cli_uploads_lists_downloads_pins_and_deletes(
    shelf, live_server, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    source = tmp_path / "in" / "run.log"
    source.parent.mkdir()
    source.write_bytes(b"line one\nline two\n")

    def run(*args: str):
        return _cli(live_server, shelf.member.token, shelf.space.id, *args)

    uploaded = await run("upload", str(source), "--json")
    assert uploaded.exit_code == 0, uploaded.output
    made = json.loads(uploaded.output)
    assert (made["name"], made["media_type"]) == ("run.log", "text/plain")
    listed = await run("list")
    assert made["id"] in listed.output and "run.log" in listed.output
    got = await run("download", made["id"])
    assert got.exit_code == 0, got.output
    assert (tmp_path / "run.log").read_bytes() == source.read_bytes()
    again = await run("download", made["id"])  # never overwrites a file it was not told to
    assert again.exit_code != 0 and "exists" in again.output
    other = await run("download", made["id"], "-o", str(tmp_path / "copy.log"))
    assert other.exit_code == 0 and (tmp_path / "copy.log").read_bytes() == source.read_bytes()
    pinned = await run("pin", made["id"], "--json")
    assert json.loads(pinned.output)["pinned"] is True
    unpinned = await run("pin", made["id"], "--off", "--json")
    assert json.loads(unpinned.output)["pinned"] is False
    assert (await run("delete", made["id"])).exit_code == 0
    gone = await run("show", made["id"])
    assert gone.exit_code != 0 and "not-found" in gone.output
    outsider = await _cli(live_server, shelf.outsider.token, shelf.space.id, "list")
    assert outsider.exit_code != 0 and "not-found" in outsider.output
    # Local failures are one line, not a traceback.
    kept = await run("upload", str(source), "--json")
    kept_id = json.loads(kept.output)["id"]
    nowhere = await run("download", kept_id, "-o", str(tmp_path / "no" / "such" / "dir.log"))
    assert nowhere.exit_code == 1 and "No such file or directory" in nowhere.output
    [key] = [k for k in shelf.blob_files() if "/sha256/" in k]
    shelf.backend.remove(key)
    shelf.backend.put(key, b"line one\nline 2wo\n")  # same length, other bytes
    corrupt = await run("download", kept_id, "-o", str(tmp_path / "corrupt.log"))
    assert corrupt.exit_code == 1 and "410 blob-corrupted" in corrupt.output
    assert "Traceback" not in nowhere.output + corrupt.output
    assert not (tmp_path / "corrupt.log").exists()


async def test_the_clients_and_the_cli_attach_to_an_attempt_at_its_generation(
    shelf, live_server, tmp_path
):
    """``attempt`` goes with ``generation`` (the clients refuse one alone
    before sending anything; the CLI says so as a usage error); a stale
    generation comes back as the server's 409 ``stale-generation``."""
    base, owner = f"/v1/spaces/{shelf.space.id}", shelf.owner.headers
    await shelf.client.post(f"{base}/projects", headers=owner, json={"name": "main"})
    made = await shelf.client.post(
        f"{base}/tasks", headers=owner, json={"project": "main", "title": "t"}
    )
    task = await made.get_json()
    claimed = await shelf.client.post(
        f"{base}/tasks/{task['id']}/claim", headers=shelf.member.headers, json={}
    )
    attempt = (await claimed.get_json())["attempt"]["id"]
    source = tmp_path / "run.log"
    source.write_bytes(b"ran\n")

    def scenario(artifacts: ArtifactsClient):
        with pytest.raises(ValueError, match="generation"):
            artifacts.upload(shelf.space.id, source, attempt=attempt)
        with pytest.raises(Conflict) as stale:
            artifacts.upload(shelf.space.id, source, attempt=attempt, generation=2)
        return artifacts.upload(shelf.space.id, source, attempt=attempt, generation=1), stale

    linked, stale = await _sync(live_server, shelf.member.token, scenario)
    assert (linked["attempt_id"], linked["task_id"]) == (attempt, task["id"])
    assert stale.value.slug == "stale-generation"
    async with AsyncClient(live_server, shelf.member.token, retries=0) as bmx:
        with pytest.raises(ValueError, match="generation"):
            await AsyncArtifactsClient(bmx).upload(
                shelf.space.id, b"x", name="x.txt", attempt=attempt
            )

    def run(*args: str):
        return _cli(live_server, shelf.member.token, shelf.space.id, "upload", str(source), *args)

    alone = await run("--attempt", attempt)
    assert alone.exit_code == 2 and "--generation" in alone.output
    cli_linked = await run("--attempt", attempt, "--generation", "1", "--json")
    assert cli_linked.exit_code == 0, cli_linked.output
    assert json.loads(cli_linked.output)["attempt_id"] == attempt
    assert len([a for a in await shelf.rows(artifacts_table) if a["attempt_id"] == attempt]) == 2
