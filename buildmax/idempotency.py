"""Idempotency keys: a retried mutation returns the first answer.

A receipt is keyed by (principal, method, concrete path, key), carries a
fingerprint of the body, and is written in the handler's own transaction,
so it exists exactly when the change does. The same key with a different
body is refused (422); a duplicate arriving while the first is still running
is refused (409); receipts expire after ``idempotency_ttl_seconds``.

A receipt never stores a secret. When the first answer carried one (a new
token), a replay revokes the token nobody saw and answers with a fresh one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from buildmax_hookspecs import Transaction
from quart import Response, request

from .auth import Caller
from .bodies import json_body, json_response
from .conflicts import insert_ignoring_conflict
from .database.base import uncancellable
from .database.locks import try_lock
from .declaration import current_route_doc
from .inputs import IDEMPOTENCY_KEY_PATTERN
from .problems import BadRequest, Conflict, IdempotencyInProgress, IdempotencyKeyReused
from .tables import idempotency_receipts as receipts
from .tokens import issued_body, reissue_token

if TYPE_CHECKING:
    from .app import BuildMax

HEADER = "Idempotency-Key"
REPLAY_HEADER = "Idempotent-Replayed"
#: The status of a receipt whose streamed request is still running.
PENDING = 0
IN_PROGRESS = "a request with this idempotency key is still running"
#: How long a pending receipt holds its key when its request never ends
#: (the server stopped mid-upload); a retry after that runs again.
PENDING_SECONDS = 15 * 60
_KEY = re.compile(IDEMPOTENCY_KEY_PATTERN)
#: Set in a request's scope while its declared view runs: the work of an
#: idempotent view is the kernel's to run, after the view returns it.
VIEW_RUNNING = "buildmax.view_running"

Reminter = Callable[[Transaction, Caller, dict[str, Any]], Awaitable[dict[str, Any] | None]]


@dataclass
class Reply:
    """A mutation's answer. ``secret_field`` names a body field holding a
    secret of kind ``secret_kind``; it is never stored in a receipt."""

    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)
    secret_field: str | None = None
    secret_kind: str | None = None


#: A mutation's work: run in a write transaction, it answers with a reply.
Work = Callable[[Transaction], Awaitable[Reply]]


class Idempotency:
    """Runs mutations, keeping and replaying receipts."""

    def __init__(self, app: BuildMax) -> None:
        self._app = app
        self._in_flight: set[tuple[Any, ...]] = set()
        self._reminters: dict[str, Reminter] = {"token": self._remint_token}

    def register_reminter(self, kind: str, reminter: Reminter) -> None:
        """How to mint a fresh secret of ``kind`` for a replayed answer.

        ``reminter(tx, caller, stored_body)`` revokes the unseen secret,
        audits what it did and returns the body with a fresh secret, or
        ``None`` when it cannot (409)."""
        self._reminters[kind] = reminter

    async def run(
        self,
        caller: Caller,
        work: Work,
        *,
        secret_fields: tuple[str, ...] = (),
    ) -> Response:
        """Run ``work`` in a write transaction, honouring ``Idempotency-Key``:
        what the kernel does with the work an idempotent route returns
        (:func:`buildmax.apidoc.api`).

        A replay answers without running ``work``: check everything the
        caller must be allowed to do *before* returning it.
        ``secret_fields`` name body fields (passwords) left out of the
        stored fingerprint, so a receipt holds no guessable hash of them; a
        retry that differs only there replays the first answer."""
        if request.scope.get(VIEW_RUNNING):
            # A view written before routes returned their work: running it
            # here too would commit it and then fail the request.
            raise RuntimeError(
                f"{request.endpoint} runs its own work: an idempotent route returns it "
                "and the kernel runs it"
            )
        ident = _ident_of(caller)
        db = self._app.db
        if ident is None:
            async with db.write() as tx:
                reply = await work(tx)
            return _respond(reply)
        fingerprint = await _fingerprint(secret_fields)
        with self._holding(ident):
            async with db.write() as tx:
                if not await try_lock(tx, "idempotency", *ident):
                    # Another server process is running the same request.
                    raise IdempotencyInProgress(IN_PROGRESS)
                reply = await self._replay_or_run(tx, caller, ident, fingerprint, work)
        return _respond(reply)

    @contextlib.contextmanager
    def _holding(self, ident: tuple[Any, ...]) -> Iterator[None]:
        """Hold ``ident`` in this process while its request runs (a
        duplicate meanwhile is 409)."""
        if ident in self._in_flight:
            raise IdempotencyInProgress(IN_PROGRESS)
        self._in_flight.add(ident)
        try:
            yield
        finally:
            self._in_flight.discard(ident)

    async def _replay_or_run(
        self,
        tx: Transaction,
        caller: Caller,
        ident: tuple[Any, ...],
        fingerprint: str,
        work: Work,
    ) -> Reply:
        principal_pk, method, path, key = ident
        now = self._app.clock.now_ms()
        existing = await tx.fetch_one(sa.select(receipts).where(_receipt_of(ident)))
        if existing is not None and existing["expires_at"] > now:
            if existing["status"] == PENDING:
                raise IdempotencyInProgress(IN_PROGRESS)
            if existing["fingerprint"] != fingerprint:
                raise IdempotencyKeyReused(
                    "this idempotency key was already used with a different request body"
                )
            return await self._replay(tx, caller, existing)
        if existing is not None:
            await tx.execute(sa.delete(receipts).where(receipts.c.id == existing["id"]))
        reply = await work(tx)
        if reply.status < 500:
            await tx.execute(
                receipts.insert().values(
                    principal_id=principal_pk,
                    method=method,
                    path=path,
                    key=key,
                    fingerprint=fingerprint,
                    status=reply.status,
                    body=_stored(reply),
                    created_at=now,
                    expires_at=now + self._app.settings.idempotency_ttl_seconds * 1000,
                )
            )
        return reply

    @contextlib.asynccontextmanager
    async def streamed(self, caller: Caller, fingerprint: str) -> AsyncIterator[Receipt]:
        """Honour ``Idempotency-Key`` on a mutation whose body streams
        outside any transaction (an upload): the key is claimed before the
        route reserves or stores anything, and kept in the transaction that
        records the result.

        ``fingerprint`` stands for the request (its query, its declared
        size and digest; the bytes themselves are not read yet). Inside the
        block, ``receipt.replay`` is the first answer when this is a retry
        (the route checks that the bytes are the same and answers it with
        :func:`replayed`), else ``None``: the route does its work and calls
        ``await receipt.keep(tx, reply)`` in the transaction that records
        it. The same key with another fingerprint is 422; while the first
        request still streams, in this process or another, a duplicate is
        409. A request that fails leaves the key free for a retry."""
        ident = _ident_of(caller)
        if ident is None:
            yield Receipt(self, None, None)
            return
        with self._holding(ident):
            replay = await self._claim(caller, ident, fingerprint)
            receipt = Receipt(self, ident, replay)
            try:
                yield receipt
            finally:
                if replay is None and not receipt.kept:
                    await uncancellable(self._free(ident))

    async def _claim(
        self, caller: Caller, ident: tuple[Any, ...], fingerprint: str
    ) -> Reply | None:
        """The first answer of a finished request with this key, or ``None``
        after writing a pending receipt that holds the key while the body
        streams (409 when another request holds it)."""
        now = self._app.clock.now_ms()
        async with self._app.db.write() as tx:
            existing = await tx.fetch_one(sa.select(receipts).where(_receipt_of(ident)))
            if existing is not None and existing["expires_at"] > now:
                if existing["status"] == PENDING:
                    raise IdempotencyInProgress(IN_PROGRESS)
                if existing["fingerprint"] != fingerprint:
                    raise IdempotencyKeyReused(
                        "this idempotency key was already used with a different request"
                    )
                return await self._replay(tx, caller, existing)
            if existing is not None:
                await tx.execute(sa.delete(receipts).where(receipts.c.id == existing["id"]))
            principal_pk, method, path, key = ident
            inserted = await tx.fetch_val(
                insert_ignoring_conflict(tx.dialect, receipts)
                .values(
                    principal_id=principal_pk,
                    method=method,
                    path=path,
                    key=key,
                    fingerprint=fingerprint,
                    status=PENDING,
                    body="",
                    created_at=now,
                    expires_at=now + PENDING_SECONDS * 1000,
                )
                .returning(receipts.c.id)
            )
            if inserted is None:  # another process claimed it meanwhile
                raise IdempotencyInProgress(IN_PROGRESS)
        return None

    async def _keep(self, tx: Transaction, ident: tuple[Any, ...], reply: Reply) -> None:
        now = self._app.clock.now_ms()
        await tx.execute(
            sa.update(receipts)
            .where(_receipt_of(ident), receipts.c.status == PENDING)
            .values(
                status=reply.status,
                body=_stored(reply),
                expires_at=now + self._app.settings.idempotency_ttl_seconds * 1000,
            )
        )

    async def _free(self, ident: tuple[Any, ...]) -> None:
        async with self._app.db.write() as tx:
            await tx.execute(
                sa.delete(receipts).where(_receipt_of(ident), receipts.c.status == PENDING)
            )

    async def _replay(self, tx: Transaction, caller: Caller, existing: Any) -> Reply:
        stored = json.loads(existing["body"])
        body = stored["body"]
        kind, secret_field = stored.get("secret_kind"), stored.get("secret_field")
        if kind is not None:
            reminter = self._reminters[kind]
            fresh = await reminter(tx, caller, body)
            if fresh is None:
                raise Conflict(
                    "the secret of the first answer can no longer be replaced "
                    "(it was revoked); send a new request with a new key"
                )
            body = fresh
            replacement = Reply(
                existing["status"], body, secret_field=secret_field, secret_kind=kind
            )
            await tx.execute(
                sa.update(receipts)
                .where(receipts.c.id == existing["id"])
                .values(body=_stored(replacement))
            )
        return Reply(
            existing["status"],
            body,
            headers={REPLAY_HEADER: "true"},
            secret_field=secret_field,
            secret_kind=kind,
        )

    async def _remint_token(
        self, tx: Transaction, caller: Caller, body: dict[str, Any]
    ) -> dict[str, Any] | None:
        issued = await reissue_token(tx, body["id"], now=self._app.clock.now_ms())
        if issued is None:
            return None
        await self._app.audit.record(
            tx,
            caller.actor,
            "token.rotated",
            target_type="token",
            target_id=issued.public_id,
            details={"principal_id": body["principal_id"], "replaces": body["id"]},
        )
        return issued_body(issued, body["principal_id"])

    async def sweep(self) -> int:
        """Delete expired receipts; how many."""
        async with self._app.db.write() as tx:
            rows = await tx.fetch_all(
                sa.delete(receipts)
                .where(receipts.c.expires_at <= self._app.clock.now_ms())
                .returning(receipts.c.id)
            )
        return len(rows)


class Receipt:
    """The key of one streamed mutation (see :meth:`Idempotency.streamed`)."""

    def __init__(
        self, idempotency: Idempotency, ident: tuple[Any, ...] | None, replay: Reply | None
    ) -> None:
        self._idempotency = idempotency
        self._ident = ident
        #: The first answer, when this request is a retry of a finished one.
        self.replay = replay
        self.kept = False

    async def keep(self, tx: Transaction, reply: Reply) -> None:
        """Record ``reply`` as the answer to this key, in ``tx`` (the
        transaction that records the mutation)."""
        if self._ident is not None:
            await self._idempotency._keep(tx, self._ident, reply)
            tx.after_commit(self._mark_kept)

    def _mark_kept(self) -> None:
        self.kept = True


def replayed(reply: Reply) -> Response:
    """The response for a replayed answer (``Idempotent-Replayed: true``)."""
    return _respond(reply)


def fingerprint_of(*parts: Any) -> str:
    """A request's fingerprint from what stands for it (canonical JSON)."""
    return _digest(list(parts))


def _digest(value: Any) -> str:
    """The sha256 of ``value`` as canonical JSON (key order and white space
    do not count)."""
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _ident_of(caller: Caller) -> tuple[Any, ...] | None:
    """What this request's ``Idempotency-Key`` names (the caller, method,
    path and key), or ``None`` without the header; 400 for a malformed key."""
    doc = current_route_doc()
    if doc is None or not doc.idempotent:
        # The header is honoured exactly where the route declares it, so
        # the OpenAPI document lists it on the routes that keep receipts.
        raise RuntimeError(f"{request.endpoint} keeps receipts but is not declared idempotent")
    key = request.headers.get(HEADER)
    if key is None:
        return None
    if not _KEY.fullmatch(key):
        raise BadRequest(f"{HEADER} must be 1 to 200 printable ASCII characters")
    return (caller.principal_pk, request.method, request.path, key)


def _receipt_of(ident: tuple[Any, ...]) -> Any:
    principal_pk, method, path, key = ident
    return sa.and_(
        receipts.c.principal_id == principal_pk,
        receipts.c.method == method,
        receipts.c.path == path,
        receipts.c.key == key,
    )


async def _fingerprint(secret_fields: tuple[str, ...]) -> str:
    payload = await json_body()
    if isinstance(payload, dict) and secret_fields:
        payload = {k: ("<secret>" if k in secret_fields else v) for k, v in payload.items()}
    return _digest(payload)


def _stored(reply: Reply) -> str:
    body = reply.body
    if reply.secret_field is not None and isinstance(body, dict):
        body = {k: v for k, v in body.items() if k != reply.secret_field}
    return json.dumps(
        {"body": body, "secret_kind": reply.secret_kind, "secret_field": reply.secret_field},
        separators=(",", ":"),
    )


def _respond(reply: Reply) -> Response:
    if reply.status == 204:
        return Response(status=204, headers=reply.headers)
    return json_response(reply.body, reply.status, reply.headers)
