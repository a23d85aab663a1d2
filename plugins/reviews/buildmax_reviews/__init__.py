"""BuildMax's review and integration stages.

Installing this plugin turns implement → done into implement → review →
integrate → done: it supplies the ``review`` and ``integrate`` stages to
the tasks plugin's stage engine, judges the review and integration work
handed in, and keeps reviews, findings and integrations.
"""
