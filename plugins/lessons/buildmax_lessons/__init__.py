"""BuildMax's lessons: what agents and people learn, in a project or the
space's common collection, with revisions, supersession, usefulness votes
and full-text search; carried in by submissions and offered at claim."""
