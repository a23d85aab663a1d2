"""BuildMax's audit trail: every audited change lands, in its own
transaction, as an event on its space's hash chain (or the system chain);
the trail can be searched, exported as JSON Lines, verified and trimmed by a
retention policy that keeps it verifiable."""
