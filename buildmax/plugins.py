"""The plugin manager: one per app, loading the ``buildmax`` entry points.

Plugins are loaded one by one; one that fails to import or register is
reported by name and skipped, or aborts start-up in strict mode
(``BUILDMAX_STRICT_PLUGINS=1``). ``BUILDMAX_LOAD_PLUGINS`` is an allow-list
("" loads none) and ``BUILDMAX_TRACE_PLUGINS=1`` logs every hook call.
The kernel's essential plugin cannot be disabled.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib.metadata import entry_points

import pluggy
from buildmax_hookspecs import HOOKSPEC_MODULES, PROJECT_NAME

from .hooks import Hooks

log = logging.getLogger("buildmax.plugins")

ENTRY_POINT_GROUP = "buildmax"
ESSENTIAL = "buildmax.essentials"


class PluginLoadError(Exception):
    """A plugin could not be loaded (strict mode) or declares an unknown hook."""


@dataclass
class PluginInfo:
    """What ``buildmax plugins`` shows for one plugin."""

    name: str
    version: str | None
    source: str
    hooks: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def loaded(self) -> bool:
        """False for a plugin that was reported and skipped."""
        return self.error is None


class Plugins:
    """The app's pluggy manager plus what was loaded, skipped and why."""

    def __init__(
        self, pm: pluggy.PluginManager, infos: list[PluginInfo], *, trace: bool = False
    ) -> None:
        self.pm = pm
        self._infos = infos
        #: Every hook call goes through these typed methods.
        self.hooks = Hooks(pm, trace=trace)

    def infos(self) -> list[PluginInfo]:
        """Every plugin seen, with the hooks it implements (loaded ones) or its error."""
        result = []
        for info in self._infos:
            plugin = self.pm.get_plugin(info.name)
            hooks = []
            if plugin is not None:
                hooks = sorted(caller.name for caller in self.pm.get_hookcallers(plugin) or [])
            result.append(PluginInfo(info.name, info.version, info.source, hooks, info.error))
        return result


def create_plugins(
    *,
    essential: object | None = None,
    allow: set[str] | None = None,
    strict: bool = False,
    trace: bool = False,
    extra: Iterable[tuple[str, object]] = (),
) -> Plugins:
    """Build a fresh plugin manager.

    ``essential`` is the kernel's own plugin, registered first under
    :data:`ESSENTIAL` whatever ``allow`` says (the app factory passes
    :mod:`buildmax.essentials`); ``allow`` limits entry-point plugins by
    name (``None`` = all); ``extra`` registers ``(name, plugin)`` pairs
    directly (tests, embedding).
    """
    pm = pluggy.PluginManager(PROJECT_NAME)
    for module in HOOKSPEC_MODULES:
        pm.add_hookspecs(module)
    infos = []
    if essential is not None:
        infos.append(PluginInfo(ESSENTIAL, _kernel_version(), "essential"))
        pm.register(essential, name=ESSENTIAL)

    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        if allow is not None and ep.name not in allow:
            continue
        dist = ep.dist
        version = dist.version if dist is not None else None
        source = f"entry point {ep.value}" + (f" ({dist.name})" if dist is not None else "")
        try:
            plugin = ep.load()
            pm.register(plugin, name=ep.name)
        except Exception as exc:
            message = f"{type(exc).__name__}: {exc}"
            if strict:
                raise PluginLoadError(f"plugin {ep.name!r} failed to load: {message}") from exc
            log.error("plugin %r failed to load and was skipped: %s", ep.name, message)
            infos.append(PluginInfo(ep.name, version, source, error=message))
            continue
        infos.append(PluginInfo(ep.name, version, source))

    for name, plugin in extra:
        pm.register(plugin, name=name)
        infos.append(PluginInfo(name, None, "registered"))

    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise PluginLoadError(f"plugin {exc.plugin!r}: {exc}") from exc
    return Plugins(pm, infos, trace=trace)


def _kernel_version() -> str:
    from . import __version__

    return __version__
