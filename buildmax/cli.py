"""The ``buildmax`` command line: the root group and plugin commands."""

from __future__ import annotations

import logging
import sys

import click

from . import __version__
from .config import ConfigError, load_config
from .plugins import PluginLoadError, create_plugins


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="buildmax")
@click.option("-v", "--verbose", is_flag=True, help="Log debug output to stderr.")
def cli(verbose: bool) -> None:
    """BuildMax: a coordination server for AI coding agents.

    Start a server with `buildmax serve`; manage it over HTTP with the other
    commands (`buildmax login` first). Settings come from --config /
    BUILDMAX_CONFIG, BUILDMAX_* variables and flags.
    """
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if not verbose:
        # One line per HTTP request is noise for a person at a terminal.
        logging.getLogger("httpx").setLevel(logging.WARNING)
        logging.getLogger("httpx2").setLevel(logging.WARNING)  # the MCP SDK's client


def _register_commands() -> None:
    from .commands import backup, identity, server, status

    server.register(cli)
    backup.register(cli)
    identity.register(cli)
    status.register(cli)
    try:
        settings = load_config()
        plugins = create_plugins(allow=settings.plugin_allow_list, strict=settings.strict_plugins)
    except (ConfigError, PluginLoadError) as exc:
        click.echo(f"buildmax: {exc}", err=True)
        return
    plugins.hooks.register_commands(cli)


def main() -> None:
    """Console-script entry point."""
    _register_commands()
    cli()
