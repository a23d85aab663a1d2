"""BuildMax's catalog of plugin releases that agent runs load: the hardened
archive reader and capability report (:mod:`buildmax_marketplace.package`)."""
