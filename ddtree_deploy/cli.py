"""The ``ddtree-deploy`` command line. Thin: parse, call the module that owns the job, print, exit with its code.

Commands live in ``ddtree_deploy/commands/`` (each module's ``register(app)`` adds them); every failure that
reaches the top is turned into one line + a hint and an exit code in one place, ``ddtree_deploy.cli_errors``.
Exit codes: 0 ok; 1 operation failed (probe failed, rolled back); 2 usage or bad input; 3 host unreachable or SSH
failure; 4 ABI incompatibility; 5 patch does not apply to this base; 6 the host lock is held by another run.
"""

from __future__ import annotations

import importlib
import logging
import sys

import typer

from . import __version__, cli_errors
from .console import fold_help_text, out, set_wide, setup_logging, take_wide_flag

PROG = "ddtree-deploy"

app = typer.Typer(
    cls=cli_errors.Group,
    help=(
        "Deploy DDTree speculative decoding onto the SGLang already installed on your GPU hosts.\n\n"
        "Flow: snapshot the installed SGLang → check a DDTree patch set applies → ABI-check the hosts → push an overlay "
        "release (the installed package is never edited) → restart → probe → roll back automatically on failure.\n\n"
        "Exit codes: 0 ok, 1 failed (rolled back), 2 bad input, 3 host unreachable, 4 ABI incompatible, 5 patch does not "
        "apply, 6 host locked by another run."
    ),
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

#: Modules under ddtree_deploy/commands/ that add their commands to the app (each defines ``register(app)``).
COMMAND_MODULES = ("hosts", "snapshot", "abi", "patchset", "deploy", "server", "tune", "sandbox")
VERBOSE_FLAGS = ("-v", "-vv", "-vvv", "--verbose")


def _version(value: bool) -> None:
    if value:
        out.print(f"{PROG} {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="print the version"),
    verbose: int = typer.Option(0, "--verbose", "-v", count=True, help="debug logging on stderr: connections, commands "
                                "and their timings, paths chosen (-vv: the SSH library's too); accepted anywhere"),
    wide: bool = typer.Option(False, "--wide", help="tables at their full width, never re-laid out for the "
                              "terminal (also -o wide); accepted anywhere"),
) -> None:
    """Deploy DDTree onto installed SGLang."""
    setup_logging(verbose)
    if wide:
        set_wide()


fold_help_text()
for _name in COMMAND_MODULES:
    importlib.import_module(f"ddtree_deploy.commands.{_name}").register(app)


def hoist_global_flags(args: list[str]) -> tuple[list[str], int]:
    """``-v`` is global but people type it after the command (``apply -v --host h``): move it to the front.

    Returns the arguments and the verbosity. Anything after ``--`` is left alone.
    """
    end = args.index("--") if "--" in args else len(args)
    flags = [a for a in args[:end] if a in VERBOSE_FLAGS]
    rest = [a for a in args[:end] if a not in VERBOSE_FLAGS] + args[end:]
    verbosity = sum(1 if f == "--verbose" else f.count("v") for f in flags)
    return (["-" + "v" * verbosity] if verbosity else []) + rest, verbosity


def wants_json(args: list[str]) -> bool:
    end = args.index("--") if "--" in args else len(args)
    return "--json" in args[:end]


def main(argv: list[str] | None = None) -> None:
    """Console-script entry: run the app; whatever goes wrong leaves through cli_errors with its exit code."""
    args, verbosity = hoist_global_flags(take_wide_flag(list(sys.argv[1:] if argv is None else argv)))
    as_json = wants_json(args)
    try:
        code = app(args=args, prog_name=PROG, standalone_mode=False)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except SystemExit:
        raise
    except BaseException as exc:
        if cli_errors.is_no_args_help(exc):
            sys.exit(cli_errors.show_help_for_missing_command(exc))
        if not logging.getLogger().handlers:
            setup_logging(verbosity)  # the parser failed before the root callback ran
        failure = cli_errors.classify(exc)
        cli_errors.report(failure, as_json=as_json, verbose=verbosity > 0, exc=exc)
        sys.exit(failure.exit_code)
    sys.exit(code if isinstance(code, int) else 0)
