"""Options and arguments several commands share, so their names, defaults and help read the same everywhere.

Hosts are chosen the same way on every command that takes them: positionally (``probe gpu1``) or with ``--host`` /
``-H`` (``probe -H gpu1``), each value a host pattern (``-H a,b``, ``-H 'gpu*'``, a group, ``all``, ``!x``) as
``Inventory.select`` reads it, and narrowed by ``--limit``. A command that works on one host refuses a pattern that
names several.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from ..inventory import Host


def complete_host(incomplete: str) -> list[str]:
    """Shell completion for host arguments: the host and group names of the default inventory (bad files are
    skipped quietly)."""
    from ..inventory import scan_inventory

    try:
        inv = scan_inventory(None)
        names = sorted({*inv.hosts, *inv.groups})
    except Exception:  # completion must never print an error into the user's shell
        return []
    return [n for n in names if n.startswith(incomplete)]


_TERM = re.compile(r"^!?[^\s,!]+$")


def host_patterns(value: str) -> list[str]:
    """The parser (typer's custom parameter type) of a host pattern value: ``a,b`` -> ["a", "b"]. Each term is one
    word, optionally with a leading ``!``; an empty term (``a,,b``) is refused here, at parse time, naming the
    option. Typer 0.29 runs on its own copy of click and takes a ``parser=`` callable where click took a
    ``ParamType``."""
    if isinstance(value, list):  # a default, already parsed
        return value
    terms = [t.strip() for t in str(value).split(",")]
    bad = [t for t in terms if not _TERM.match(t)]
    if bad:
        raise typer.BadParameter(f"{value!r}: expected host names, groups or patterns separated by commas "
                                 "(a,b or 'gpu*'), got an empty or spaced term")
    return terms


INVENTORY_HELP = ("inventory directory, read alone (default: $DDTREE_INVENTORY; else the checkout's hosts/ and "
                  "~/.config/ddtree-deploy/hosts both)")
STORE_HELP = ("snapshot store directory (default: $DDTREE_SNAPSHOTS, the checkout's snapshots/, else "
              "~/.local/share/ddtree-deploy/snapshots)")
PATTERN_HELP = "host, group, glob ('gpu*'), all, or a comma list of them (a,b); !x leaves x out"

InventoryOpt = typer.Option(None, "--inventory", "-i", help=INVENTORY_HELP)
StoreOpt = typer.Option(None, "--store", help=STORE_HELP)
JsonOpt = typer.Option(False, "--json", help="print JSON instead of tables (errors too)")
AllHostsOpt = typer.Option(False, "--all", help="every host of the inventory (the pattern 'all')")
DryRunOpt = typer.Option(False, "--dry-run", help="say what would change (summary first); touch nothing")
BreakLockOpt = typer.Option(False, "--break-lock", help="take the host lock even if another run holds it")
PatchesOpt = typer.Option(None, "--patches", help="patch-set root (default: $DDTREE_PATCHES, the checkout's patches/, "
                       "else the patch sets installed with ddtree-deploy)")
#: One host: positional ``HOST`` or ``--host/-H HOST`` (either; both is an error).
HostArg = typer.Argument(None, metavar="HOST", help="host name (or the path of its YAML file); or give --host",
                         autocompletion=complete_host, show_default=False)
HostOpt = typer.Option(None, "--host", "-H", metavar="HOST", help="host name (or the path of its YAML file)",
                       autocompletion=complete_host, show_default=False)
#: Several hosts: positional patterns and/or repeated ``-H PATTERN``, and ``--limit PATTERN``.
HostsArg = typer.Argument(None, metavar="PATTERN", help=PATTERN_HELP, parser=host_patterns,
                          autocompletion=complete_host, show_default=False)
HostsOpt = typer.Option(None, "--host", "-H", metavar="PATTERN", help=f"{PATTERN_HELP}; repeatable",
                        parser=host_patterns, autocompletion=complete_host, show_default=False)
LimitOpt = typer.Option(None, "--limit", "-l", metavar="PATTERN", help="only the chosen hosts this pattern also "
                        "names (alone: of all hosts), like Ansible's --limit", parser=host_patterns,
                        autocompletion=complete_host, show_default=False)


def _flat(values: list[list[str]] | None) -> list[str]:
    return [t for v in values or [] for t in v]


def one_host(arg: str | None, opt: str | None, inventory: Path | None) -> "Host":
    """The host of a one-host command, given as ``HOST`` or ``--host HOST`` (exit 2 for neither, both, or a
    pattern naming several)."""
    from ..cli_errors import missing_argument, usage
    from ..errors import InputError
    from ..inventory import resolve_host, scan_inventory

    if arg and opt and arg != opt:
        raise usage(f"two hosts given ({arg!r} and --host {opt!r}); this command works on one: give HOST or --host")
    name = arg or opt
    if not name:
        raise missing_argument("HOST")
    if "," not in name and not name.startswith("!") and not any(c in name for c in "*?["):
        return resolve_host(name, inventory)
    inv = scan_inventory(inventory)
    hosts, _ = inv.select(host_patterns(name))
    if len(hosts) != 1:
        raise InputError(f"{name!r} names {len(hosts)} hosts ({', '.join(h.name for h in hosts)}); this command "
                         "works on one", hint="name one host")
    return hosts[0]


def many_hosts(args: list[list[str]] | None, opts: list[list[str]] | None, limit: list[list[str]] | None,
               all_hosts: bool, inventory: Path | None, *, default_all: bool = False,
               ) -> tuple[list["Host"], dict[str, str]]:
    """The hosts of a several-host command: positional patterns and ``-H`` patterns together, ``--all``, or (with
    only ``--limit``, or ``default_all``) every host; narrowed by ``--limit``. Returns the hosts and the unusable
    ones a pattern took in (reported, not worked on). Bad files are warned about either way."""
    from ..errors import InputError
    from ..inventory import scan_inventory

    terms = _flat(args) + _flat(opts)
    limits = _flat(limit)
    if all_hosts and terms:
        raise InputError("--all goes alone (it is every host); to narrow it use --limit PATTERN")
    if all_hosts or (not terms and (limits or default_all)):
        terms = ["all"]
    if not terms:
        raise InputError("no hosts chosen: name them (HOST, -H a,b, -H 'gpu*', a group), or give --all",
                         hint="`ddtree-deploy hosts list` shows the hosts and their groups")
    inv = scan_inventory(inventory)
    inv.warn(skip=[t for t in terms if t in inv.broken])
    return inv.select(terms, limits)
