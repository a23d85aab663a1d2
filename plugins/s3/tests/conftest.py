"""The S3 store's tests run against a local S3 server (moto's server mode)."""

from buildmax_s3.testing import s3_bucket, s3_server  # noqa: F401
