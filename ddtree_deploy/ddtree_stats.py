"""What DDTree does on a running server, as a probe reports it: algorithm, budget (or schedule), acceptance length
and tok/s, from SGLang's ``/get_server_info`` and the probe's own replies; and the one line people read."""

from __future__ import annotations

from typing import Any


def _first_state(info: dict[str, Any]) -> dict[str, Any]:
    states = info.get("internal_states")
    return states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else {}


def ddtree_summary(info: dict[str, Any] | None, after: dict[str, Any] | None, replies: list[dict[str, Any]] | None) -> dict[str, Any]:
    """What the user sees of DDTree on a running server: algorithm, budget (or schedule), acceptance length and
    tok/s, from SGLang's /get_server_info (server arguments at the top, counters in ``internal_states``) before and
    after the probe's prompts, and from the probe's own replies."""
    info = info or {}
    after = after or {}
    state = _first_state(after) or _first_state(info)

    def pick(*keys: str) -> Any:
        for src in (state, after, info):
            for k in keys:
                if src.get(k) is not None:
                    return src[k]
        return None

    out: dict[str, Any] = {
        "algorithm": pick("speculative_algorithm"),
        "budget": pick("speculative_ddtree_budget"),
        "schedule": pick("speculative_ddtree_budget_schedule", "speculative_ddtree_schedule"),
        "draft_tokens": pick("speculative_num_draft_tokens", "speculative_block_size"),
        "server_accept_length": pick("avg_spec_accept_length"),
        # SGLang's figure is its scheduler's last decode-log interval (idle time counted: 0.0, then 5-8 tok/s on the
        # H200 while the probe measured 415-512); kept in the JSON under its own name, never printed as the speed
        "server_last_gen_throughput": pick("last_gen_throughput"),
    }
    replies = replies or []
    accept = [r["spec_accept_length"] for r in replies if isinstance(r.get("spec_accept_length"), (int, float))]
    out["accept_length"] = round(sum(accept) / len(accept), 3) if accept else None
    tokens = sum(len(r.get("output_ids") or []) or int(r.get("completion_tokens") or 0) for r in replies)
    secs = sum(float(r.get("seconds") or 0.0) for r in replies)
    out["tok_s"] = round(tokens / secs, 1) if tokens and secs > 0 else None
    for key in ("server_accept_length", "server_last_gen_throughput"):
        if isinstance(out[key], float):
            out[key] = round(out[key], 3 if key == "server_accept_length" else 1)
    return {k: v for k, v in out.items() if v is not None}


def describe_ddtree(summary: dict[str, Any]) -> str:
    """One line for people: "DDTREE budget 16 · accept length 3.01 (server avg 3.02) · 412 tok/s (probe's requests)"."""
    if not summary:
        return ""
    algo = summary.get("algorithm")
    if not algo:
        return "speculative decoding off (no DDTree flags on this server)"
    parts = [f"{algo}" + (f" budget {summary['budget']}" if summary.get("budget") is not None else "")]
    if summary.get("schedule"):
        parts[0] += f" (schedule {summary['schedule']})"
    if summary.get("accept_length") is not None or summary.get("server_accept_length") is not None:
        a = summary.get("accept_length")
        server = summary.get("server_accept_length")
        parts.append(f"accept length {a if a is not None else '?'}" + (f" (server avg {server})" if server is not None else ""))
    if summary.get("tok_s") is not None:  # the probe's own measurement: output tokens over its requests' wall time
        parts.append(f"{summary['tok_s']} tok/s (probe's requests)")
    return " · ".join(parts)
