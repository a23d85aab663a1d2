"""BuildMax's work queue and stage engine (the ``tasks`` plugin).

Projects, tasks with immutable criteria revisions and dependencies, claims
owned by exactly one principal under a lease with a fencing generation,
recovery of lapsed leases, resource reservations, holds, human decisions,
agent definitions, submissions, and the stage engine that moves submitted
work through the stages other plugins supply.
"""

__version__ = "0.1.0"
