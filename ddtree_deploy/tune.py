"""``tune``: measure a host's real server and fit the budget schedule DDTree runs there.

What is measured (``hostbench``: the host's own server, restarted per config under the host lock, put back after):
plain decoding, the DFlash chain and DDTree at each candidate budget, at each batch size in use. Each gives the
round cost (milliseconds per verify round, per decode step for plain) and tokens per round. The DDTree runs also
give the drafter's per-depth, per-rank acceptance (``spec_accept_stats`` in the server's ``internal_states``:
how often the target's token at draft position d was the drafter's rank-r candidate, given the path reached d).

What is fitted: the runtime's own cost model (``patches/ddtree/runtime/schedule.py``, the same file the overlay
vendors): ``fit_schedule(accept_profile, round_ms, chain_tokens_per_round, batch_sizes, budgets)`` picks per batch
size the budget with the most tokens per millisecond, the chain (0) where the chain is as good. The schedule goes
into the host file's ``server.ddtree_flags`` (``--speculative-ddtree-budget 1:64,8:32,...``) with the file's other
content and comments kept; ``--apply`` restarts the server with it under the host lock and puts the old flags back
if it does not come up; ``--dry-run`` says what it would measure and restarts and writes nothing.

Noise: every cell is measured ``reps`` times (median, min–max). A fitted schedule that differs from the current
one only where the new budget's best rep does not beat the current budget's worst is noise: the current schedule
is kept and the output says so, so two runs on an unchanged host do not flip the schedule.
"""
from __future__ import annotations

import posixpath
from types import ModuleType
from typing import Any

from .errors import InputError, OperationFailed
from .hostbench import DEFAULT_REPS, Measurement, chain, comma_ints, ddtree, measuring, plain
from .hostfile import plan_budget_edit, write_host_file
from .inventory import Host
from .ddtree_stats import ddtree_summary
from .probe import RUNTIME_SUBDIR, expected_sglang_dir
from .runtime_files import metrics_module, runtime_module
from .server import require_server
from .spec_flags import budget_of, with_budget
from .transaction import Progress, quiet
from .transport import HostConnection

DEFAULT_BUDGETS = (16, 32, 64)
MAX_DEFAULT_BATCH = 32


def schedule_module() -> ModuleType:
    """The runtime's ``schedule.py``: the schedule and the cost model."""
    return runtime_module("schedule", "cost model")


def parse_budgets(text: str | None) -> list[int]:
    """``--budgets 16,32,64``: the tree budgets to measure and choose among (the chain is always measured)."""
    if text is None:
        return list(DEFAULT_BUDGETS)
    sched = schedule_module()
    budgets = comma_ints(text, "--budgets", "16,32,64")
    bad = [b for b in budgets if not 1 <= b <= sched.MAX_BUDGET]
    if not budgets or bad:
        raise InputError(f"--budgets {text!r}: budgets must lie in [1, {sched.MAX_BUDGET}]")
    return budgets


def default_batch_sizes(info: dict[str, Any]) -> list[int]:
    """The batch sizes in use on the server: SGLang's captured CUDA-graph sizes when it reports them, else powers of
    two up to its ``max_running_requests``; at most MAX_DEFAULT_BATCH."""
    graphs = info.get("cuda_graph_bs")
    top = int(info.get("max_running_requests") or 8)
    if isinstance(graphs, list) and graphs:
        pool = sorted({int(b) for b in graphs if 1 <= int(b) <= min(top, MAX_DEFAULT_BATCH)})
        picks = [b for b in pool if b & (b - 1) == 0] or pool
        return picks[:6]
    sizes, b = [], 1
    while b <= min(top, MAX_DEFAULT_BATCH):
        sizes.append(b)
        b *= 2
    return sizes


def check_schedule_support(conn: HostConnection, host: Host, release: str | None) -> None:
    """The active release's DDTree runtime must take a schedule (it vendors ``schedule.py``); else the host's patch
    set cannot run what tune would write."""
    path = posixpath.join(expected_sglang_dir(host, release), RUNTIME_SUBDIR, "schedule.py")
    if not conn.run(f"test -f '{path}'", check=False).ok:
        raise InputError(f"host {host.name}: release {release} cannot take a budget schedule (its DDTree runtime has "
                         f"no schedule.py: {path}); tune writes one", hint="apply a patch set with batch-size schedules "
                         "first (ddtree-deploy apply)")


def accept_profile(stats: dict[str, Any] | None, depths: int) -> list[list[float]]:
    """Per-depth, per-rank acceptance from the server's counters: from DDTree's ``/metrics`` families (``source``
    "metrics": accepted / observed per (depth, rank), the runtime's ``metrics.accept_profile``), else the reference
    engine's ``spec_accept_stats``: hits[d][r] / reached[d] (0 where unreached)."""
    if stats and stats.get("rank_observed"):
        return metrics_module().accept_profile(stats, depths)
    if not stats or not stats.get("depth_reached"):
        raise OperationFailed("the server reports no per-depth acceptance: neither DDTree's counters on /metrics "
                              f"({metrics_module().PREFIX}draft_rank_*; SGLang serves /metrics with "
                              "--enable-metrics, which bench and tune add to the configs they start) nor "
                              "internal_states[0].spec_accept_stats; tune needs a patch set (or engine) that counts it")
    reached, hits = stats["depth_reached"], stats["rank_hits"]
    prof = []
    for d in range(min(depths, len(reached))):
        n = int(reached[d])
        prof.append([round(int(h) / n, 4) if n else 0.0 for h in hits[d]])
    return prof


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def fit(ms: list[Measurement], budgets: list[int], batch_sizes: list[int], stats: dict[str, Any] | None,
        depths: int, margin: float) -> dict[str, Any]:
    """The schedule from the measurements: per (budget, batch) round ms, the chain's tokens per round, the profile.

    A (budget, batch) cell without a measurement is one the host could not run (a hybrid GatedDeltaNet target:
    every tree node carries its own recurrent state, so large budgets do not fit at large batches): at that batch
    size the fit only considers the budgets below the smallest missing one (``max_budget`` of the cost model)."""
    sched = schedule_module()
    by = {(m.config, m.batch): m for m in ms}
    round_ms = {(0, bs): by[("chain", bs)].round_ms for bs in batch_sizes}
    round_ms.update({(b, bs): by[(f"ddtree-{b}", bs)].round_ms for b in budgets for bs in batch_sizes
                     if (f"ddtree-{b}", bs) in by})
    limits = {bs: max([0] + [b for b in sorted(budgets) if all((c, bs) in round_ms for c in budgets if c <= b)])
              for bs in batch_sizes}
    chain_tokens = _mean([by[("chain", bs)].accept_length or 1.0 for bs in batch_sizes])
    profile = accept_profile(stats, depths)
    schedule = sched.fit_schedule(profile, round_ms, chain_tokens, batch_sizes, budgets, margin=margin,
                                  max_budget=limits)
    predicted = {b: round(sched.expected_tokens_per_round(b, profile), 3) for b in budgets}
    table = []
    for bs in batch_sizes:
        chosen = schedule.budget_for(bs)
        row: dict[str, Any] = {"batch": bs, "plain_tok_s": by[("plain", bs)].tok_s, "chain_tok_s": by[("chain", bs)].tok_s}
        for b in budgets:
            cell = by.get((f"ddtree-{b}", bs))
            row[f"b{b}_tok_s"] = cell.tok_s if cell is not None else None  # None: did not fit at this batch
        row["chosen_budget"] = chosen
        row["schedule_tok_s"] = by[("chain" if chosen == 0 else f"ddtree-{chosen}", bs)].tok_s
        table.append(row)
    return {"schedule": str(schedule), "accept_profile": profile, "chain_tokens_per_round": round(chain_tokens, 3),
            "model_tokens_per_round": predicted,
            "measured_tokens_per_round": {b: round(_mean([by[(f"ddtree-{b}", bs)].accept_length or 1.0
                                                          for bs in batch_sizes if (f"ddtree-{b}", bs) in by]), 3)
                                          for b in budgets if any((f"ddtree-{b}", bs) in by for bs in batch_sizes)},
            "round_ms": [{"budget": b, "batch": bs, "ms": v} for (b, bs), v in sorted(round_ms.items())],
            "table": table}


def _order(budgets: list[int], running: str | None) -> list[int]:
    """The budgets in the order they are measured: the one the server runs first (no restart), then widest first."""
    return sorted(budgets, key=lambda b: (str(b) != running, -b))


def plan(host: Host, *, batch_sizes: list[int] | None, budgets: list[int], prompts: int, max_new_tokens: int,
         reps: int) -> dict[str, Any]:
    """``tune --dry-run``: what tune would measure, fit and write; it restarts and writes nothing (it reads the
    running server's budget and batch sizes, when it answers)."""
    from .hostbench import plan as bench_plan
    from .server import base_url

    require_server(host)
    with HostConnection(host) as conn:
        reply = conn.call("probe", "server_info", url=base_url(host), timeout=30)
    info = reply.get("info") or {} if reply.get("status") == 200 else {}
    running = str(ddtree_summary(info, None, None).get("budget")) if info else None
    sizes = batch_sizes or (default_batch_sizes(info) if info else None)
    configs = [ddtree(host, str(b)) for b in _order(budgets, running)] + [chain(host), plain()]
    steps = bench_plan(host, configs, sizes, reps=reps, running=running)
    steps.append(f"fit the schedule with the runtime's cost model ({prompts} prompts x {max_new_tokens} tokens a "
                 f"cell); keep the current one ({budget_of(str(host.server.get('ddtree_flags') or '')) or 'none'}) "
                 "where the fitted one wins only within the measured spread; else write it into "
                 f"{host.source} (server.ddtree_flags)")
    return {"host": host.name, "dry_run": True, "steps": steps, "batch_sizes": sizes, "budgets": budgets, "reps": reps,
            "running_budget": running, "written": False}


def within_noise(current: str | None, fitted: str, ms: list[Measurement], sizes: list[int]) -> list[dict[str, Any]] | None:
    """Where the fitted schedule differs from the ``current`` one, whether it only wins within noise: for each batch
    size where they differ, the fitted budget's best measured tok/s (its max over the reps) against the current
    budget's worst (its min). The list of those cells when every difference is within noise (keep the current
    schedule); None when one is a real gain, or the current schedule cannot be compared (not measured, unparsable)."""
    if not current:
        return None
    sched = schedule_module()
    try:
        cur, new = sched.parse_schedule(current), sched.parse_schedule(fitted)
    except ValueError:
        return None
    by = {(m.config, m.batch): m for m in ms}
    cells = []
    for bs in sizes:
        a, b = cur.budget_for(bs), new.budget_for(bs)
        if a == b:
            continue
        was, now = by.get(("chain" if a == 0 else f"ddtree-{a}", bs)), by.get(("chain" if b == 0 else f"ddtree-{b}", bs))
        if was is None or now is None or now.tok_s_min > was.tok_s_max:
            return None
        cells.append({"batch": bs, "current": a, "fitted": b, "current_tok_s": was.spread, "fitted_tok_s": now.spread})
    return cells


def tune(host: Host, prompts: list[str], *, batch_sizes: list[int] | None, budgets: list[int], max_new_tokens: int,
         margin: float = 0.02, dry_run: bool = False, apply: bool = False, reps: int = DEFAULT_REPS,
         progress: Progress = quiet) -> dict[str, Any]:
    """Measure (each cell ``reps`` times), fit, and write the schedule into the host file; ``apply`` restarts the
    server with it through the host lock; ``dry_run`` only says what it would measure (nothing restarted, nothing
    written). A fitted schedule that beats the current one only within the measured spread keeps the current one.
    Returns everything measured and decided."""
    if dry_run and apply:
        raise InputError("--dry-run and --apply contradict each other (a dry run writes nothing)")
    plan_budget_edit(host, "1:16,8:0")  # a host file tune cannot edit is refused before anything is measured
    if dry_run:
        return plan(host, batch_sizes=batch_sizes, budgets=budgets, prompts=len(prompts), max_new_tokens=max_new_tokens,
                    reps=reps)
    flags = str(host.server.get("ddtree_flags") or "")
    depths = int(host.server.get("draft_depths") or 15)
    ms: list[Measurement] = []
    stats = None
    with measuring(host, "ddtree-deploy tune", progress) as s:
        check_schedule_support(s.run.conn, host, s.active)
        sizes = batch_sizes or default_batch_sizes(s.before)
        block = s.before.get("speculative_num_draft_tokens") or s.before.get("speculative_block_size")
        depths = int(block) - 1 if block else depths
        if s.before.get("max_running_requests") and max(sizes) > int(s.before["max_running_requests"]):
            raise InputError(f"--batch-sizes {','.join(map(str, sizes))}: the server runs at most "
                             f"{s.before['max_running_requests']} requests at once (max_running_requests)")
        progress(f"{host.name}: measuring plain, chain and DDTree {', '.join(map(str, budgets))} at batch "
                 f"{', '.join(map(str, sizes))} ({len(prompts)} prompts, {max_new_tokens} tokens each, {reps} reps)")
        running = str(ddtree_summary(s.before, None, None).get("budget"))
        order = _order(budgets, running)  # the running budget first: no restart
        if str(order[0]) == running:
            s.serving = ddtree(host, running).name
        for b in order:
            for bs in sizes:
                ms.append(s.measure(ddtree(host, str(b)), bs, prompts, max_new_tokens, reps))
        # the widest budget's counters (every rank it could draft) where the server gave some; a budget measured as
        # the server ran it (no restart) may lack /metrics
        for b in sorted(budgets, reverse=True):
            stats = next((m.accept_stats for m in reversed(ms) if m.config == f"ddtree-{b}" and m.accept_stats), None)
            if stats:
                break
        for cfg in (chain(host), plain()):
            for bs in sizes:
                ms.append(s.measure(cfg, bs, prompts, max_new_tokens, reps))
    result = fit(ms, budgets, sizes, stats, depths, margin)
    result["accept_source"] = (stats or {}).get("source")  # "metrics" (DDTree's /metrics) or "server_info"
    if result["accept_source"] == "metrics":  # per depth, the share of the widest budget's drafts that reached it
        result["accept_by_depth"] = metrics_module().accept_by_depth(stats)
    result.update(host=host.name, release=s.active, batch_sizes=sizes, budgets=budgets, prompts=len(prompts),
                  max_new_tokens=max_new_tokens, margin=margin, reps=reps, restored=s.restored,
                  measurements=[m.to_dict() for m in ms], old_flags=flags, host_file=host.source, within_noise=None)
    old_budget = budget_of(flags)
    if old_budget is not None and str(schedule_module().parse_schedule(old_budget)) == result["schedule"]:
        result.update(new_flags=flags, diff="", written=False, unchanged=True)
        return result
    noise = within_noise(old_budget, result["schedule"], ms, sizes)
    if noise is not None:
        current = str(schedule_module().parse_schedule(old_budget))
        result.update(fitted_schedule=result["schedule"], schedule=current, within_noise=noise, new_flags=flags,
                      diff="", written=False, unchanged=True)
        return result
    old_text, new_text, diff = plan_budget_edit(host, result["schedule"])
    result.update(diff=diff, written=False, unchanged=False, new_flags=with_budget(flags, result["schedule"]))
    if dry_run:
        return result
    new_host = write_host_file(host, new_text)
    result["written"] = True
    if apply:
        result["applied"] = restart_with(new_host, host, old_text, progress)
    return result


def restart_with(new_host: Host, old_host: Host, old_text: str, progress: Progress) -> dict[str, Any]:
    """Restart the server with the new flags under the host lock (``server restart``); if it does not come up,
    write the old host file back, restart as before, and fail."""
    from .hostops import server_action

    res = server_action(new_host, "restart", progress=progress)
    if (res.get("startup") or {}).get("status") != "fail":
        return {"restarted": True, "startup": res.get("startup")}
    write_host_file(old_host, old_text)
    progress(f"{new_host.name}: the server did not start with the new schedule; put the old host file back")
    server_action(old_host, "restart", progress=progress)
    raise OperationFailed(f"host {new_host.name}: the server did not come up with the new schedule "
                          f"({res['startup'].get('detail')}); the host file and the server are back as they were")


__all__ = ["DEFAULT_BUDGETS", "accept_profile", "default_batch_sizes", "fit", "metrics_module", "parse_budgets", "plan",
           "schedule_module", "tune", "within_noise"]
