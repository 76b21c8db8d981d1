"""The seam between `specroute` and the commands other distributions add to it.

A distribution registers each of its commands in the entry-point group
`specroute.commands` (as pytest's plugins do in `pytest11`): `NAME = "package.module"`,
a module that is a `Command`. specroute-tools registers its own in tooling/pyproject.toml.
`specroute` lists the names installed and imports only the module of the command that
runs, so the gateway starts without the tools' dependencies and gateway/ names no tool.
Both sides build their --help from `Help`, so every command reads alike.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import textwrap
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

if TYPE_CHECKING:
    from gateway.config import Config

GROUP = "specroute.commands"


@dataclasses.dataclass(frozen=True, slots=True)
class Help:
    """A command as --help shows it: its line in `specroute --help`, then the paragraph
    and the examples (`specroute NAME ...`, one to four) of `specroute NAME --help`."""

    summary: str
    description: str
    examples: tuple[str, ...]

    def options(self, *sections: str) -> dict[str, Any]:
        """What ArgumentParser (or a subparser) takes to show this help; `sections`
        follow the examples."""
        return {
            "description": wrap(self.description),
            "epilog": epilog(self.examples, *sections),
            "formatter_class": HelpFormatter,
        }


class Command(Protocol):
    """What a registered module offers: its help, its flags, and the run."""

    HELP: Help

    def add_arguments(self, p: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace, argv: list[str]) -> int: ...


class ServesEmulated(Protocol):
    """What an `emulate` command adds to `specroute serve --emulate`: its own flags, and
    the gateway served in front of EMULATED servers. `config` is the --config file as
    `serve` resolved it (its flags on top), None without one."""

    def add_serve_arguments(self, p: argparse.ArgumentParser) -> None: ...

    def serve_emulated(self, args: argparse.Namespace, config: Config | None) -> int: ...


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and examples as written; each flag's default where it has one and its
    help does not already say it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        unset = action.default in (None, False, [], argparse.SUPPRESS)
        if unset or not action.option_strings or "default" in text:
            return text
        return f"{text} (default: %(default)s)"


def epilog(examples: Sequence[str], *sections: str) -> str:
    """--help's closing text: the examples, then each section after a blank line."""
    return "\n\n".join(("examples:\n" + "\n".join(f"  {e}" for e in examples), *sections))


def wrap(text: str) -> str:
    return textwrap.fill(text, 88)


def installed() -> dict[str, importlib.metadata.EntryPoint]:
    """The commands registered, by name, in the order the metadata lists them (the first
    of a name wins). Nothing is imported."""
    found: dict[str, importlib.metadata.EntryPoint] = {}
    for entry in importlib.metadata.entry_points(group=GROUP):
        found.setdefault(entry.name, entry)
    return found


def load(entry: importlib.metadata.EntryPoint) -> Command:
    """Import one registered command. A module that lacks a part of `Command` is named
    (its distribution's mistake), not left to fail later as an AttributeError."""
    module = entry.load()
    missing = [part for part in ("HELP", "add_arguments", "run") if not hasattr(module, part)]
    if missing:
        raise TypeError(
            f"{GROUP} {entry.name} = {entry.value}: not a command, it has no {', '.join(missing)}"
        )
    return cast(Command, module)
