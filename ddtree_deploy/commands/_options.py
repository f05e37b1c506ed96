"""Options and arguments several commands share, so their names, defaults and help read the same everywhere."""

from __future__ import annotations

import typer


def complete_host(incomplete: str) -> list[str]:
    """Shell completion for host arguments: the names of the default inventory (bad files are skipped quietly)."""
    from ..inventory import scan_inventory

    try:
        names = sorted(scan_inventory(None).hosts)
    except Exception:  # completion must never print an error into the user's shell
        return []
    return [n for n in names if n.startswith(incomplete)]


INVENTORY_HELP = "inventory directory (default: $DDTREE_INVENTORY, the checkout's hosts/, else ~/.config/ddtree-deploy/hosts)"
STORE_HELP = ("snapshot store directory (default: $DDTREE_SNAPSHOTS, the checkout's snapshots/, else "
              "~/.local/share/ddtree-deploy/snapshots)")

InventoryOpt = typer.Option(None, "--inventory", "-i", help=INVENTORY_HELP)
StoreOpt = typer.Option(None, "--store", help=STORE_HELP)
JsonOpt = typer.Option(False, "--json", help="print JSON instead of tables (errors too)")
AllHostsOpt = typer.Option(False, "--all", help="every host of the inventory")
DryRunOpt = typer.Option(False, "--dry-run", help="say what would change (summary first); touch nothing")
BreakLockOpt = typer.Option(False, "--break-lock", help="take the host lock even if another run holds it")
PatchesOpt = typer.Option(None, "--patches", help="patch-set root (default: $DDTREE_PATCHES, the checkout's patches/, "
                       "else the patch sets installed with ddtree-deploy)")
HostArg = typer.Argument(..., metavar="HOST", help="host name (or the path of its YAML file)", autocompletion=complete_host)
