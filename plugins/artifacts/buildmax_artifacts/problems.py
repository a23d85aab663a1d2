"""The artifacts plugin's problem types (``urn:buildmax:problem:<slug>``).

Bytes gone from the store answer the kernel's 410 ``blob-missing``
(:class:`buildmax.problems.BlobMissing`), as the catalog's packages do.
"""

from __future__ import annotations

from buildmax.problems import Conflict, Problem, ValidationFailed


class QuotaExceeded(Conflict):
    """409: the artifact would exceed a storage quota (the space's, the
    principal's or the server's)."""

    slug, title = "quota-exceeded", "The artifact would exceed a storage quota"


class DigestMismatch(ValidationFailed):
    """422: the bytes sent are not the ones their declared sha256 names."""

    slug, title = "digest-mismatch", "The bytes are not the ones the sha256 names"


class RangeNotSatisfiable(Problem):
    """416: the requested byte range lies outside the artifact."""

    status, slug, title = 416, "range-not-satisfiable", "The range is outside the artifact"
