"""BuildMax's artifacts: the evidence agents produce (logs, patches, test
reports, screenshots), streamed into the blob store with their digest
checked and their size reserved against quotas, and read back byte for byte
by the members of the owning space only."""
