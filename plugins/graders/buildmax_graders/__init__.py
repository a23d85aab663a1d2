"""BuildMax's graders and qualification runner (``buildmax qualify``).

The built-in graders check what anyone could observe of a real server: HTTP
answers, JSON documents, digests, command output, database rows, audit
events and the absence of forbidden side effects. The runner drives the
critical journeys of ``qualification/journeys/`` against fresh server
processes and writes an evidence bundle per journey.
"""
