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

import hashlib
import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from buildmax_hookspecs import Transaction
from quart import Response, request

from .apidoc import current_route_doc
from .auth import Caller
from .bodies import json_body, json_response
from .database.locks import try_lock
from .inputs import IDEMPOTENCY_KEY_PATTERN
from .problems import BadRequest, Conflict, IdempotencyInProgress, IdempotencyKeyReused
from .schema import idempotency_receipts as receipts
from .tokens import issued_body, reissue_token

if TYPE_CHECKING:
    from .app import BuildMax

HEADER = "Idempotency-Key"
REPLAY_HEADER = "Idempotent-Replayed"
_KEY = re.compile(IDEMPOTENCY_KEY_PATTERN)

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
        work: Callable[[Transaction], Awaitable[Reply]],
        *,
        secret_fields: tuple[str, ...] = (),
    ) -> Response:
        """Run ``work`` in a write transaction, honouring ``Idempotency-Key``.

        A replay answers without running ``work``: check everything the
        caller must be allowed to do *before* calling ``run``.
        ``secret_fields`` name body fields (passwords) left out of the
        stored fingerprint, so a receipt holds no guessable hash of them; a
        retry that differs only there replays the first answer."""
        doc = current_route_doc()
        if doc is None or not doc.idempotent:
            # The header is honoured exactly where the route declares it, so
            # the OpenAPI document lists it on the routes that keep receipts.
            raise RuntimeError(f"{request.endpoint} keeps receipts but is not declared idempotent")
        key = request.headers.get(HEADER)
        db = self._app.db
        if key is None:
            async with db.write() as tx:
                reply = await work(tx)
            return _respond(reply)
        if not _KEY.fullmatch(key):
            raise BadRequest(f"{HEADER} must be 1 to 200 printable ASCII characters")
        ident = (caller.principal_pk, request.method, request.path, key)
        fingerprint = await _fingerprint(secret_fields)
        if ident in self._in_flight:
            raise IdempotencyInProgress("a request with this idempotency key is still running")
        self._in_flight.add(ident)
        try:
            async with db.write() as tx:
                if not await try_lock(tx, "idempotency", *ident):
                    # Another server process is running the same request.
                    raise IdempotencyInProgress(
                        "a request with this idempotency key is still running"
                    )
                reply = await self._replay_or_run(tx, caller, ident, fingerprint, work)
        finally:
            self._in_flight.discard(ident)
        return _respond(reply)

    async def _replay_or_run(
        self,
        tx: Transaction,
        caller: Caller,
        ident: tuple[Any, ...],
        fingerprint: str,
        work: Callable[[Transaction], Awaitable[Reply]],
    ) -> Reply:
        principal_pk, method, path, key = ident
        now = self._app.clock.now_ms()
        where = sa.and_(
            receipts.c.principal_id == principal_pk,
            receipts.c.method == method,
            receipts.c.path == path,
            receipts.c.key == key,
        )
        existing = await tx.fetch_one(sa.select(receipts).where(where))
        if existing is not None and existing["expires_at"] > now:
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


async def _fingerprint(secret_fields: tuple[str, ...]) -> str:
    payload = await json_body()
    if isinstance(payload, dict) and secret_fields:
        payload = {k: ("<secret>" if k in secret_fields else v) for k, v in payload.items()}
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


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
