"""CLI: ``bench HOST`` (plain / chain / DDTree side by side on the host's server) and ``tune HOST`` (measure,
fit the batch-size budget schedule, write it into the host file)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from .. import hostbench
from .. import plot as plot_mod
from .. import tune as tune_mod
from ..console import emit_json, err, out, table
from ._options import HostArg, HostOpt, InventoryOpt, JsonOpt, one_host
from ._writes import interruptible as _interruptible
from ._writes import progress as _progress

PromptsOpt = typer.Option(None, "--prompts", metavar="FILE", help="workload prompts, one per line (a .jsonl file: one "
                          "JSON string or {\"text\": ...} per line); default: a built-in mix of six")
MaxNewOpt = typer.Option(64, "--max-new-tokens", min=1, max=4096, help="tokens each request decodes (EOS ignored, so "
                         "every config does the same work)")
RepsOpt = typer.Option(hostbench.DEFAULT_REPS, "--reps", min=1, max=100, help="times each cell (config x batch size) is "
                       "measured; tables show the median and the min–max")

PlotOpt = typer.Option(None, "--plot", metavar="FILE", help="also draw the result into FILE (.svg, .png or .pdf; needs "
                       f"matplotlib: {plot_mod.INSTALL}); checked before anything is measured")

RESTART_NOTE = ("The host's server is restarted once per config (it serves no traffic meanwhile) under the host lock, "
                "then restarted as the host file configures it and checked; if the tool is interrupted or cut off, "
                "the host's guardian puts it back by itself.")


def _spread(m: dict[str, Any]) -> str:
    """tok/s of one cell: the median and, over more than one rep, the min–max."""
    if m.get("reps", 1) < 2:
        return f"{m['tok_s']:g}"
    return f"{m['tok_s']:g} ({m['tok_s_min']:g}–{m['tok_s_max']:g})"


def _rows(ms: list[dict[str, Any]]) -> list[list[Any]]:
    chain = {m["batch"]: m["tok_s"] for m in ms if m["config"] == "chain"}
    return [[m["config"], m["budget"] or "-", m["batch"], _spread(m), m.get("reps", 1),
             f"{m['tok_s'] / chain[m['batch']]:.2f}x" if chain.get(m["batch"]) else "-",
             m["accept_length"] if m["accept_length"] is not None else "-", m["latency_ms"], m["latency_p90_ms"],
             m["ms_per_token"], m["round_ms"]] for m in ms]


def bench_cmd(
    host: Optional[str] = HostArg,
    host_opt: Optional[str] = HostOpt,
    prompts: Optional[Path] = PromptsOpt,
    batch_sizes: str = typer.Option("1", "--batch-sizes", metavar="N,N", help="requests in flight at once, each a "
                                    "measurement (e.g. 1,8)"),
    max_new_tokens: int = MaxNewOpt,
    reps: int = RepsOpt,
    dry_run: bool = typer.Option(False, "--dry-run", help="say which configs it would restart the server into; touch "
                                 "nothing"),
    plot: Optional[Path] = PlotOpt,
    inventory: Optional[Path] = InventoryOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Measure plain decoding, the DFlash chain and DDTree (the host file's budget) side by side on the host's running
    server: tok/s, accept length, latency per request (mean, p90), ms per token and per round, at each batch size.

    The server must be up, on an overlay release. It is measured first as it runs (DDTree), then restarted for the
    chain and for plain decoding (the speculative configs with --enable-metrics), then put back as configured.
    Where the server serves DDTree's /metrics families (read on the host), each DDTree cell also gets its
    acceptance by draft depth (--json: accept_by_depth)."""
    h = one_host(host, host_opt, inventory)
    sizes = hostbench.parse_sizes(batch_sizes)
    texts = hostbench.load_prompts(prompts)
    configs = [hostbench.ddtree(h, name="ddtree"), hostbench.chain(h), hostbench.plain()]
    if plot is not None:
        plot_mod.check_target(plot)
    if dry_run:
        steps = hostbench.plan(h, configs, sizes, reps=reps) + ([f"draw the result into {plot}"] if plot else [])
        _print_plan({"host": h.name, "dry_run": True, "prompts": len(texts), "reps": reps, "steps": steps,
                     "plot": str(plot) if plot else None}, as_json)
    with _interruptible():
        res = hostbench.bench(h, texts, sizes, max_new_tokens, reps=reps, progress=_progress)
    if plot is not None:
        res["plot"] = str(plot_mod.bench_figure(res, plot))
    if as_json:
        emit_json(res)
        return
    out.print(table(f"{h.name}: plain / chain / DDTree on release {res['release']} ({res['prompts']} prompts x "
                    f"{max_new_tokens} tokens; tok/s: median (min–max) of {reps} reps)",
                    ["config", "budget", "batch", "tok/s", "reps", "vs chain", "accept len", "latency ms", "p90 ms",
                     "ms/token", "round ms"], _rows(res["rows"])))
    out.print(f"server put back as configured ({res['restored'].get('restarts')} restarts)", highlight=False)
    if plot is not None:
        out.print(f"wrote {plot}", highlight=False)


def _print_plan(plan: dict[str, Any], as_json: bool) -> None:
    """A dry run of bench or tune: the steps, and that nothing was restarted or written; exits 0."""
    if as_json:
        emit_json(plan)
    else:
        for i, step in enumerate(plan["steps"], 1):
            out.print(f"  {i}. {step}", markup=False, highlight=False)
        out.print("dry run: nothing was touched (no restart, nothing written)")
    raise typer.Exit(0)


def tune_cmd(
    host: Optional[str] = HostArg,
    host_opt: Optional[str] = HostOpt,
    prompts: Optional[Path] = PromptsOpt,
    batch_sizes: Optional[str] = typer.Option(None, "--batch-sizes", metavar="N,N", help="batch sizes to fit "
                                              "(default: those in use on the server: its CUDA-graph sizes, else powers "
                                              "of two up to max_running_requests)"),
    budgets: Optional[str] = typer.Option(None, "--budgets", metavar="N,N", help="tree budgets to measure and choose "
                                          "among (default 16,32,64; the chain is always a choice)"),
    max_new_tokens: int = MaxNewOpt,
    margin: float = typer.Option(0.02, "--margin", min=0.0, max=1.0, help="a budget must beat the chain's tokens/ms "
                                 "by this fraction to be chosen"),
    reps: int = RepsOpt,
    dry_run: bool = typer.Option(False, "--dry-run", help="say what it would measure and write; restart and write "
                                 "nothing"),
    apply: bool = typer.Option(False, "--apply", help="after writing the host file, restart the server with the new "
                               "schedule (host lock; the old file is put back if it does not come up)"),
    plot: Optional[Path] = PlotOpt,
    inventory: Optional[Path] = InventoryOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Fit DDTree's batch-size budget schedule to the host: measure plain, the chain and each budget at the batch sizes
    in use (round cost per width, tokens per round, the drafter's per-depth acceptance), fit the schedule with the
    runtime's cost model, and write it into the host file's server.ddtree_flags
    (--speculative-ddtree-budget 1:64,8:32,...), keeping the file's other content and comments.

    The drafter's acceptance comes from DDTree's /metrics families (sglang:ddtree_draft_rank_*, read on the host;
    the configs tune starts carry --enable-metrics), else from the reference engine's spec_accept_stats.

    The host's server must be up on an overlay release whose runtime takes schedules. It is restarted once per
    config and put back as configured; without --apply the new schedule runs from the next restart."""
    h = one_host(host, host_opt, inventory)
    sizes = hostbench.parse_sizes(batch_sizes)
    wanted = tune_mod.parse_budgets(budgets)
    texts = hostbench.load_prompts(prompts)
    if plot is not None:
        plot_mod.check_target(plot)
    with _interruptible():
        res = tune_mod.tune(h, texts, batch_sizes=sizes, budgets=wanted, max_new_tokens=max_new_tokens, margin=margin,
                            dry_run=dry_run, apply=apply, reps=reps, progress=_progress)
    if res.get("dry_run"):
        if plot is not None:
            res["steps"].append(f"draw the measurements, the fitted schedule and the acceptance by depth into {plot}")
        res["plot"] = str(plot) if plot else None
        _print_plan(res, as_json)
    if plot is not None:
        res["plot"] = str(plot_mod.tune_figure(res, plot))
    if as_json:
        emit_json(res)
        return
    cell = {(m["config"], m["batch"]): _spread(m) for m in res["measurements"]}
    cols = ["batch", "plain", "chain"] + [f"b{b}" for b in res["budgets"]] + ["chosen", "vs chain"]
    rows = [[r["batch"], cell[("plain", r["batch"])], cell[("chain", r["batch"])],
             *[cell[(f"ddtree-{b}", r["batch"])] for b in res["budgets"]],
             r["chosen_budget"] or "chain", f"{r['schedule_tok_s'] / r['chain_tok_s']:.2f}x"]
            for r in res["table"]]
    out.print(table(f"{h.name}: tok/s by budget x batch, median (min–max) of {res['reps']} reps (release "
                    f"{res['release']})", cols, rows))
    out.print(f"tokens per round: chain {res['chain_tokens_per_round']} measured; DDTree model "
              + ", ".join(f"b{b} {v}" for b, v in res["model_tokens_per_round"].items()) + " (measured "
              + ", ".join(f"b{b} {v}" for b, v in res["measured_tokens_per_round"].items()) + ")", highlight=False)
    out.print(f"schedule: {res['schedule']}", highlight=False)
    if plot is not None:
        out.print(f"wrote {plot}", highlight=False)
    if res.get("within_noise"):
        cells = "; ".join(f"batch {c['batch']}: fitted {c['fitted'] or 'chain'} {c['fitted_tok_s']} vs current "
                          f"{c['current'] or 'chain'} {c['current_tok_s']} tok/s" for c in res["within_noise"])
        out.print(f"the fitted schedule {res['fitted_schedule']} differs from the current {res['schedule']} only within "
                  f"noise ({cells}): keeping the current one; nothing written", highlight=False)
        return
    if res["unchanged"]:
        out.print(f"{res['host_file']}: already runs this schedule; nothing written", highlight=False)
        return
    out.print(res["diff"], markup=False, highlight=False, end="")
    out.print(f"wrote {res['host_file']}" + ("; the server was restarted with it" if res.get("applied") else
                                             f"; it takes effect at the next restart (ddtree-deploy apply --host "
                                             f"{h.name}, or tune --apply)"), highlight=False)
    err.print(f"[dim]server put back as configured after the measurement ({res['restored'].get('restarts')} "
              "restarts)[/dim]")


bench_cmd.__doc__ = f"{bench_cmd.__doc__}\n\n    {RESTART_NOTE}"
tune_cmd.__doc__ = f"{tune_cmd.__doc__}\n\n    {RESTART_NOTE}"


def register(app: typer.Typer) -> None:
    app.command("bench")(bench_cmd)
    app.command("tune")(tune_cmd)
