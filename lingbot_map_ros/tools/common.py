"""CLI options shared by the tools, derived from the one settings table (``core/settings.py``).

An option is the node parameter of the same name with dashes (``--sliding-window`` for
``sliding_window``), with the same default, type, allowed values and description, and the same
validation: the tools and the node cannot disagree about what a setting means or allows.
"""
from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Iterable, Optional

from ..core.config import RuntimeConfig, StreamConfig
from ..core.settings import (
    RUNTIME_FIELDS,
    SETTINGS_BY_NAME,
    STREAM_FIELDS,
    configs_from_values,
    defaults,
    validate_values,
)

SESSION_OPTIONS: tuple[str, ...] = RUNTIME_FIELDS + STREAM_FIELDS


def add_session_options(parser: argparse.ArgumentParser, *, names: Iterable[str] = SESSION_OPTIONS,
                        overrides: Optional[dict[str, Any]] = None, with_depth: bool = True) -> None:
    """Add ``--<setting>`` for each of ``names``; ``overrides`` changes a tool's defaults (the demo's
    short window, say) and ``--help`` shows the value that applies."""
    overrides = overrides or {}
    names = [n for n in names if with_depth or n != "depth_every"]  # a tool without the depth head
    g = parser.add_argument_group("model and session (same names, defaults and rules as the node parameters)")
    for name in names:
        s = SETTINGS_BY_NAME[name]
        s = dataclasses.replace(s, description=s.description.replace("%", "%%"))  # argparse formats help with %
        default = overrides.get(name, s.default)
        if isinstance(s.default, bool):
            g.add_argument(s.option, action=argparse.BooleanOptionalAction, default=default,
                           help=f"{s.description} (default: {default})")
            continue
        extra = f"; one of {', '.join(repr(c) for c in s.choices)}" if s.choices else ""
        if s.range:
            extra += f"; {s.range[0]}..{s.range[1]}"
        g.add_argument(s.option, type=type(s.default), default=default, choices=s.choices, metavar=name.upper(),
                       help=f"{s.description} (default: {default!r}{extra})")
    if with_depth:
        g.add_argument("--with-depth", action="store_true", help="run the DPT depth head (the node's publish_depth)")


def settings_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The full settings dict: the table's defaults, then every session option the parser has."""
    values = defaults()
    for name in SESSION_OPTIONS:
        if hasattr(args, name):
            values[name] = getattr(args, name)
    values["publish_depth"] = bool(getattr(args, "with_depth", False))
    return values


def check_session_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse invalid settings before any work, in one line (argparse's usage error, exit 2)."""
    problems = validate_values(settings_from_args(args), resolve=False)
    if problems:
        parser.error("; ".join(problems))


def runtime_from_args(args: argparse.Namespace) -> RuntimeConfig:
    return configs_from_values(settings_from_args(args))[0]


def stream_from_args(args: argparse.Namespace) -> StreamConfig:
    return configs_from_values(settings_from_args(args))[1]
