"""The pluggy markers for project ``buildmax``.

Plugins decorate their hook implementations with :data:`hookimpl`; the
contract modules declare hooks with :data:`hookspec`.
"""

import pluggy

PROJECT_NAME = "buildmax"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)
