"""BuildMax's imports: a team's backlog read from a beads export, a CSV
file or GitHub's issue list, each record checked and reported with its
line, through importers any plugin may add (``buildmax_importers``)."""
