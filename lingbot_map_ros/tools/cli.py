"""What every command-line tool does with bad input: one line, the file or topic, what to do, exit 2.

Why: a Python traceback buries the one useful sentence under thirty lines of frames, and a check
that runs only after the work (``--out`` into a missing folder after an hour of frames) loses it.
So the tools check their inputs and outputs first, raise ``UsageError`` with a sentence naming the
file and the fix, and ``run_tool`` turns it into ``prog: error: <sentence>`` and exit code 2.
``OneLineParser`` makes argparse's own errors (and ``common.check_session_args``, which goes through
``parser.error``) follow the same rule: one line, a pointer to ``--help``.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence

USAGE_EXIT = 2  # argparse's and the shell's convention for "the command line is wrong"
INTERRUPTED_EXIT = 130  # 128 + SIGINT, what a shell reports for Ctrl-C


class UsageError(Exception):
    """A problem with what the user asked for; ``str(exc)`` is the whole message (one line)."""


class OneLineParser(argparse.ArgumentParser):
    """ArgumentParser whose errors are one line (``prog: error: ... (see --help)``), exit 2.

    Defaults are appended to every option's help text (``ArgumentDefaultsHelpFormatter`` would print
    ``(default: None)`` for flags, and duplicate the ones already written), so ``--help`` documents
    each option once.
    """

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(USAGE_EXIT, f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)\n")

    def format_help(self) -> str:
        """Help with ``(default: X)`` on every option that has a default and does not say it already
        (also the options of argument groups, which do not go through this class's add_argument)."""
        for action in self._actions:
            text, default = action.help, action.default
            if (not text or text is argparse.SUPPRESS or "default" in text or not action.option_strings
                    or default is None or default is argparse.SUPPRESS or default == "" or default is False
                    or isinstance(action, (argparse._HelpAction, argparse._VersionAction))):
                continue
            action.help = f"{text} (default: {default})"
        return super().format_help()


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
MAX_MESSAGE = 400  # characters: library errors (torch's unpickler) can run to a page


def one_line(text: str, limit: int = MAX_MESSAGE) -> str:
    """Collapse a message to one readable line: no newlines, no terminal colour codes, not a page long
    (the first ``limit`` characters carry the reason; the rest is a library's advice)."""
    text = " ".join(_ANSI.sub("", str(text)).split())
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def fail(prog: str, message: str, code: int = USAGE_EXIT) -> int:
    """Print ``prog: error: message`` on stderr (one line) and return ``code`` for ``main``."""
    print(f"{prog}: error: {one_line(message)}", file=sys.stderr, flush=True)
    return code


def run_tool(prog: str, main: Callable[[], int]) -> int:
    """Run a tool's body: ``UsageError`` -> one line + exit 2; Ctrl-C before the tool handles it -> 130."""
    try:
        return main()
    except UsageError as exc:
        return fail(prog, str(exc))
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr, flush=True)
        return INTERRUPTED_EXIT


def need_file(path: str, what: str, hint: str = "") -> Path:
    """``path`` exists and is a file, else ``UsageError`` naming it (and ``hint``: what to do)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise UsageError(f"{what} {path}: no such file{'; ' + hint if hint else ''}")
    if not p.is_file():
        raise UsageError(f"{what} {path}: not a file{'; ' + hint if hint else ''}")
    if not os.access(p, os.R_OK):
        raise UsageError(f"{what} {path}: not readable (check its permissions)")
    return p


def need_dir(path: str, what: str, hint: str = "") -> Path:
    p = Path(path).expanduser()
    if not p.exists():
        raise UsageError(f"{what} {path}: no such folder{'; ' + hint if hint else ''}")
    if not p.is_dir():
        raise UsageError(f"{what} {path}: not a folder{'; ' + hint if hint else ''}")
    return p


def output_path(path: str, option: str, extensions: Optional[Sequence[str]] = None) -> Path:
    """Check an output before any work: a known extension, an existing writable folder, not a folder.

    Exact names matter: ``--out x.txt`` must write ``x.txt`` or be refused, never ``x.txt.npz``.
    """
    p = Path(path).expanduser()
    if extensions is not None and p.suffix.lower() not in extensions:
        raise UsageError(f"{option} {path}: unknown extension {p.suffix or '(none)'!r}; "
                         f"use one of {', '.join(extensions)}")
    if p.is_dir():
        raise UsageError(f"{option} {path}: is a folder; give a file name")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"{option} {path}: folder {parent} does not exist; create it first (mkdir -p {parent})")
    if not os.access(parent, os.W_OK):
        raise UsageError(f"{option} {path}: folder {parent} is not writable")
    return p


def output_dir(path: str, option: str) -> Path:
    """An output folder: created by the tool, so its parent must exist and be writable."""
    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        raise UsageError(f"{option} {path}: exists and is not a folder")
    parent = p.parent
    if not p.exists() and not parent.is_dir():
        raise UsageError(f"{option} {path}: folder {parent} does not exist; create it first (mkdir -p {parent})")
    return p


def distinct_outputs(pairs: Iterable[tuple[str, str]]) -> None:
    """Two options naming the same output file would overwrite each other: refuse."""
    seen: dict[str, str] = {}
    for option, path in pairs:
        if not path:
            continue
        key = os.path.realpath(os.path.expanduser(path))
        if key in seen:
            raise UsageError(f"{option} and {seen[key]} both write {path}; give them different names")
        seen[key] = option


def asks_for_help(argv: Sequence[str]) -> bool:
    """``-h`` / ``--help`` among the program's own arguments (before ``--ros-args``, whose ``-h`` is not ours)."""
    own = list(argv)
    if "--ros-args" in own:
        own = own[: own.index("--ros-args")]
    return "-h" in own or "--help" in own


def node_help() -> str:
    """``lingbot_map_node --help``: how to run the node and its parameters (the settings table), without
    starting ROS."""
    from ..core.settings import APPLIES, SETTINGS

    lines = [
        "usage: lingbot_map_node [--ros-args [-p NAME:=VALUE ...] [--params-file FILE] [-r image:=TOPIC]]",
        "",
        "The LingBot-Map managed node: camera images in ('image', or 'image/compressed'), poses, depth, points",
        "and /tf out (README: The node). With autostart (default) it configures and activates itself.",
        "Launch file: ros2 launch lingbot_map_ros lingbot_map.launch.py --show-args",
        "",
        "parameters (NAME (default): meaning; when a change applies):",
    ]
    for s in SETTINGS:
        default = "''" if s.default == "" else s.default
        lines.append(f"  {s.name} ({default}): {s.description} [{APPLIES[s.applies]}]")
    return "\n".join(lines) + "\n"


__all__ = ["INTERRUPTED_EXIT", "OneLineParser", "USAGE_EXIT", "UsageError", "asks_for_help", "distinct_outputs",
           "fail", "node_help", "need_dir", "need_file", "one_line", "output_dir", "output_path", "run_tool"]
