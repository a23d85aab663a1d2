"""An entry point whose loading raises while ``BUILDMAX_TESTPLUGIN_BREAK=1``.

The kernel's tests use it to prove a broken plugin is reported by name and
skipped (or aborts start-up in strict mode)."""

from __future__ import annotations

import os
import types
from typing import Any


def __getattr__(name: str) -> Any:
    if name == "plugin":
        if os.environ.get("BUILDMAX_TESTPLUGIN_BREAK") == "1":
            raise RuntimeError("the broken test plugin refuses to load")
        return types.SimpleNamespace()
    raise AttributeError(name)
