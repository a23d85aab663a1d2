"""The S3 store's settings, from the ``[plugins.s3]`` table.

Credentials are never settings: they come from the standard AWS chain
(``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, the shared credentials
file, an instance or pod role), so no secret is written into BuildMax's
configuration.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from buildmax.config import ConfigError

MIB = 2**20
#: S3's smallest part of a multipart upload (all but the last part).
MIN_PART_BYTES = 5 * MIB
ADDRESSING_STYLES = ("auto", "path", "virtual")


@dataclass(frozen=True)
class S3Settings:
    """Where the S3 API is and how large the parts of an upload are."""

    #: The S3 API's URL; empty: AWS's own for the region.
    endpoint_url: str = ""
    #: The bucket's region; empty: the AWS chain's (``AWS_REGION``, the
    #: shared config), else ``us-east-1``.
    region: str = ""
    #: ``path`` for most self-hosted servers (MinIO, Ceph, moto), ``virtual``
    #: or ``auto`` for AWS.
    addressing_style: str = "auto"
    #: Bytes an upload gathers (on local disk) before it sends a part (at
    #: least 5 MiB); a blob smaller than this is sent with one request.
    part_size: int = 8 * MIB
    #: Tries per S3 call (the first included) before a request fails with 503.
    max_attempts: int = 3
    #: Where parts wait on local disk before they are sent; empty: the
    #: system's temporary directory (``TMPDIR``).
    spool_dir: str = ""

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> S3Settings:
        """Settings from a ``[plugins.s3]`` table; unknown keys and bad
        values are a :class:`ConfigError` naming the key."""
        unknown = sorted(set(raw) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ConfigError(f"[plugins.s3]: unknown setting(s) {', '.join(unknown)}")
        for key in ("endpoint_url", "region", "addressing_style", "spool_dir"):
            if key in raw and not isinstance(raw[key], str):
                raise ConfigError(f"[plugins.s3] {key}: expected a string")
        settings = cls(**raw)
        if settings.endpoint_url and not settings.endpoint_url.startswith(("http://", "https://")):
            raise ConfigError("[plugins.s3] endpoint_url: expected an http:// or https:// URL")
        if settings.addressing_style not in ADDRESSING_STYLES:
            raise ConfigError(
                f"[plugins.s3] addressing_style: expected one of {', '.join(ADDRESSING_STYLES)}"
            )
        part = settings.part_size
        if isinstance(part, bool) or not isinstance(part, int) or part < MIN_PART_BYTES:
            raise ConfigError(
                f"[plugins.s3] part_size: expected an integer of at least {MIN_PART_BYTES}"
            )
        if settings.spool_dir and not os.path.isdir(settings.spool_dir):
            raise ConfigError(f"[plugins.s3] spool_dir: {settings.spool_dir!r} is not a directory")
        attempts = settings.max_attempts
        if isinstance(attempts, bool) or not isinstance(attempts, int) or not 1 <= attempts <= 10:
            raise ConfigError("[plugins.s3] max_attempts: expected an integer from 1 to 10")
        return settings
