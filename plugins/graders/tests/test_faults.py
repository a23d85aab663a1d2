"""The test-only fault plugin of ``qualification/faults/``: it refuses to
load outside a qualification run, and its blob store fails a put after the
bytes are stored, only while the runner has the fault armed."""

from __future__ import annotations

import importlib.util
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType

import pytest
from buildmax_hookspecs import BlobStoreUnavailable

pytestmark = pytest.mark.engine_independent

MODULE = (
    Path(__file__).parents[3]
    / "qualification"
    / "faults"
    / "buildmax_qualification_faults"
    / "__init__.py"
)


def load_faults() -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"faults_{uuid.uuid4().hex}", MODULE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def chunks(data: bytes) -> AsyncIterator[bytes]:
    yield data


def test_it_refuses_to_load_outside_a_qualification_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BUILDMAX_QUALIFICATION", raising=False)
    with pytest.raises(RuntimeError, match="refuses to load outside a qualification run"):
        load_faults()
    monkeypatch.setenv("BUILDMAX_QUALIFICATION", "0")
    with pytest.raises(RuntimeError):
        load_faults()


async def test_the_store_fails_after_storing_only_while_armed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("BUILDMAX_QUALIFICATION", "1")
    monkeypatch.setenv("BUILDMAX_FAULTS_DIR", str(tmp_path / "faults"))
    (tmp_path / "faults").mkdir()
    faults = load_faults()
    factory = faults.buildmax_blob_stores()["faulty+file"]
    store = factory("faulty+" + (tmp_path / "blobs").as_uri(), None)

    stored = await store.put("artifacts", chunks(b"first"))
    assert (await store.head(stored.key)) is not None

    (tmp_path / "faults" / "blob-put-after-store").write_text("armed\n")
    with pytest.raises(BlobStoreUnavailable, match="injected fault blob-put-after-store"):
        await store.put("artifacts", chunks(b"second"))
    keys = [ref.key async for ref in store.list("artifacts/")]
    assert len(keys) == 2, "the bytes of the failed put are stored"

    (tmp_path / "faults" / "blob-put-after-store").unlink()
    assert (await store.put("artifacts", chunks(b"third"))).size == 5
    await store.aclose()
