"""BuildMax's web dashboard: the queue, its attention list, the board, the
task pages and decisions for the people who supervise agents, rendered on
the server at ``/ui/`` from the same API routes every client uses."""
