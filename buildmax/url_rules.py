"""URL rules whose builder functions are made once per process.

Werkzeug turns every rule into two Python functions that build its URL
(``Rule._compile_builder``: an AST, then ``compile``) when the rule is
added to an app. With about a hundred routes that was 80% of the time
:func:`buildmax.app.create_app` takes, paid again by every app a process
builds: each test builds its own. The functions depend only on the rule's
text, its parsed parts and the names of its defaults, so rules that agree
on those share one pair.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from quart.routing import QuartRule

#: ``(append_unknown, rule text, parsed parts, default names)`` -> builder.
_BUILDERS: dict[tuple[Any, ...], Callable[..., tuple[str, str]]] = {}


class SharedBuilderRule(QuartRule):
    """A :class:`~quart.routing.QuartRule` reusing the builder functions of
    an identical rule compiled earlier in the process."""

    def _compile_builder(self, append_unknown: bool = True) -> Callable[..., tuple[str, str]]:
        defaults = self.defaults or {}
        if any(is_dynamic and part in defaults for is_dynamic, part in self._trace):
            # A default for a variable of the rule becomes a constant made by
            # this rule's converter: nothing to share.
            return super()._compile_builder(append_unknown)
        key = (append_unknown, self.rule, tuple(self._trace), tuple(defaults))
        builder = _BUILDERS.get(key)
        if builder is None:
            builder = _BUILDERS[key] = super()._compile_builder(append_unknown)
        return builder
