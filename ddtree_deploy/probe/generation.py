"""Stage 4, ``generation`` (the server as it runs): fixed prompts at temperature 0 must match the recorded baseline
token for token; the speculative acceptance length from ``meta_info.spec_accept_length`` is reported (and held to
``probe.min_accept_length``). Takes the generation the start-up stage ran on the host when there is one."""

from __future__ import annotations

import time
from typing import Any

from ..errors import ConnectionCut, DeployError
from ..hoststate import HostLayout
from ..inventory import probe_setting
from ..server import base_url
from .result import ProbeRun, Probing, Stage

NAME = "generation"
NEEDS_SERVER = True


def generate(p: Probing) -> list[dict[str, Any]]:
    """The probe's prompts sent to the running server, replies as they come (no baseline compared)."""
    prompts = list(probe_setting(p.host, "prompts") or [])
    budget = float(probe_setting(p.host, "generation_timeout"))
    return p.call("generate", budget, url=base_url(p.host), prompts=prompts,
                  max_new_tokens=int(probe_setting(p.host, "max_new_tokens")), budget=budget)


def run(p: Probing, release: str | None, ctx: ProbeRun) -> Stage:
    host = p.host
    t0 = time.monotonic()
    prompts = list(probe_setting(host, "prompts") or [])
    if not prompts:
        return Stage(NAME, "skip", 0.0, f"no probe.prompts in {host.source}")
    budget = float(probe_setting(host, "generation_timeout"))
    baseline_at = HostLayout.of(host).baseline
    prefetched, ctx.generation = ctx.generation, None
    if prefetched is not None:  # ran on the host right after start-up, in the start-up stage's round trip
        if not prefetched["ok"]:
            return Stage(NAME, "fail", prefetched["seconds"], prefetched["error"])
        got = prefetched["result"]
        t0 = time.monotonic() - prefetched["seconds"]
    else:
        try:
            got = p.call("generate", budget, url=base_url(host), prompts=prompts,
                         max_new_tokens=int(probe_setting(host, "max_new_tokens")), budget=budget,
                         baseline_path=baseline_at)
        except DeployError as exc:
            if isinstance(exc, ConnectionCut):
                raise
            return Stage(NAME, "fail", time.monotonic() - t0, str(exc))
    baseline, replies = got["baseline"], got["replies"]
    ctx.replies = replies
    if baseline is None:
        return Stage(NAME, "skip", time.monotonic() - t0,
                     f"no baseline recorded at {baseline_at} (run `ddtree-deploy probe {host.name} --record-baseline`)")
    if baseline.get("prompts") != prompts or baseline.get("max_new_tokens") != int(probe_setting(host, "max_new_tokens")):
        return Stage(NAME, "fail", time.monotonic() - t0,
                     "the recorded baseline was made with other prompts or max_new_tokens than the host file now has; "
                     f"re-record it (`ddtree-deploy probe {host.name} --record-baseline`)")
    accept = [r["spec_accept_length"] for r in replies if isinstance(r.get("spec_accept_length"), (int, float))]
    mean_accept = round(sum(accept) / len(accept), 3) if accept else None
    data: dict[str, Any] = {"spec_accept_length": mean_accept, "prompts": len(replies),
                            "per_prompt": [{"prompt": r["prompt"], "tokens": len(r.get("output_ids") or []),
                                            "spec_accept_length": r.get("spec_accept_length"), "seconds": r.get("seconds")}
                                           for r in replies]}
    for got, want in zip(replies, baseline["outputs"], strict=False):
        key = "output_ids" if got.get("output_ids") is not None and want.get("output_ids") is not None else "text"
        a, b = got.get(key), want.get(key)
        if a != b:
            idx = next((i for i, (x, y) in enumerate(zip(a or [], b or [], strict=False)) if x != y), min(len(a or []), len(b or [])))
            return Stage(NAME, "fail", time.monotonic() - t0,
                         f"prompt {got['prompt']!r}: output differs from the baseline at {('token' if key == 'output_ids' else 'character')} "
                         f"{idx} (got {_snip(a, idx)}, baseline {_snip(b, idx)})", data)
    min_accept = float(probe_setting(host, "min_accept_length"))
    if min_accept and (mean_accept is None or mean_accept < min_accept):
        return Stage(NAME, "fail", time.monotonic() - t0,
                     f"speculative acceptance length {mean_accept} below probe.min_accept_length {min_accept}", data)
    acc = f"; spec_accept_length {mean_accept}" if mean_accept is not None else ""
    return Stage(NAME, "pass", time.monotonic() - t0, f"{len(replies)} prompts match the baseline token for token{acc}", data)


def _snip(seq: Any, idx: int, width: int = 4) -> str:
    if seq is None:
        return "nothing"
    part = seq[max(0, idx - 1): idx + width]
    return repr(part)
