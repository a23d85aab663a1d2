"""BuildMax's ``s3`` blob store (distribution ``buildmax-s3``)."""

from .store import S3BlobStore

__all__ = ["S3BlobStore"]
