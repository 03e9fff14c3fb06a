"""How a setting is declared: a dataclass field that is also a command-line flag.

Both the replica's settings (``replica.config``) and the cluster's (``router.config``) are
declared with these, so one flag parser (``router.flags``) builds every command line from the
same classes. Torch-free and dependency-free: anything may import it.
"""

from __future__ import annotations

from dataclasses import field
from typing import Any


def setting(default: Any, help: str = "", *, choices: tuple | None = None, cli: bool = True):
    """A dataclass field that is also a command-line flag (``--name-with-dashes``), unless
    ``cli`` is False; ``help`` and ``choices`` go to the flag."""
    return field(default=default, metadata={"help": help, "choices": choices, "cli": cli})


def nested(cls: type):
    """A field holding a settings dataclass whose own settings become flags too."""
    return field(default_factory=cls, metadata={"nested": True})
