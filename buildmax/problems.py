"""``application/problem+json`` errors (RFC 9457) with stable type slugs.

Raise :class:`Problem` (or one of its subclasses) anywhere in a request;
the app turns it into a response. Clients match on ``type``, whose slug
never changes; ``title`` and ``detail`` are for people.
"""

from __future__ import annotations

from typing import Any

PROBLEM_TYPE_PREFIX = "urn:buildmax:problem:"
PROBLEM_CONTENT_TYPE = "application/problem+json"


class Problem(Exception):
    """An HTTP error with a stable slug, a title and a human detail."""

    status = 500
    slug = "internal-error"
    title = "Internal server error"

    def __init__(
        self,
        detail: str | None = None,
        *,
        status: int | None = None,
        slug: str | None = None,
        title: str | None = None,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        #: Response headers the problem needs (e.g. ``Content-Range`` on a 416).
        self.headers = dict(headers or {})
        self.status = status or self.status
        self.slug = slug or self.slug
        self.title = title or self.title
        self.detail = detail or self.title
        self.extra = extra
        super().__init__(self.detail)

    def to_dict(self, instance: str | None = None, request_id: str | None = None) -> dict[str, Any]:
        """The problem document."""
        body: dict[str, Any] = {
            "type": PROBLEM_TYPE_PREFIX + self.slug,
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
        }
        if instance:
            body["instance"] = instance
        if request_id:
            body["request_id"] = request_id
        body.update(self.extra)
        return body


class BadRequest(Problem):
    status, slug, title = 400, "bad-request", "Bad request"


class MalformedJSON(Problem):
    status, slug, title = 400, "malformed-json", "Request body is not valid JSON"


class BadCursor(Problem):
    status, slug, title = 400, "bad-cursor", "The paging cursor is not valid"


class Unauthenticated(Problem):
    status, slug, title = 401, "unauthenticated", "Authentication required"


class Forbidden(Problem):
    status, slug, title = 403, "forbidden", "Not allowed"


class TokenScopeRefused(Problem):
    status, slug, title = 403, "token-scope-refused", "This token's scope does not cover this route"


class NotFound(Problem):
    status, slug, title = 404, "not-found", "Not found"


class MethodNotAllowed(Problem):
    status, slug, title = 405, "method-not-allowed", "Method not allowed"


class Conflict(Problem):
    status, slug, title = 409, "conflict", "Conflict"


class NameTaken(Conflict):
    """409: the name is already used (a principal's on the server; a
    project's or an agent's in its space)."""

    slug, title = "name-taken", "The name is already used"


class SlugTaken(Conflict):
    """409: another space already has this slug."""

    slug, title = "slug-taken", "The space slug is already used"


class LastOwner(Conflict):
    """409: the change would leave the space without an owner."""

    slug, title = "last-owner", "A space needs at least one owner"


class LastAdmin(Conflict):
    """409: the change would leave no enabled system admin."""

    slug, title = "last-admin", "The server needs an enabled system admin"


class IdempotencyInProgress(Problem):
    status, slug, title = 409, "idempotency-in-progress", "A request with this key is in progress"


class PayloadTooLarge(Problem):
    status, slug, title = 413, "payload-too-large", "Request body too large"


class UnsupportedMediaType(Problem):
    status, slug, title = 415, "unsupported-media-type", "Send the body as application/json"


class ValidationFailed(Problem):
    status, slug, title = 422, "validation-error", "The request did not validate"


class BlobMissing(Problem):
    """410: the stored bytes of a record (an artifact, a release package)
    are gone from the blob store."""

    status, slug, title = 410, "blob-missing", "The stored bytes are gone from the blob store"


class BlobCorrupted(Problem):
    """410: the stored bytes no longer match their recorded size or sha256."""

    status, slug, title = 410, "blob-corrupted", "The stored bytes no longer match their record"


class IdempotencyKeyReused(Problem):
    status, slug, title = (
        422,
        "idempotency-key-reused",
        "This idempotency key was used with a different request body",
    )


class _RetryLater(Problem):
    """A problem the client may retry: every one says when, in
    ``Retry-After`` (whole seconds, at least 1)."""

    def __init__(self, detail: str | None = None, *, retry_after: int, **kwargs: Any) -> None:
        super().__init__(detail, **kwargs)
        self.headers["Retry-After"] = str(max(1, int(retry_after)))


class TooManyRequests(_RetryLater):
    status, slug, title = 429, "too-many-requests", "Too many requests"


class ServiceUnavailable(_RetryLater):
    status, slug, title = 503, "service-unavailable", "Service unavailable"


class BlobStoreDown(ServiceUnavailable):
    slug, title = "blob-store-unavailable", "The blob store is unavailable; retry later"


class Draining(ServiceUnavailable):
    slug, title = "server-draining", "This server process is shutting down"


class DatabaseLogAtLimit(ServiceUnavailable):
    slug, title = "database-log-full", "The database cannot take writes for now; retry later"


class DiskReserveReached(Problem):
    """507: accepting the bytes would leave less free disk than the server
    keeps in reserve (``min_free_bytes``)."""

    status, slug, title = 507, "disk-reserve-reached", "Not enough free disk for this upload"


_BY_STATUS: dict[int, type[Problem]] = {
    400: BadRequest,
    401: Unauthenticated,
    403: Forbidden,
    404: NotFound,
    405: MethodNotAllowed,
    409: Conflict,
    413: PayloadTooLarge,
    415: UnsupportedMediaType,
    422: ValidationFailed,
    429: TooManyRequests,
    503: ServiceUnavailable,
}


#: ``Retry-After`` of a 429 or 503 the framework raised, which says nothing
#: better.
DEFAULT_RETRY_AFTER = 5


def problem_for_status(status: int, detail: str | None = None) -> Problem:
    """The problem matching a plain HTTP status (for framework-raised errors)."""
    cls = _BY_STATUS.get(status)
    if cls is None:
        return Problem(detail, status=status, slug=f"http-{status}", title=f"HTTP {status}")
    if issubclass(cls, _RetryLater):
        return cls(detail, retry_after=DEFAULT_RETRY_AFTER)
    return cls(detail)
