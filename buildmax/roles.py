"""The kinds of principal and the roles the kernel knows.

Kept free of heavy imports: the command line uses them for ``--help``.
"""

PRINCIPAL_KINDS = ("human", "agent", "service")
SYSTEM_ROLES = ("admin", "operator")
#: Space roles from least to most powerful.
SPACE_ROLES = ("viewer", "member", "admin", "owner")
