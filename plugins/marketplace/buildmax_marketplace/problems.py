"""The marketplace plugin's problem types (``urn:buildmax:problem:<slug>``).

A package whose bytes are gone from the store answers the kernel's 410
``blob-missing`` (:class:`buildmax.problems.BlobMissing`), as artifacts do.
"""

from __future__ import annotations

from buildmax.problems import Conflict, ValidationFailed


class PackageInvalid(ValidationFailed):
    """422: the release archive was refused (its manifest, its layout, its size)."""

    slug, title = "package-invalid", "The release archive was refused"


class ReleaseExists(Conflict):
    """409: this version of the plugin was published with other bytes."""

    slug, title = "release-exists", "This version was published with other bytes"


class PluginArchived(Conflict):
    """409: the plugin is archived: no new release, activation or pin."""

    slug, title = "plugin-archived", "The plugin is archived"


class ReleaseDigestMismatch(Conflict):
    """409: the sha256 a request names is not the release's (an eligibility
    decision or a pin made against other bytes)."""

    slug, title = "release-digest-mismatch", "The digest named is not this release's"


class ActivationRefused(ValidationFailed):
    """422: the activation policy refused this release in this space."""

    slug, title = "activation-refused", "The activation policy refused this release"
