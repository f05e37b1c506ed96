"""The one place where a failure becomes what the user sees and the exit code a script reads.

Commands only parse their arguments and call the module that owns the job. Whatever reaches the top — a domain
error from ``ddtree_deploy.errors`` (it carries its exit code), a usage error from the command-line parser, Ctrl-C,
or a bug — is turned here into one line and a hint on stderr (one JSON object on stdout under ``--json``), and an
exit code: 0 ok, 1 failed (rolled back), 2 usage or bad input, 3 host unreachable, 4 ABI incompatible, 5 patch
does not apply, 6 the host lock is held by another run, 130 interrupted. No traceback unless ``-v`` asks for one
(and then only for a bug).

Suggestions come from the parser, never from its message text: click's ``NoSuchOption.possibilities`` for an
option, and for a command ``NoSuchCommand.possibilities``, raised by ``Group`` (the class of every command group
of the app) in the same shape, because click offers none for commands and typer writes its suggestion into the
message.
"""

from __future__ import annotations

import difflib
import json
import logging
import sys
from dataclasses import asdict, dataclass
from typing import Any

import typer
from rich.markup import escape

from .console import err
from .errors import EXIT_ABI, EXIT_FAILED, EXIT_LOCKED, EXIT_PATCH, EXIT_UNREACHABLE, EXIT_USAGE, DeployError

try:  # typer >= 0.29 runs on its own bundled copy of click and no longer installs the click package
    from typer._click import exceptions as click_exceptions
    from typer._click import globals as click_globals
except ImportError:  # older typer runs on the click package
    from click import exceptions as click_exceptions  # type: ignore[no-redef]
    from click import globals as click_globals  # type: ignore[no-redef]

EXIT_INTERRUPTED = 130
_ABORTS: tuple[type[BaseException], ...] = tuple(
    x for x in (KeyboardInterrupt, typer.Abort, getattr(click_exceptions, "Abort", None)) if x is not None)
_KIND = {EXIT_FAILED: "failed", EXIT_USAGE: "input", EXIT_UNREACHABLE: "unreachable", EXIT_ABI: "abi",
         EXIT_PATCH: "patch", EXIT_LOCKED: "locked"}
log = logging.getLogger("ddtree_deploy")


class NoSuchCommand(click_exceptions.UsageError):
    """A subcommand that does not exist, with the close ones (as click's NoSuchOption carries for options)."""

    def __init__(self, name: str, commands: list[str], ctx: Any = None) -> None:
        super().__init__(f"No such command {name!r}.", ctx)
        self.name = name
        self.possibilities = difflib.get_close_matches(name, commands, n=3, cutoff=0.5)


class Group(typer.core.TyperGroup):
    """Every command group of the app: an unknown subcommand raises NoSuchCommand (its suggestions attached)."""

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        if args and not args[0].startswith("-") and self.get_command(ctx, args[0]) is None and not ctx.resilient_parsing:
            raise NoSuchCommand(args[0], self.list_commands(ctx), ctx)
        return super().resolve_command(ctx, args)


def missing_argument(name: str) -> BaseException:
    """The parser's own "missing argument" error, for an argument a command checks itself (HOST or --host)."""
    return click_exceptions.MissingParameter(ctx=click_globals.get_current_context(silent=True), param_type="argument",
                                             param_hint=f"'{name}'")


def usage(message: str) -> BaseException:
    """A usage error of the current command (exit 2, the usage line as hint)."""
    return click_exceptions.UsageError(message, ctx=click_globals.get_current_context(silent=True))


@dataclass(frozen=True)
class Failure:
    """What the user is told: a kind scripts can match on, one line, an optional hint, and the exit code."""

    kind: str
    message: str
    hint: str | None
    exit_code: int


def classify(exc: BaseException) -> Failure:
    """Map any exception that reached the top to a Failure (the only exit-code mapping of the CLI)."""
    if isinstance(exc, DeployError):
        return Failure(_KIND.get(exc.exit_code, "failed"), exc.message, exc.hint, exc.exit_code)
    if isinstance(exc, click_exceptions.UsageError):
        message, hint = usage_error(exc)
        return Failure("usage", message, hint, EXIT_USAGE)
    if isinstance(exc, click_exceptions.ClickException):
        return Failure("usage", _sentence(exc.format_message()), None, exc.exit_code or EXIT_USAGE)
    if isinstance(exc, _ABORTS):
        return Failure("interrupted", "interrupted", None, EXIT_INTERRUPTED)
    if isinstance(exc, OSError) and exc.filename:
        return Failure("failed", f"{exc.filename}: {exc.strerror or exc}", None, EXIT_FAILED)
    return Failure("internal", f"internal error: {type(exc).__name__}: {exc}",
                   "rerun with -v for the traceback, and please report it", EXIT_FAILED)


def usage_error(exc: Any) -> tuple[str, str]:
    """One line and a hint for a parser error: what was wrong, the parser's suggestion when it has one, where the
    help is."""
    ctx = getattr(exc, "ctx", None)
    command = ctx.command_path if ctx is not None else "ddtree-deploy"
    help_hint = f"`{command} --help` shows the usage"
    close = list(getattr(exc, "possibilities", None) or [])
    if isinstance(exc, NoSuchCommand):
        message = f"no such command {exc.name!r}"
        close = [repr(c) for c in close]
        help_hint = f"`{command} --help` lists the commands"
    elif isinstance(exc, click_exceptions.NoSuchOption):
        message = f"no such option {exc.option_name}"
    else:
        message = _sentence(exc.format_message())
        if ctx is not None and (isinstance(exc, click_exceptions.MissingParameter)
                                or type(exc) is click_exceptions.UsageError):
            help_hint = f"{_sentence(ctx.get_usage())}; {help_hint}"
    suggestion = f"did you mean {' or '.join(close)}? " if close else ""
    return message, f"{suggestion}{help_hint}"


def _sentence(text: str) -> str:
    """Click's "Missing argument 'HOST'." -> "missing argument 'HOST'": our messages are lower-case, no full stop."""
    text = " ".join(text.strip().split())
    if text[:1].isupper() and not text[1:2].isupper():
        text = text[0].lower() + text[1:]
    return text[:-1] if text.endswith(".") and not text.endswith("..") else text


def report(failure: Failure, *, as_json: bool, verbose: bool = False, exc: BaseException | None = None) -> None:
    """Tell the user: ``error: ...`` + ``hint: ...`` on stderr, or one JSON object on stdout under --json."""
    if verbose and exc is not None and failure.kind == "internal":
        log.exception("traceback of the internal error")
    if as_json:
        sys.stdout.write(json.dumps({"ok": False, "error": asdict(failure)}, indent=2) + "\n")
        return
    err.print(f"[bold red]error:[/bold red] {escape(failure.message)}", highlight=False, soft_wrap=True)
    if failure.hint:
        err.print(f"  hint: {escape(failure.hint)}", highlight=False, soft_wrap=True)


def show_help_for_missing_command(exc: Any) -> int:
    """A group called without a subcommand prints its help on stdout once (``ddtree-deploy server``); exit 2.

    The parser made the help when it raised: typer's rich help is printed by the making (the message is then
    empty), plain help is the message."""
    text = exc.format_message()
    if text:
        sys.stdout.write(text.rstrip("\n") + "\n")
    return EXIT_USAGE


def is_no_args_help(exc: BaseException) -> bool:
    no_args = getattr(click_exceptions, "NoArgsIsHelpError", None)
    return no_args is not None and isinstance(exc, no_args)
