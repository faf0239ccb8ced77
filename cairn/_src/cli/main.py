"""The ``cairn`` command line: inspect, verify, prune, plot and summarize runs.

Every command takes a run directory (a path or any URI Cairn resolves) and exits non-zero
with a one-line error on bad input: exit code 2 for a bad argument or a file that is not
what Cairn wrote (the run's files are untrusted input), never a traceback. The subcommands
live in :mod:`cairn._src.cli.runs` and :mod:`cairn._src.cli.plots`. This is the only place
that configures logging handlers.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import sys
from collections.abc import Sequence

from cairn._src.cli import plots, runs, show
from cairn._src.errors import CairnError
from cairn._src.storage.uris import redact_text
from cairn._src.text import printable, printable_lines


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cairn", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log decisions")
    parser.add_argument("--version", action="version", version=f"cairn {_version()}",
                        help="print the installed version and exit")
    commands = parser.add_subparsers(dest="command", required=True)
    runs.register(commands)
    show.register(commands)
    plots.register(commands)
    return parser


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("cairn-train")
    except metadata.PackageNotFoundError:
        from cairn._src.version import __version__

        return __version__


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        # The reader went away (``cairn ls X | head -1``): no traceback, no error line, and
        # no second error when the interpreter flushes stdout at exit (what is still
        # buffered goes to /dev/null). 141 is what a shell reports for a command SIGPIPE
        # ended.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 141


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The arguments; a usage error exits 2 as argparse does, and with ``--json`` its one
    line goes to stdout too, as ``{"error", "command"}`` (the documented contract)."""
    words = list(sys.argv[1:] if argv is None else argv)
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            return build_parser().parse_args(words)
    except SystemExit as exc:
        # argparse quotes the words it refuses: a URI's credentials are masked.
        text = redact_text(said.getvalue())
        sys.stderr.write(text)
        lines = text.strip().splitlines()
        if exc.code == 2 and "--json" in words and lines:
            command = next((w for w in words if not w.startswith("-")), None)
            print(json.dumps({"error": lines[-1].partition("error: ")[2] or lines[-1],
                              "command": command}))
        raise


def _main(argv: Sequence[str] | None) -> int:
    args = _parse(argv)
    handler = logging.StreamHandler()
    handler.setFormatter(SafeFormatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        handlers=[handler])
    try:
        code: int = args.func(args)
    except BrokenPipeError:
        raise  # before OSError: a closed pipe ends the command quietly, in main()
    except CairnError as exc:
        return _error(args, str(exc))
    except (OSError, ValueError, TypeError, KeyError, RecursionError) as exc:
        # The run's files are untrusted input: whatever they hold, one line, never a
        # traceback.
        return _error(args, f"{type(exc).__name__}: {exc}")
    except ArithmeticError as exc:
        # The schemas refuse numbers no double holds (a "ttl_s" of 10**400); should one
        # still reach arithmetic, it is the run's files that hold it, not a Cairn bug.
        return _error(args, f"a number in the run's files is out of range: they are not "
                            f"files Cairn wrote ({type(exc).__name__}: {exc})")
    sys.stdout.flush()
    return code


class SafeFormatter(logging.Formatter):
    """Log lines as every other line the command prints: a URI's credentials masked and
    control characters escaped (a warning quotes names and URIs read from the run, which
    may be forged or written by an older version); line breaks stay (a traceback)."""

    def format(self, record: logging.LogRecord) -> str:
        return printable_lines(redact_text(super().format(record)))


def _error(args: argparse.Namespace, message: str) -> int:
    """Exit code 2 with the one-line error on stderr; with ``--json``, stdout gets it too,
    as ``{"error": ...}``, so a program reading stdout gets JSON either way."""
    # A URI in the message (an argument, or quoted by a storage library) is shown with
    # its credentials masked, as StorageLocation.display() shows it.
    message = redact_text(" ".join(message.split()))
    # Messages quote names read from storage: escaped for the terminal, whole in the JSON.
    print(f"cairn {args.command}: error: {printable(message)}", file=sys.stderr)
    if getattr(args, "json", False):
        print(json.dumps({"error": message, "command": args.command}))
    return 2


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())


if __name__ == "__main__":
    run()
