"""Command-line flags generated from the settings dataclasses (``replica.settings.setting``).

Every field declared with ``setting(...)`` becomes ``--name-with-dashes`` with its default, help
text and choices; fields declared with ``nested(...)`` contribute their own settings. Flag names
are the field names, so they must be unique across the whole tree (checked). ``build`` makes a
config from flat flag values, ``add_arguments`` / ``from_arguments`` bridge to argparse.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from collections.abc import Iterator, Mapping
from typing import Any


def _fields(cls: type) -> Iterator[tuple[dataclasses.Field, type]]:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        yield f, hints[f.name]


def flag_fields(cls: type) -> dict[str, tuple[tuple[str, ...], dataclasses.Field, type]]:
    """Every flag of ``cls``'s tree: name -> (path of nested field names, field, type)."""
    flags: dict[str, tuple[tuple[str, ...], dataclasses.Field, type]] = {}

    def walk(klass: type, path: tuple[str, ...]) -> None:
        for f, hint in _fields(klass):
            if f.metadata.get("nested"):
                walk(hint, (*path, f.name))
            elif f.metadata.get("cli"):
                if f.name in flags:
                    raise TypeError(f"setting {f.name!r} is declared twice in {cls.__name__}")
                flags[f.name] = ((*path, f.name), f, hint)

    walk(cls, ())
    return flags


def build(cls: type, values: Mapping[str, Any], defaults: Any = None) -> Any:
    """An instance of ``cls`` with the flat flag ``values`` set, the rest from ``defaults``
    (an instance of ``cls``) or the fields' own defaults. Unknown names raise ``TypeError``."""
    flags = flag_fields(cls)
    unknown = sorted(set(values) - set(flags))
    if unknown:
        raise TypeError(f"unknown settings {unknown} for {cls.__name__}")

    def make(klass: type, path: tuple[str, ...], base: Any) -> Any:
        kwargs = {}
        for f, hint in _fields(klass):
            if f.metadata.get("nested"):
                kwargs[f.name] = make(hint, (*path, f.name), getattr(base, f.name, None))
            elif f.name in values and flags.get(f.name, ((),))[0] == (*path, f.name):
                kwargs[f.name] = values[f.name]
            elif base is not None:
                kwargs[f.name] = getattr(base, f.name)
        return klass(**kwargs)

    return make(cls, (), defaults)


def _scalar(hint: type) -> type:
    """``int`` for ``int``, ``str`` for ``str | None`` and so on."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args else hint


def add_arguments(parser: argparse.ArgumentParser, cls: type, defaults: Any = None) -> None:
    """One flag per setting of ``cls``'s tree; defaults from ``defaults`` when given."""
    base = defaults if defaults is not None else cls()
    for name, (path, f, hint) in flag_fields(cls).items():
        default = base
        for part in path:
            default = getattr(default, part)
        flag = "--" + name.replace("_", "-")
        kind = _scalar(hint)
        meta = f.metadata
        if kind is bool:
            parser.add_argument(
                flag, default=default, help=meta["help"], action=argparse.BooleanOptionalAction
            )
            continue
        shown = "" if default is None else " (default: %(default)s)"
        parser.add_argument(
            flag, type=kind, default=default, choices=meta["choices"], help=meta["help"] + shown
        )


def from_arguments(cls: type, args: argparse.Namespace, defaults: Any = None) -> Any:
    """The config that ``add_arguments`` flags parsed into ``args`` describe."""
    values = {name: getattr(args, name) for name in flag_fields(cls)}
    return build(cls, values, defaults)
