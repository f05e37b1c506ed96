"""DDTree's server flags on the spec-v2 DFlash worker: validation, widths, and what is refused by default.

DDTree keeps DFLASH's whole code path (draft worker, draft CUDA graphs, aux hidden capture, KV sizing, request
checks) and changes only the verify step, so it is a flag under ``--speculative-algorithm DFLASH`` rather than a
new algorithm name that every ``is_dflash()`` site would have to learn.

Widths: ``speculative_num_draft_tokens`` is what the target side reads (attention-backend buffers, the target's
TARGET_VERIFY CUDA graphs, the logits buffer, the scheduler's KV reservation): it becomes the verify width
``budget + 1``. The drafter's block size moves to ``speculative_dflash_block_size``; the worker drafts that many.
The draft runner works at that width by one of two routes, per base: on 0.5.17 its graphs are captured through the
target-verify width hook (``spec_info.py``); on 0.5.14-0.5.16, whose draft runner and its attention backend read
the width from their own server-argument copy, that copy gets ``speculative_num_draft_tokens = block size``
(:func:`draft_server_args`).

Proven on a GPU here (the H200, real server): the attention backends the backends table (``backends.py``) marks
proven, with page size 1, dense targets and GatedDeltaNet hybrids (on by default: ``hybrid.py``), TP 1, greedy and
T > 0, overlap scheduling on and off, CUDA graphs on and off. Everything else that is wired but not proven is
refused at start-up with the reason unless ``--speculative-ddtree-allow-unproven`` is given; what is not wired at
all is refused always (for the attention backends, as their rows say).

Flags that would do nothing are refused at start-up too, with the reason (:func:`check_algorithm`,
:func:`post_resolve`): ``--speculative-ddtree-adapt``, ``--speculative-ddtree-allow-unproven``,
``--speculative-ddtree-schedule-hold`` or the internal ``--speculative-ddtree-schedule`` without
``--speculative-ddtree-budget``; the schedule flag beside a budget given
on the command line (the budget flag takes schedules; this one only records the resolved schedule, and resolution
would replace it); and ``--speculative-ddtree-allow-unproven`` when the resolved arguments name nothing unproven
(with the attention backend known at resolution, which it is on every spec-v2 base: an unset backend resolves to
triton or is chosen before DDTree's check). It stays the gate of what is wired but unproven: the wired-unproven
attention backends (``backends.py``), TP > 1, constrained decoding, a compact draft window. The hold
(``--speculative-ddtree-schedule-hold N``: decode rounds a schedule's new budget must be wanted in a row before a
round runs it; default 8, 0 or 1 = none) is accepted beside any budget, a single one included, where it holds
nothing: a budget ``tune`` fits may be single while the launch line keeps the flag, and such a server must start.
"""
from __future__ import annotations

import logging
from typing import Any, Optional

from .backends import BACKENDS, PROVEN, WIRED_UNPROVEN, with_status
from .bases import BASES, with_trait
from .compat import resolution_write

logger = logging.getLogger(__name__)

#: The verify width (budget + 1) bounds the tree mask and the CUDA-graph buffers.
MAX_VERIFY_WIDTH = 1024
#: The runtime builds trees up to this depth (draft block size - 1).
MAX_DEPTH = 31
UNPROVEN_FLAG = "--speculative-ddtree-allow-unproven"
#: What ``--speculative-ddtree-allow-unproven`` lets run (for the message that refuses it where it gates nothing).
UNPROVEN_GATES = (*(f"--attention-backend {b}" for b in with_status(WIRED_UNPROVEN)), "--page-size > 1",
                  "--tp-size > 1", "a --grammar-backend other than none", "--speculative-draft-window-size")
#: The internal flag that records the resolved schedule (0.5.17's series; absent on the other bases).
SCHEDULE_FLAG = "--speculative-ddtree-schedule"
#: Decode rounds a schedule's new budget must be wanted in a row before a round runs it (runtime
#: ``schedule.Hysteresis``; unset = ``schedule.DEFAULT_HOLD``, 0 or 1 = no hold). Declared on every spec-v2 base; a
#: single budget without adaptation has one width, so there it holds nothing.
HOLD_FLAG = "--speculative-ddtree-schedule-hold"


def _view(server_args: Any) -> Any:
    """The resolving configuration (overlaid declarations) where the base has one, else the args themselves (and
    for a config bag, which holds resolved values already). From 0.5.19 the record keeps the user's input and the
    resolved values live in the declarations: every read of a resolved field goes through this."""
    try:
        from sglang.srt.arg_groups.overrides import resolved_view
    except ImportError:  # bases without the declaration overlay
        return server_args
    try:
        return resolved_view(server_args)
    except Exception:  # not a ServerArgs record (a config bag, a test's namespace)
        return server_args


resolved = _view


#: The budget flag's name, which every message about it starts with.
BUDGET_FLAG = "--speculative-ddtree-budget"
#: The flag value that asks for the built-in schedule (the cost model over the built-in H200 round-cost table and
#: acceptance profile, runtime ``schedule.default_schedule``).
AUTO = "auto"
#: Bases whose series give each captured batch size its own verify width (target graphs and the draft graph's
#: tree build); the others take a single budget only (the ``schedule`` trait of each base, ``bases.py``).
SCHEDULE_BASES = with_trait("schedule")


def _schedule_mod() -> Any:
    """The runtime's schedule module (pure Python; vendored beside this package)."""
    from sglang.srt.speculative.ddtree import schedule

    return schedule


def base_version() -> str:
    try:
        from sglang.version import __version__ as version
    except ImportError:  # pragma: no cover - every spec-v2 base has sglang.version
        import sglang

        version = getattr(sglang, "__version__", "")
    return str(version)


def parse_budget(value: Any, *, version: Optional[str] = None) -> Any:
    """The flag's value as a runtime ``Schedule``, ``AUTO``, or None (DDTree off); a clear ValueError naming the
    flag for anything else, and naming the base where a schedule needs a newer series. An int (what a resolved
    argument holds) is a single budget."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"{BUDGET_FLAG} must be a positive integer, a schedule like 1:64,8:32,32:0, or {AUTO}; "
                         f"got {value!r}.")
    text = str(value).strip()

    def need_schedule_base() -> None:
        v = base_version() if version is None else version
        if v not in SCHEDULE_BASES:
            raise ValueError(f"{BUDGET_FLAG} {text}: batch-size schedules (and {AUTO}) need the SGLang "
                             f"{' / '.join(SCHEDULE_BASES)} patch set (a verify width per captured batch size); this "
                             f"is SGLang {v}: give one budget N.")
    if text.lower() == AUTO or ":" in text or "," in text:
        need_schedule_base()
    if text.lower() == AUTO:
        return AUTO
    sched = _schedule_mod()
    try:
        schedule = sched.parse_schedule(text, source=BUDGET_FLAG)
    except sched.ScheduleError as e:
        raise ValueError(f"{e}.") from None
    if not schedule.is_single:  # a JSON file may hold a schedule too
        need_schedule_base()
    return schedule


def verify_width(budget: int, block_size: int) -> int:
    """The target's per-request verify width at ``budget``: its tree's N1 = budget + 1, or the chain's block."""
    return int(budget) + 1 if int(budget) > 0 else int(block_size)


def max_verify_width(schedule: Any, block_size: int, *, with_chain: bool = False) -> int:
    """The widest verify of a schedule: what ``speculative_num_draft_tokens`` (the target's buffers, the KV
    reservation) is sized by. ``with_chain``: the chain's block counts too (adaptation may run it at any size)."""
    widths = [verify_width(b, block_size) for b in schedule.budgets]
    return max(widths + ([int(block_size)] if with_chain else []))


def adapt_on(args: Any) -> bool:
    return bool(getattr(_view(args), "speculative_ddtree_adapt", False))


def check_hold(value: Any) -> int:
    """The hold flag's value checked (an integer >= 0; None = the default); a ValueError naming the flag."""
    sched = _schedule_mod()
    if value is None:
        return int(sched.DEFAULT_HOLD)
    try:
        return sched.check_hold(value, source=HOLD_FLAG)
    except sched.ScheduleError as e:
        raise ValueError(f"{e}.") from None


def schedule_hold(args: Any) -> int:
    """The hold of server arguments (or a config bag): the flag's value, the runtime's default where unset."""
    return check_hold(getattr(_view(args), "speculative_ddtree_schedule_hold", None))


def hysteresis(args: Any) -> Any:
    """A fresh runtime ``schedule.Hysteresis`` at the hold of server arguments (one per DDTree worker)."""
    return _schedule_mod().Hysteresis(schedule_hold(args))


def schedule_of(args: Any) -> Any:
    """The resolved schedule of server arguments (or a config bag), None with DDTree off."""
    args = _view(args)
    budget = getattr(args, "speculative_ddtree_budget", None)
    if budget is None:
        return None
    text = getattr(args, "speculative_ddtree_schedule", None)
    sched = _schedule_mod()
    if text:
        return sched.parse_schedule(str(text), source="speculative_ddtree_schedule")
    return sched.Schedule.of(int(budget))


def check_algorithm(server_args: Any) -> None:
    """The budget only means something under DFLASH: DDTree builds its tree from the DFlash drafter. DDTree's other
    flags mean nothing without the budget: each is refused alone, with the reason."""
    if getattr(server_args, "speculative_ddtree_budget", None) is None:
        if adapt_on(server_args):
            raise ValueError("--speculative-ddtree-adapt needs --speculative-ddtree-budget (a budget or schedule to "
                             "adapt).")
        if getattr(server_args, "speculative_ddtree_allow_unproven", False):
            raise ValueError(f"{UNPROVEN_FLAG} does nothing without {BUDGET_FLAG}: it lets DDTree run configurations "
                             "that are wired but not proven on a GPU; drop it, or turn DDTree on with "
                             f"{BUDGET_FLAG}.")
        recorded = getattr(server_args, "speculative_ddtree_schedule", None)
        if recorded:
            raise ValueError(f"{SCHEDULE_FLAG} {recorded} does nothing without {BUDGET_FLAG}: a schedule is given "
                             f"as {BUDGET_FLAG} {recorded} ({SCHEDULE_FLAG} only records the resolved one).")
        hold = getattr(server_args, "speculative_ddtree_schedule_hold", None)
        if hold is not None:
            check_hold(hold)  # a bad value is named as such first
            raise ValueError(f"{HOLD_FLAG} {hold} does nothing without {BUDGET_FLAG}: it delays a budget "
                             "schedule's changes of width; drop it, or turn DDTree on with a schedule.")
        return
    if server_args.speculative_algorithm != "DFLASH":
        raise ValueError("--speculative-ddtree-budget requires --speculative-algorithm DFLASH (DDTree builds its "
                         "draft tree from the DFlash drafter), got speculative_algorithm="
                         f"{server_args.speculative_algorithm!r}.")


def pre_resolve(server_args: Any) -> Any:
    """Before DFLASH resolves its block size: validate the budget and get the derived width out of the way.

    Returns the parsed budget (a runtime ``Schedule`` or ``AUTO``), or None when DDTree is off (then nothing
    changes). On re-resolution of args that were already resolved (the budget an int = the schedule's largest, the
    schedule's text in ``speculative_ddtree_schedule``, the width set and the block size recorded), the block size
    is handed back to DFLASH.
    """
    value = getattr(server_args, "speculative_ddtree_budget", None)
    if value is None:
        return None
    check_hold(getattr(server_args, "speculative_ddtree_schedule_hold", None))
    recorded = getattr(server_args, "speculative_ddtree_schedule", None)
    resolved_before = isinstance(value, int) and not isinstance(value, bool) and recorded
    if recorded and not resolved_before:
        raise ValueError(f"{SCHEDULE_FLAG} {recorded} beside {BUDGET_FLAG} {value} does nothing: resolution "
                         f"replaces it with the budget's schedule; give the schedule as {BUDGET_FLAG} {recorded} "
                         f"({SCHEDULE_FLAG} only records the resolved one).")
    parsed = parse_budget(recorded if resolved_before else value)
    if resolved_before and parsed.max_budget != value:
        raise ValueError(f"{BUDGET_FLAG}={value} does not match the recorded schedule {recorded} (largest budget "
                         f"{parsed.max_budget}).")
    if parsed is not AUTO:
        resolution_write(server_args, "ddtree.pre_resolve", speculative_ddtree_budget=parsed.max_budget)
    if server_args.speculative_num_draft_tokens is not None:
        block = server_args.speculative_dflash_block_size
        already = (block is not None and parsed is not AUTO
                   and int(server_args.speculative_num_draft_tokens)
                   == max_verify_width(parsed, int(block), with_chain=adapt_on(server_args)))
        if not already:
            raise ValueError(
                "With --speculative-ddtree-budget the verify width is budget + 1 and is set automatically; do not "
                "pass --speculative-num-draft-tokens. Set the drafter's block size with "
                "--speculative-dflash-block-size (or let the draft config decide). Got "
                f"speculative_num_draft_tokens={server_args.speculative_num_draft_tokens}, "
                f"speculative_ddtree_budget={value}.")
        resolution_write(server_args, "ddtree.pre_resolve", speculative_num_draft_tokens=int(block))
    return parsed


def resolve_auto(block_size: int, *, hybrid: bool = False) -> Any:
    """What ``auto`` means: the runtime's ``default_schedule`` at every batch size 1..512 for a drafter of
    ``block_size`` (the built-in H200 round costs and acceptance profile; see its docstring); ``hybrid``: a
    GatedDeltaNet hybrid target, priced with the hybrid table (its GDN verify grows with every tree node)."""
    return _schedule_mod().default_schedule(range(1, 513), block_size=int(block_size), hybrid=hybrid)


def is_gdn_hybrid(server_args: Any) -> bool:
    """Whether the target is a GatedDeltaNet hybrid (Qwen3.5 / 3.6, Qwen3-Next, ...), from the model config the
    base caches on the arguments; False where the base cannot say (no such config helper)."""
    try:
        from sglang.srt.configs.hybrid_arch import hybrid_gdn_config
    except ImportError:
        return False
    get = getattr(server_args, "get_model_config", None)
    return get is not None and hybrid_gdn_config(get()) is not None


def refusals(server_args: Any, block_size: int, *, grammar_in_worker: bool = True) -> tuple[list[str], list[str]]:
    """(never supported, supported but not proven on a GPU here): reasons, each naming the flag.

    ``grammar_in_worker`` False: the base's DFLASH worker has no constrained decoding (0.5.14-0.5.16 abort such
    requests in the scheduler), so a grammar backend changes nothing for DDTree and is not refused."""
    view = _view(server_args)
    never: list[str] = []
    unproven: list[str] = []
    if block_size < 2:
        never.append(f"a draft block size of {block_size} (DDTree needs at least one draft depth: block size >= 2)")
    if block_size - 1 > MAX_DEPTH:
        never.append(f"a draft block size of {block_size} (the DDTree runtime builds trees up to depth {MAX_DEPTH}, "
                     f"i.e. block size <= {MAX_DEPTH + 1})")
    backends = {k: getattr(view, k, None) for k in ("attention_backend", "prefill_attention_backend",
                                                    "decode_attention_backend")}
    rows = [BACKENDS[v] for v in backends.values() if v in BACKENDS]  # the backends table, backends.py
    page_sizes = set.intersection(*(set(r.page_sizes) for r in rows)) if rows else {1}  # what they all run with
    for key, value in backends.items():
        if value is None:
            continue
        flag = "--" + key.replace("_", "-")
        row = BACKENDS.get(value)
        base = BASES.get(base_version()) if row is not None and row.base_trait else None
        if row is None:
            never.append(f"{flag} {value} (no tree-mask support for DDTree; use --attention-backend triton)")
        elif base is not None and not getattr(base, row.base_trait):
            never.append(f"{flag} {value} on SGLang {base_version()}: {row.base_reason}; use --attention-backend "
                         "triton")
        elif row.status == PROVEN:
            continue
        elif row.status == WIRED_UNPROVEN:
            unproven.append(f"{flag} {value}: {row.reason}")
        else:
            never.append(f"{flag} {value}: {row.reason}; use --attention-backend triton")
    page_size = int(getattr(view, "page_size", None) or 1)
    if page_size not in page_sizes:
        proven = " or ".join(map(str, sorted(page_sizes)))
        if page_size > 1 and rows and all(r.paged_wired for r in rows):
            unproven.append(f"--page-size {page_size} (the accepted path's KV is copied into its pages; not run on "
                            f"a GPU here, proven with --page-size {proven})")
        else:
            never.append(f"--page-size {page_size} (DDTree commits the accepted path by reordering the verify "
                         f"range's KV slots, which needs --page-size {proven})")
    if getattr(view, "enable_deterministic_inference", False):
        never.append("--enable-deterministic-inference (its triton kernel reads the context columns of the mask, "
                     "which DDTree does not write)")
    if getattr(view, "speculative_draft_window_size", None) is not None:
        unproven.append("--speculative-draft-window-size (the compact draft cache with a tree is not run on a GPU "
                        "here)")
    if getattr(view, "enable_two_batch_overlap", False):
        never.append("--enable-two-batch-overlap")
    if int(getattr(view, "tp_size", 1) or 1) > 1:
        unproven.append(f"--tp-size {view.tp_size} (the TP top-k gather is tested on CPU ranks only)")
    grammar = getattr(view, "grammar_backend", None)
    if grammar_in_worker and grammar not in (None, "none"):
        unproven.append(f"--grammar-backend {grammar} (constrained decoding over a tree is wired but not run on a "
                        "GPU here; pass --grammar-backend none)")
    if getattr(view, "speculative_adaptive", False):
        never.append("--speculative-adaptive")
    return never, unproven


def post_resolve(server_args: Any, parsed: Any, *, grammar_in_worker: bool = True) -> None:
    """After DFLASH resolved the block size: check what DDTree supports, then set the widths and the schedule.

    ``speculative_num_draft_tokens`` becomes the widest verify of the schedule (budget + 1 of its largest budget,
    or the block where that is wider and some batch sizes run the chain); ``speculative_ddtree_budget`` the largest
    budget (an int, what sizes the tree buffers), ``speculative_ddtree_schedule`` the schedule's canonical text."""
    block_size = int(_view(server_args).speculative_num_draft_tokens)
    never, unproven = refusals(server_args, block_size, grammar_in_worker=grammar_in_worker)
    allow = bool(getattr(server_args, "speculative_ddtree_allow_unproven", False))
    if never:
        raise ValueError("DDTree (--speculative-ddtree-budget) does not support: " + "; ".join(never) + ".")
    if unproven and not allow:
        raise ValueError("DDTree (--speculative-ddtree-budget) is not proven with: " + "; ".join(unproven)
                         + f". Pass {UNPROVEN_FLAG} to run it anyway.")
    if allow and not unproven and getattr(_view(server_args), "attention_backend", None) is not None:
        raise ValueError(f"{UNPROVEN_FLAG} does nothing here: every configuration this DDTree server uses is proven "
                         f"on a GPU (the flag gates only {', '.join(UNPROVEN_GATES)}); drop it.")
    if unproven:
        logger.warning("DDTree runs with configurations not proven on a GPU (%s): %s", UNPROVEN_FLAG,
                       "; ".join(unproven))
    schedule = resolve_auto(block_size, hybrid=is_gdn_hybrid(server_args)) if parsed is AUTO else parsed
    if isinstance(parsed, int):  # a caller with a plain budget (the pre-schedule interface)
        schedule = _schedule_mod().Schedule.of(parsed)
    width = max_verify_width(schedule, block_size, with_chain=adapt_on(server_args))
    if width > MAX_VERIFY_WIDTH:
        raise ValueError(f"{BUDGET_FLAG}={schedule}: the verify width (budget + 1) must be <= {MAX_VERIFY_WIDTH}.")
    fields = dict(speculative_dflash_block_size=block_size, speculative_num_draft_tokens=width,
                  speculative_ddtree_budget=schedule.max_budget)
    if hasattr(server_args, "speculative_ddtree_schedule") or not schedule.is_single:
        fields["speculative_ddtree_schedule"] = str(schedule)
    hold = schedule_hold(server_args)
    if hasattr(server_args, "speculative_ddtree_schedule_hold"):  # the effective hold, shown by /get_server_info
        fields["speculative_ddtree_schedule_hold"] = hold
    resolution_write(server_args, "ddtree.post_resolve", **fields)
    several = not schedule.is_single or adapt_on(server_args)
    logger.info("DDTree enabled: budget schedule %s%s%s, widest verify %d, draft block size %d%s.", schedule,
                " (auto)" if parsed is AUTO else "", ", adapted online" if adapt_on(server_args) else "", width,
                block_size, f", a change of width held {hold} decode rounds" if several and hold > 1 else "")


def enabled(server_args: Any) -> bool:
    return getattr(_view(server_args), "speculative_ddtree_budget", None) is not None


def draft_width(spec: Any) -> Optional[int]:
    """The draft runner's per-request width under DDTree (the block size), or None when DDTree is off."""
    spec = _view(spec)
    if getattr(spec, "speculative_ddtree_budget", None) is None:
        return None
    block = getattr(spec, "speculative_dflash_block_size", None)
    return int(block) if block is not None else None


def set_draft_width(draft_args: Any) -> None:
    """On the draft worker's own copy of the server arguments: the draft runner's width is the block size.

    Everything the draft runner sizes from its arguments (attention-backend query width, CUDA-graph capture width,
    eager buffers) then sees the drafter's block; the target keeps ``budget + 1``. No-op with DDTree off."""
    width = draft_width(draft_args)
    if width is None:
        return
    from .compat import write_resolved

    write_resolved(draft_args, "ddtree.draft_width", speculative_num_draft_tokens=width)


def draft_server_args(server_args: Any) -> Any:
    """The arguments to build the draft worker from: ``server_args`` itself with DDTree off or where the base's
    width hook gives the draft runner its block size (bases.py ``draft_width`` "hook"), else a copy with the draft
    width (:func:`set_draft_width`; 0.5.14-0.5.16); the target's arguments are never changed."""
    if draft_width(server_args) is None:
        return server_args
    row = BASES.get(base_version())
    if row is not None and row.draft_width == "hook":  # the width hook gives the draft runner its block: no copy
        return server_args
    from copy import deepcopy

    copy = deepcopy(server_args)
    set_draft_width(copy)
    return copy


def kv_reservation(committed_len: int, block_size: int, verify_width: int) -> int:
    """KV positions a request needs reserved for its next round: the draft writes ``block_size`` positions from
    the (up to one round stale) committed length, the verify ``verify_width``; a round commits at most a block."""
    return int(committed_len) + int(block_size) + max(int(block_size), int(verify_width))
