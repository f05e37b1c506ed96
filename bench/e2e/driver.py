"""End-to-end proof of the DDTree patch set on a real SGLang 0.5.11 (in-process `sglang.Engine`).

Run from the repository root as ``python -m bench.e2e.driver SUB-COMMAND ...`` (bench/e2e/gpu_run.sh does).

Sub-commands
  run NAME OUTDIR          one configuration: start an Engine, run its workloads, write OUTDIR/NAME.json, shut down
  orchestrate OUTDIR ...   run many configurations, several Engine processes at a time (the GPU is big and the
                           models tiny: start-up, not the GPU, is the cost), then `report`
  report OUTDIR RESULT     compare every configuration with its autoregressive baseline, write RESULT.json/.md

Configurations are named MODELSET-ALGO[-bBUDGET|-sched][-adapt][-graph][-prof][-launch]:
  MODELSET  rand  : models/mk_models.py (random target + random DFlash drafter, block size 4)
            agree : bench/e2e/models/mk_agree.py (target with a known greedy cycle, drafter that ranks the right token
                    in its top 4 at every depth; block size 8)
            big   : bench/e2e/models/mk_big.py (random target with hidden 1024 / 8 layers and LM-head rows of spread norms,
                    random DFlash drafter reading layers [1, 5], block size 4)
            hyb   : models/mk_hybrid.py (random Qwen3-Next hybrid: 3 GatedDeltaNet + 1 attention layer, MoE)
            hyblive: bench/e2e/models/mk_hybrid_live.py (the same architecture; the target only ever emits a few "live"
                    tokens, chosen by its context through the GatedDeltaNet layers, and the drafter's top-k covers
                    them, so DDTree accepts deep branches and the committed recurrent state decides later tokens)
            q8b   : bench/e2e/models/mk_shapes.py (Qwen3-8B shape, z-lab b16 drafter shape; --load-format dummy, speed only)
            q36   : bench/e2e/models/mk_shapes.py (Qwen3.6-27B shape: GatedDeltaNet + gated attention hybrid served as
                    Qwen3_5ForConditionalGeneration, text only; z-lab Qwen3.6-27B-DFlash drafter shape; dummy weights)
            prof / prof36: bench/e2e/models/mk_profile.py (the q8b / q36 shapes with a controlled acceptance profile:
                    tok/s, not only round cost, means something; sampled at T = 1)
  ALGO      ar (no speculative decoding), chain (DFLASH), ddtree (DFLASH + --speculative-ddtree-budget),
            arv (no speculative decoding; hybrid GDN decode with the verify kernel's math, see config_env)
            ard (0.5.17, no speculative decoding; hybrid GDN decode through DDTree's tree kernels, see config_env)
  -sched    (ddtree, 0.5.17) --speculative-ddtree-budget $E2E_DDTREE_SCHEDULE (default auto: the built-in
            cost model's batch-size schedule)
  -adapt    (ddtree, 0.5.17) --speculative-ddtree-adapt: the schedule adapted online
  -graph    CUDA graphs on (default: --disable-cuda-graph)
  -mrrN     --max-running-requests N (default 32; dummy models: timed batches above N are left out)
  -noradix  hybrid targets on 0.5.17 without the radix cache (default there: radix cache on with the base's
            extra_buffer mamba strategy, as for speculative decoding on hybrids)
  -prof     after the other workloads, SGLang's torch profiler (CPU + GPU, Python stacks) around a few greedy
            rounds at the batches of E2E_PROF_BATCHES (default 1,16); traces in OUTDIR/prof/NAME-bsN/, read by
            bench/e2e/round_share.py (python -m bench.e2e.round_share)
  -rec      (ddtree on hybrids) DDTREE_GDN_VERIFY=recurrent: the GatedDeltaNet verify with a state per node, the
            form plain decoding through DDTree's kernels (`ard`) is bit-identical to (default: the chunk form)
  -x3       (ddtree on hybrids) DDTREE_GDN_CHUNK=prec=tf32x3: the chunk-form verify's dots as three TF32 products
            on tensor cores (default: float32 FMA)
  -tattn    (ddtree, spec-v2, triton) DDTREE_VERIFY_ATTN=ddtree: the target's tree-verify attention through DDTree's
            kernel (runtime/tree_attn*.py) instead of SGLang's extend kernel with a custom mask
  -sync     DDTREE_SYNC_CHECK=1: every host-synchronising CUDA call of a DDTree round logged with its source line
  -metrics  --enable-metrics: DDTree's /metrics counters, round timing and per-(depth, rank) counts run every round
            (spec-v2/metrics.py; with -sync: the round's synchronising calls are those of the same config without it)
  -fi       (0.5.17+) --attention-backend flashinfer for the target and the DFlash drafter (what a server given only
            --attention-backend flashinfer runs); ddtree configurations add --speculative-ddtree-allow-unproven while
            the backends table (patches/ddtree/spec-v2/backends.py) has FlashInfer wired but unproven. Needs the real
            FlashInfer: the .e2e17fi bundle (E2E_BUNDLE=.e2e17fi, bench/e2e/mk_bundle_flashinfer.sh)
  -fiv      as -fi for the target only; the drafter stays on triton (FlashInfer in the verify alone)
  -psN      --page-size N for the target (and the drafter's KV pool): DDTree commits the accepted path by copying its
            KV rows into their pages; ddtree configurations add --speculative-ddtree-allow-unproven while the
            backends table has N among the backend's wired, not proven, page sizes. Baselines share the suffix
            (agree-ar-graph-ps16 for agree-ddtree-b15-graph-ps16, agree-ar-graph-fi-ps16 with -fi)
  -pN       pass N of a configuration measured more than once in a lease (interleaved with the others; the
            report merges the passes' speed runs and shows each pass's median)
  -stock    SGLang as installed: the DDTree overlay left off the path (with DDTree off, the patched engine must equal
            it: the patch set costs nothing unused)
  -launch   launches and host µs per decode round of the worker (bench/e2e/round_stats_hook/sitecustomize.py in the
            scheduler process; summarised by bench/e2e/round_stats.py into the JSON's round_stats and the report)

Workloads: greedy (temperature 0) generation of fixed random prompts as batches of 1, 4 and 16 concurrent
requests; `stop` (agree only): stop_token_ids inside the accepted path; `sample-T` (agree, eager): E2E_SAMPLE_REPS x 16
requests of E2E_SAMPLE_TOKENS tokens at T = E2E_SAMPLE_T (two sets of 16 per generate call when the engine admits 32);
`speed` (graph configs, or E2E_SPEED=1): timed batches of E2E_SPEED_BATCHES (default 1,16), 3 calls each.
"""
from __future__ import annotations

import functools
import json
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

from bench.e2e.workloads import CYCLE, prompts

#: the repository root: configurations run as ``python -m bench.e2e.driver`` from there
ROOT = Path(__file__).resolve().parents[2]
MODELS = Path(os.environ.get("E2E_MODELS", "/tmp/models"))
MODELSETS = {
    "rand": ("tiny-qwen3", "tiny-dflash"),
    "randf32": ("tiny-qwen3", "tiny-dflash"),  # same models served in float32 (bf16 near-ties excluded)
    "agree": ("agree-qwen3", "agree-dflash"),
    # the same two with attention heads of 64 (models/mk_models.py, mk_agree.py HEAD_DIM): FlashInfer's kernels have
    # no head dim 16, so its proofs (-fi) serve these
    "rand64": ("tiny-qwen3-hd64", "tiny-dflash-hd64"),
    "agree64": ("agree-qwen3-hd64", "agree-dflash-hd64"),
    "big": ("big-qwen3", "big-dflash"),
    "hyb": ("tiny-next", "tiny-next-dflash"),
    "hyblive": ("live-next", "live-next-dflash"),
    "q8b": ("q8b-target", "q8b-dflash"),  # Qwen3-8B shape + z-lab b16 drafter shape, --load-format dummy
    "prof": ("prof-target", "prof-dflash"),  # the same shapes with a controlled acceptance profile (models/mk_profile.py)
    "q36": ("q36-target", "q36-dflash"),  # Qwen3.6-27B shape + z-lab Qwen3.6-27B-DFlash shape, --load-format dummy
    "prof36": ("prof36-target", "prof36-dflash"),  # the 27B shapes with the controlled acceptance profile
}
DUMMY_MODELSETS = ("q8b", "prof", "q36", "prof36")
#: The Qwen3.6-27B-shape model sets (most of the GPU each: memory fraction, mamba pool, text only)
Q36_MODELSETS = ("q36", "prof36")
#: Model sets with a controlled acceptance profile (bench/e2e/profile_weights, models/mk_profile.py)
PROFILE_MODELSETS = ("prof", "prof36")
#: Model sets whose speed workloads sample (temperature 1): the `prof` profile is a law over tokens, not a function.
SAMPLED_SPEED_MODELSETS = {"prof": 1.0, "prof36": 1.0}
#: Which SGLang the run serves: 0.5.11 (spec-v1 DFlashWorker) or 0.5.17 (spec-v2 DFlashWorkerV2, overlap on).
BASE = os.environ.get("E2E_BASE", "0.5.11")
HYBRID_MODELSETS = ("hyb", "hyblive", "q36", "prof36")
BATCHES = (1, 4, 16)
MAX_NEW = int(os.environ.get("E2E_MAX_NEW", "48"))
SAMPLE_T = float(os.environ.get("E2E_SAMPLE_T", "2.5"))
SAMPLE_REPS = int(os.environ.get("E2E_SAMPLE_REPS", "4"))
SAMPLE_TOKENS = int(os.environ.get("E2E_SAMPLE_TOKENS", "128"))
SPEED_BATCHES = tuple(int(b) for b in os.environ.get("E2E_SPEED_BATCHES", "1,16").split(","))
PROF_BATCHES = tuple(int(b) for b in os.environ.get("E2E_PROF_BATCHES", "1,16").split(","))
PROF_TOKENS = int(os.environ.get("E2E_PROF_TOKENS", "32"))


#: Configuration suffix -> (target attention backend, DFlash drafter attention backend); without one both are triton.
ATTENTION_SUFFIXES = {"fi": ("flashinfer", "flashinfer"), "fiv": ("flashinfer", "triton")}
#: The backends table of the spec-v2 patch set (pure data, read by path like the tests do): which backends DDTree
#: runs only with --speculative-ddtree-allow-unproven.
BACKENDS_TABLE = ROOT / "patches" / "ddtree" / "spec-v2" / "backends.py"


def attention_suffix(cfg: dict) -> str:
    """The configuration's attention and page suffix ("-fi", "-fiv", "-ps16", "-fi-ps16"), "" for triton at page
    size 1: the name part its baselines share."""
    want = (cfg.get("attention", "triton"), cfg.get("draft_attention", "triton"))
    att = next((f"-{k}" for k, v in ATTENTION_SUFFIXES.items() if v == want), "")
    page = cfg.get("page_size", 1)
    return att + (f"-ps{page}" if page > 1 else "")


@functools.lru_cache(maxsize=1)
def backends_table():
    """The patch set's backends table (``backends.py``, pure data) loaded by path."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_ddtree_backends_table", BACKENDS_TABLE)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses resolves the module of its classes
    spec.loader.exec_module(mod)
    return mod


def needs_unproven(attention: str, page_size: int) -> bool:
    """Whether DDTree on this backend and page size runs only with --speculative-ddtree-allow-unproven (the flag
    is refused where it gates nothing, so it is passed exactly then)."""
    table = backends_table()
    row = table.BACKENDS.get(attention)
    if row is None:
        return False
    return row.status == table.WIRED_UNPROVEN or (page_size not in row.page_sizes and row.paged_wired)


def parse(name: str) -> dict:
    parts = name.split("-")
    cfg = {"name": name, "modelset": parts[0], "algo": parts[1], "budget": None, "graph": False, "profile": False,
           "overlap": True, "prefill_graph": False}
    for p in parts[2:]:
        if p.startswith("b") and p[1:].isdigit():
            cfg["budget"] = int(p[1:])
        elif p == "sched":  # a batch-size schedule (0.5.17): the flag's text, default the built-in cost model's
            cfg["budget"] = os.environ.get("E2E_DDTREE_SCHEDULE", "auto")
        elif p == "launch":
            cfg["round_stats"] = True
        elif p == "adapt":  # --speculative-ddtree-adapt (0.5.17)
            cfg["adapt"] = True
        elif p == "graph":
            cfg["graph"] = True
        elif p == "pgraph":  # decode graphs and the base's piecewise (breakable) prefill graphs (0.5.14+)
            cfg["graph"] = True
            cfg["prefill_graph"] = True
        elif p == "noov":  # the scheduler without overlap (spec-v2 bases drive the same worker synchronously)
            cfg["overlap"] = False
        elif p == "rec":  # DDTREE_GDN_VERIFY=recurrent: hybrid GDN verify with a state per node (the ard reference)
            cfg["gdn_verify"] = "recurrent"
        elif p == "x3":  # DDTREE_GDN_CHUNK=prec=tf32x3: the chunk-form GDN verify's dots on tensor cores (3 x TF32)
            cfg["gdn_chunk"] = "prec=tf32x3"
        elif p == "tattn":  # DDTREE_VERIFY_ATTN=ddtree: tree verifies through DDTree's attention kernel
            cfg["verify_attn"] = "ddtree"
        elif p in ATTENTION_SUFFIXES:  # the target's (and -fi: the drafter's) attention backend
            cfg["attention"], cfg["draft_attention"] = ATTENTION_SUFFIXES[p]
        elif p == "sync":  # DDTREE_SYNC_CHECK=1: log every host-synchronising CUDA call of a DDTree round
            cfg["sync_check"] = True
        elif p == "metrics":  # --enable-metrics: DDTree's /metrics counters and round timing run in every round
            cfg["metrics"] = True
        elif p == "prof":
            cfg["profile"] = True
        elif p.startswith("mrr"):
            cfg["max_running"] = int(p[3:])  # e.g. to provoke the hybrid budget-memory start-up error
        elif p == "noradix":
            cfg["noradix"] = True
        elif p == "stock":  # SGLang as installed: the overlay (E2E_OVERLAY_DIR) left off the path
            cfg["stock"] = True
        elif re.fullmatch(r"ps\d+", p):
            cfg["page_size"] = int(p[2:])  # --page-size N (the baselines carry the same suffix)
        elif re.fullmatch(r"p\d+", p):
            cfg["pass"] = int(p[1:])  # the same configuration measured again later in the lease (report merges)
    return cfg


#: GPU memory the 8B-shape engines are sized for (0.22 of an H200's 139 GiB: the 16 GB of weights, the drafter,
#: the KV cache and graphs), as a fraction of whatever card runs them
BIG_ENGINE_BYTES = 0.22 * 139.8 * 2**30


def big_mem_fraction(total_bytes: int | None = None) -> float:
    """``--mem-fraction-static`` for the dummy-weight 8B-shape engines: the same bytes on any card (0.22 on an H200,
    0.38 on an 80 GiB H100, where 0.22 leaves no room for the KV cache), 0.22 where no GPU is seen (dry runs)."""
    if total_bytes is None:
        try:
            import torch

            total_bytes = torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else 0
        except Exception:  # noqa: BLE001 - no torch or no driver: the dry run's default
            total_bytes = 0
    if not total_bytes:
        return 0.22
    return round(min(0.9, max(0.22, BIG_ENGINE_BYTES / total_bytes)), 3)


def engine_kwargs(cfg: dict) -> dict:
    tgt, drf = MODELSETS[cfg["modelset"]]
    kw = dict(
        model_path=str(MODELS / tgt),
        attention_backend=cfg.get("attention", "triton"),
        sampling_backend="pytorch",
        grammar_backend="none",
        mem_fraction_static=float(os.environ.get("E2E_MEM_FRACTION", "0.08" if BASE == "0.5.11" else "0.12")),
        page_size=cfg.get("page_size", 1),
        random_seed=0,
        log_level=os.environ.get("E2E_LOG_LEVEL", "info"),
        max_running_requests=cfg.get("max_running", 32),
    )
    if cfg["modelset"].endswith("f32"):
        kw["dtype"] = "float32"
    if cfg["modelset"] in HYBRID_MODELSETS:
        if BASE == "0.5.11" or cfg.get("noradix"):
            # Speculative decoding on SGLang 0.5.11 hybrid targets needs the radix cache off; the AR baseline runs
            # the same way so that both sides differ only in speculative decoding.
            kw["disable_radix_cache"] = True
        else:  # 0.5.14+: the radix cache with the mamba strategy the base uses for speculative decoding
            kw["mamba_radix_cache_strategy"] = "extra_buffer"
    if os.environ.get("E2E_KV_SPLITS"):
        # The triton decode kernel splits the KV sum into a batch-dependent number of pieces; one split makes the
        # AR baseline's summation order independent of the batch (bf16 near-ties then cannot flip with batch size).
        kw["triton_attention_num_kv_splits"] = int(os.environ["E2E_KV_SPLITS"])
    max_bs = int(os.environ.get("E2E_GRAPH_MAX_BS", "16"))
    if BASE == "0.5.11":
        if cfg["graph"]:
            kw["cuda_graph_max_bs"] = max_bs
        else:
            kw["disable_cuda_graph"] = True
    else:  # 0.5.17: decode and prefill graphs are separate switches; the overlap scheduler is on by default
        kw["mm_feature_transport"] = "cpu"
        kw["cuda_graph_backend_decode"] = "full" if cfg["graph"] else "disabled"
        if not cfg["prefill_graph"]:
            kw["cuda_graph_backend_prefill"] = "disabled"
        if cfg["graph"]:
            kw["cuda_graph_max_bs_decode"] = max_bs
        if not cfg["overlap"]:
            kw["disable_overlap_schedule"] = True
        kw["speculative_draft_attention_backend"] = cfg.get("draft_attention", "triton")
    if cfg["modelset"] in DUMMY_MODELSETS:
        kw["load_format"] = "dummy"
        kw["skip_tokenizer_init"] = True
        if "max_running" not in cfg:
            kw["max_running_requests"] = max(kw["max_running_requests"], max(SPEED_BATCHES))
        kw["mem_fraction_static"] = float(os.environ.get("E2E_MEM_FRACTION_BIG") or big_mem_fraction())
    if cfg["modelset"] in Q36_MODELSETS:
        # 27B of weights, then the recurrent states: most of the GPU, most of the rest to the mamba pool (its
        # per-step verify scratch grows with the verify width), text only (no image processor), graphs for the
        # timed batches only.
        kw["mem_fraction_static"] = float(os.environ.get("E2E_MEM_FRACTION_Q36", "0.88"))
        kw["mamba_full_memory_ratio"] = float(os.environ.get("E2E_MAMBA_RATIO_Q36", "8.0"))
        kw["enable_multimodal"] = False
        if cfg["graph"] and BASE != "0.5.11":
            kw["cuda_graph_bs_decode"] = list(speed_batches(cfg))
            kw.pop("cuda_graph_max_bs_decode", None)
    if cfg["algo"] in ("chain", "ddtree"):
        kw.update(speculative_algorithm="DFLASH", speculative_draft_model_path=str(MODELS / drf))
    if cfg.get("metrics"):
        kw["enable_metrics"] = True
    if cfg["algo"] == "ddtree":
        kw["speculative_ddtree_budget"] = cfg["budget"]
        if cfg.get("adapt"):
            kw["speculative_ddtree_adapt"] = True
        if needs_unproven(kw["attention_backend"], kw["page_size"]):  # refused where it gates nothing
            kw["speculative_ddtree_allow_unproven"] = True
    return kw


def speed_batches(cfg: dict) -> tuple[int, ...]:
    """The timed batches of a configuration: E2E_SPEED_BATCHES, without those above its -mrrN."""
    cap = cfg.get("max_running")
    return tuple(b for b in SPEED_BATCHES if cap is None or b <= cap) or (min(SPEED_BATCHES),)


def _meta(m: dict) -> dict:
    keep = ("completion_tokens", "prompt_tokens", "finish_reason", "spec_verify_ct", "spec_accept_length",
            "spec_accepted_drafts", "spec_proposed_drafts", "e2e_latency",
            # the patch set's per-request summary (spec-v2 0.5.15+; runtime metrics.META_KEYS)
            "ddtree_verify_ct", "ddtree_accept_length", "ddtree_accepted_tokens", "ddtree_draft_tokens",
            "ddtree_accepted_per_depth", "ddtree_budget", "ddtree_chain_rounds")
    out = {k: m.get(k) for k in keep if k in m}
    if "spec_num_correct_drafts" in m:  # 0.5.14+ names
        out["spec_accepted_drafts"] = m["spec_num_correct_drafts"]
        out["spec_proposed_drafts"] = m.get("spec_num_proposed_drafts")
    return out


def generate(engine, ps, sp) -> tuple[list, float]:
    t = time.perf_counter()
    outs = engine.generate(input_ids=ps, sampling_params=sp)
    dt = time.perf_counter() - t
    return outs, dt


def profile_rounds(engine, profdir: Path, name: str, cfg: dict | None = None) -> dict:
    """SGLang's own torch profiler (scheduler process) around PROF_TOKENS greedy tokens per batch size.

    Python stacks are on (SGLang's default) so that bench/e2e/round_share.py can attribute every GPU kernel to the
    DDTree step that launched it; the profiled wall time is inflated by the Python tracer, GPU durations are not.
    """
    out: dict = {}
    sp = {"temperature": 0.0, "max_new_tokens": PROF_TOKENS, "ignore_eos": True}
    cap = (cfg or {}).get("max_running")
    for bs in [b for b in PROF_BATCHES if cap is None or b <= cap] or [1]:
        d = profdir / f"{name}-bs{bs}"
        d.mkdir(parents=True, exist_ok=True)
        try:
            engine.start_profile(output_dir=str(d), activities=["CPU", "GPU"], with_stack=True, record_shapes=False)
            outs, dt = generate(engine, prompts(bs, seed=77), sp)
            engine.stop_profile()
            out[f"bs{bs}"] = {"seconds": round(dt, 4), "dir": str(d.relative_to(profdir.parent)),
                              "files": sorted(f.name for f in d.iterdir()),
                              "meta": [_meta(o["meta_info"]) for o in outs]}
        except BaseException as e:  # noqa: BLE001 - recorded; the timed workloads before it stay valid
            out[f"bs{bs}"] = {"error": f"{type(e).__name__}: {e}"}
    return out


#: A configuration's record while its engine starts, and while it runs its workloads: what stays if the process
#: dies there (finish_record).
START_CHECKPOINT = "engine start"
RUN_CHECKPOINT = "workloads"
#: The exception line of a Python traceback (the child's, printed into the configuration's log).
_EXC_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt)(?::.*)?$")


class EngineChildFailed(RuntimeError):
    """A child process of the engine failed during start-up (it sent the driver SIGQUIT)."""


def log_error(log: Path) -> str | None:
    """The last exception line of a traceback in ``log`` (a child process's cause of death), or None."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return None
    hits = [ln.strip() for ln in lines if _EXC_LINE.match(ln.strip())]
    return hits[-1][:1000] if hits else None


def _on_child_failure(signum, frame) -> None:  # noqa: ARG001 - a signal handler's signature
    """SGLang's children SIGQUIT their parent when they fail; its own handler kills the whole process tree, the
    driver with it, before the record is written. Ours ends the children only and raises in the main thread."""
    import psutil

    for child in psutil.Process().children(recursive=True):
        try:
            child.kill()
        except psutil.Error:
            pass
    raise EngineChildFailed("a child process of the engine failed during start-up (SIGQUIT)")


def start_engine(cfg: dict, kw: dict):
    """The configuration's engine: SGLang's, or the CPU stand-in (E2E_DRY_RUN=1). Either way a child failure
    at start-up raises :class:`EngineChildFailed` here instead of killing this process."""
    kw = {**kw, "custom_sigquit_handler": _on_child_failure}
    if os.environ.get("E2E_DRY_RUN") == "1":  # CPU stand-in: checks the flow, not SGLang (dry_engine.py)
        from bench.e2e.dry_engine import DryEngine

        return DryEngine(cfg, kw["model_path"], sigquit_handler=kw["custom_sigquit_handler"])
    import sglang as sgl

    return sgl.Engine(**kw)


def start_error(outdir: Path, name: str, exc: BaseException | None) -> str:
    """What a failed start is recorded with: the child's exception line from the log when there is one (the
    real cause, e.g. a ValueError of the model config), else the exception the start raised."""
    if isinstance(exc, EngineChildFailed):
        time.sleep(1.0)  # the child logs its traceback, then signals: let the log catch up
    cause = log_error(outdir / "logs" / f"{name}.log")
    own = f"{type(exc).__name__}: {exc}" if exc is not None else None
    if exc is not None and not isinstance(exc, EngineChildFailed) and own:
        return f"engine start: {own}"
    return f"engine start: {cause or own or 'the process died before the engine came up'}"


def finish_record(outdir: Path, name: str, rc: int | None, *, killed: bool = False) -> bool:
    """After a configuration's process ended: if it left no record, or only the start checkpoint (it died while
    the engine started, e.g. killed with its process tree), write the record with the error from its log; if it
    died during its workloads, say so in the record. True when a record was written here."""
    path = outdir / f"{name}.json"
    try:
        res = json.loads(path.read_text())
    except (OSError, ValueError):
        res = {"config": parse(name), "ok": False, "workloads": {}, "checkpoint": START_CHECKPOINT}
    why = "killed at the deadline" if killed else f"exit status {rc}"
    if res.get("checkpoint") == START_CHECKPOINT:
        res.update(ok=False, error=f"{start_error(outdir, name, None)} ({why})")
        res.pop("checkpoint")
    elif res.get("checkpoint") == RUN_CHECKPOINT and "error" not in res:
        cause = log_error(outdir / "logs" / f"{name}.log")
        res.update(ok=False, error=f"died during its workloads: {cause + ' ' if cause else ''}({why})")
    else:  # a final record, or a later checkpoint (before profiling) that keeps its measurements
        return False
    path.write_text(json.dumps(res, indent=1))
    return True


def run_one(name: str, outdir: Path) -> int:
    cfg = parse(name)
    res: dict = {"config": cfg, "ok": False, "workloads": {}}
    t0 = time.perf_counter()
    (outdir / f"{name}.json").write_text(json.dumps({**res, "checkpoint": START_CHECKPOINT}, indent=1))
    try:
        engine = start_engine(cfg, engine_kwargs(cfg))
    except BaseException as e:  # noqa: BLE001 - recorded, the orchestrator goes on
        res["error"] = start_error(outdir, name, e)
        res["startup_s"] = round(time.perf_counter() - t0, 2)
        (outdir / f"{name}.json").write_text(json.dumps(res, indent=1))
        return 1
    res["startup_s"] = round(time.perf_counter() - t0, 2)
    (outdir / f"{name}.json").write_text(json.dumps({**res, "checkpoint": RUN_CHECKPOINT}, indent=1))
    try:
        greedy = {"temperature": 0.0, "max_new_tokens": MAX_NEW}
        allp = prompts(16)
        speed_only = os.environ.get("E2E_SPEED_ONLY") == "1" or cfg["modelset"] in DUMMY_MODELSETS
        if not speed_only:
            for bs in BATCHES:
                outs, dt = generate(engine, allp[:bs], greedy)
                res["workloads"][f"greedy-bs{bs}"] = {
                    "seconds": round(dt, 4),
                    "output_ids": [o["output_ids"] for o in outs],
                    "meta": [_meta(o["meta_info"]) for o in outs],
                }
            if cfg["modelset"].startswith("agree"):
                # Stop token inside the accepted path: the cycle is 100,101,102,103; stop at 102.
                sp = {"temperature": 0.0, "max_new_tokens": MAX_NEW, "stop_token_ids": [CYCLE[2]]}
                outs, dt = generate(engine, allp[:4], sp)
                res["workloads"]["stop-bs4"] = {
                    "seconds": round(dt, 4),
                    "output_ids": [o["output_ids"] for o in outs],
                    "meta": [_meta(o["meta_info"]) for o in outs],
                }
            if cfg["modelset"].startswith("agree") and not cfg["graph"]:
                # Temperature > 0: one independent target sample per tree node must leave the output law unchanged.
                # At T=2.5 the agree target continues its cycle with p ~ 0.54 and spreads the rest over 511 tokens.
                sp = {"temperature": SAMPLE_T, "max_new_tokens": SAMPLE_TOKENS, "ignore_eos": True}
                outs_all, meta_all, secs = [], [], 0.0
                per_call = max(1, cfg.get("max_running", 32) // 16)  # sets of 16 prompts per call, kept in order
                for rep in range(0, SAMPLE_REPS, per_call):
                    seeds = range(500 + rep, 500 + min(rep + per_call, SAMPLE_REPS))
                    outs, dt = generate(engine, sum((prompts(16, seed=s) for s in seeds), []), sp)
                    outs_all += [o["output_ids"] for o in outs]
                    meta_all += [_meta(o["meta_info"]) for o in outs]
                    secs += dt
                res["workloads"]["sample-T"] = {"seconds": round(secs, 4), "temperature": SAMPLE_T,
                                                "prompts_seeds": [500 + r for r in range(SAMPLE_REPS)],
                                                "output_ids": outs_all, "meta": meta_all}
        if cfg["graph"] or speed_only or os.environ.get("E2E_SPEED") == "1":
            with speed_turn(outdir):
                res["workloads"].update(speed_workloads(engine, speed_batches(cfg)))
        if cfg["profile"]:
            # Checkpoint first: a profiler that hangs until the orchestrator's deadline must not cost the rest.
            (outdir / f"{name}.json").write_text(json.dumps({**res, "checkpoint": "before profiling"}, indent=1))
            res["workloads"]["profile"] = profile_rounds(engine, outdir / "prof", name, cfg)
        res["ok"] = True
    except BaseException as e:  # noqa: BLE001
        import traceback

        res["error"] = f"{type(e).__name__}: {e}"
        res["traceback"] = traceback.format_exc()[-4000:]
    finally:
        res["total_s"] = round(time.perf_counter() - t0, 2)
        if cfg.get("round_stats"):
            from bench.e2e.round_stats import summarize

            res["round_stats"] = summarize(round_stats_dir(outdir, name))
        (outdir / f"{name}.json").write_text(json.dumps(res, indent=1))
        try:
            engine.shutdown()
        except BaseException:  # noqa: BLE001
            pass
    return 0 if res["ok"] else 1


class speed_turn:  # noqa: N801 - a context manager used like a function
    """Timed work of one configuration at a time: configurations start (and load, capture graphs) side by side,
    but only the holder of OUTDIR/speed.lock measures, so no measurement shares the GPU with another."""

    def __init__(self, outdir: Path):
        gpu = os.environ.get("CUDA_VISIBLE_DEVICES")  # one lock per GPU when configurations are spread (E2E_GPUS)
        self.path = outdir / (f"speed-gpu{gpu}.lock" if os.environ.get("E2E_GPUS") and gpu else "speed.lock")

    def __enter__(self):
        import fcntl

        self.f = open(self.path, "a")
        fcntl.flock(self.f, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        import fcntl

        fcntl.flock(self.f, fcntl.LOCK_UN)
        self.f.close()
        return False


def speed_workloads(engine, batches: tuple[int, ...] = SPEED_BATCHES) -> dict:
    """Timed batches (ignore_eos; greedy, or temperature E2E_SPEED_T) at E2E_SPEED_BATCHES, E2E_SPEED_REPS reps each
    (default 3), prompts of E2E_SPEED_PROMPT_LEN tokens
    (default: the short fixed prompts). Each rep caches the prompts (a 1-token call), then generates
    E2E_SPEED_TOKENS / 4 and E2E_SPEED_TOKENS tokens after one new token each: both calls pay the same fixed cost
    (a 1-token prefill, scheduling), so round milliseconds = (T_long - T_short) / (rounds_long - rounds_short), with
    rounds = verify rounds (decode steps for AR). tok/s is the long call's output tokens over its wall time."""
    out: dict = {}
    n_new = int(os.environ.get("E2E_SPEED_TOKENS", "256"))
    plen = int(os.environ.get("E2E_SPEED_PROMPT_LEN", "0"))
    temperature = float(os.environ.get("E2E_SPEED_T", "0"))
    sp = {"temperature": temperature, "max_new_tokens": n_new, "ignore_eos": True}

    def batch(bs: int, seed: int) -> list[list[int]]:
        if not plen:
            return prompts(bs, seed=seed)
        rng = random.Random(seed)
        return [[rng.randrange(4, 400) for _ in range(plen)] for _ in range(bs)]

    def rounds_of(meta: list[dict]) -> int:
        return max((m.get("spec_verify_ct") or (m.get("completion_tokens", 1) - 1)) for m in meta)

    generate(engine, batch(min(16, max(batches)), 7), {**sp, "max_new_tokens": 16})  # warm-up
    for bs in batches:
        runs = []
        for rep in range(int(os.environ.get("E2E_SPEED_REPS", "3"))):
            ps = batch(bs, 99 + rep)
            _, pre = generate(engine, ps, {**sp, "max_new_tokens": 1})  # caches the prompts
            short, t_short = generate(engine, [p + [5] for p in ps], {**sp, "max_new_tokens": max(2, n_new // 4)})
            outs, dt = generate(engine, [p + [6] for p in ps], sp)
            toks = sum(len(o["output_ids"]) for o in outs)
            meta = [_meta(o["meta_info"]) for o in outs]
            r_long, r_short = rounds_of(meta), rounds_of([_meta(o["meta_info"]) for o in short])
            round_ms = 1000 * (dt - t_short) / (r_long - r_short) if r_long > r_short else None
            runs.append({"seconds": round(dt, 4), "short_seconds": round(t_short, 4), "prefill_seconds": round(pre, 4),
                         "tokens": toks, "tok_per_s": round(toks / dt, 1), "rounds": r_long, "rounds_short": r_short,
                         "round_ms": None if round_ms is None else round(round_ms, 3), "meta": meta})
        out[f"speed-bs{bs}"] = runs
    return out


def round_stats_dir(outdir: Path, name: str) -> Path:
    return outdir / "round-stats" / name


def config_env(cfg: dict, outdir: Path | None = None) -> dict:
    """Environment of one configuration's processes. `arv` (AR, verify math): SGLang's GDN decode uses the target
    verify kernel's math instead of its packed decode kernel; `ard` (AR, DDTree math): each GDN decode step is a
    1-node tree through DDTree's tree kernels (bench/e2e/gdn_unpacked_decode/sitecustomize.py says why); everything
    else is the `ar` configuration."""
    env = dict(os.environ)
    if cfg.get("stock"):
        overlay = env.get("E2E_OVERLAY_DIR")
        if not overlay:
            raise SystemExit(f"{cfg['name']}: -stock needs E2E_OVERLAY_DIR (gpu_run.sh sets it) to know what to leave out")
        env["PYTHONPATH"] = os.pathsep.join(e for e in env.get("PYTHONPATH", "").split(os.pathsep)
                                            if e and os.path.realpath(e) != os.path.realpath(overlay))
    if cfg["modelset"] in SAMPLED_SPEED_MODELSETS:
        env.setdefault("E2E_SPEED_T", str(SAMPLED_SPEED_MODELSETS[cfg["modelset"]]))
    if cfg.get("sync_check"):
        env["DDTREE_SYNC_CHECK"] = "1"
    if cfg.get("gdn_verify"):
        env["DDTREE_GDN_VERIFY"] = cfg["gdn_verify"]
    if cfg.get("gdn_chunk"):
        env["DDTREE_GDN_CHUNK"] = cfg["gdn_chunk"]
    if cfg.get("verify_attn"):
        env["DDTREE_VERIFY_ATTN"] = cfg["verify_attn"]
    hooks = []
    if cfg["algo"] in ("arv", "ard"):
        hooks.append(str(Path(__file__).resolve().parent / "gdn_unpacked_decode"))
        env["E2E_GDN_DECODE"] = "tree" if cfg["algo"] == "ard" else "verify"
    if cfg.get("round_stats") and outdir is not None:
        # first on the path: its sitecustomize runs the next one (gdn_unpacked_decode's, the bundle's) itself
        hooks.insert(0, str(Path(__file__).resolve().parent / "round_stats_hook"))
        env["DDTREE_ROUND_STATS"] = str(round_stats_dir(outdir, cfg["name"]))
    if cfg["modelset"] in PROFILE_MODELSETS:
        hooks.append(str(Path(__file__).resolve().parent / "profile_weights"))
        env["E2E_PROFILE_JSON"] = str(MODELS / MODELSETS[cfg["modelset"]][0] / "profile.json")
    if hooks:
        # the hooks import bench.e2e.import_hook: the repository root goes last, so it shadows nothing
        rest = [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []
        env["PYTHONPATH"] = os.pathsep.join(hooks + rest + [str(ROOT)])
    return env


def gpu_slot(name: str, running: dict, workers: int, gpus: list[str]) -> str | None:
    """Where configuration ``name`` may start now ("" = wherever CUDA_VISIBLE_DEVICES already points), or None.

    One GPU (E2E_GPUS unset or one entry): up to ``workers`` configurations share it. Several GPUs: configurations of
    the large dummy-weight model sets get a GPU of their own among all but the first (one at a time each); the
    others share the first GPU, up to ``workers`` at once."""
    if len(gpus) < 2:
        return (gpus[0] if gpus else "") if len(running) < workers else None
    big = parse(name)["modelset"] in DUMMY_MODELSETS
    if not big:
        small = sum(1 for _, _, g in running.values() if g == gpus[0])
        return gpus[0] if small < workers else None
    busy = {g for _, _, g in running.values()}
    return next((g for g in gpus[1:] if g not in busy), None)


def orchestrate(outdir: Path, names: list[str], workers: int, deadline_s: float, stagger_s: float) -> None:
    outdir.mkdir(parents=True, exist_ok=True)
    logs = outdir / "logs"
    logs.mkdir(exist_ok=True)
    t0 = time.time()
    queue = list(names)
    gpus = [g for g in os.environ.get("E2E_GPUS", "").split(",") if g]
    running: dict[str, tuple[subprocess.Popen, float, str]] = {}
    while queue or running:
        for n, (p, ts, _) in list(running.items()):
            if p.poll() is not None:
                print(f"[{time.time() - t0:6.1f}s] done {n} rc={p.returncode} ({time.time() - ts:.1f}s)", flush=True)
                if finish_record(outdir, n, p.returncode):
                    print(f"[{time.time() - t0:6.1f}s] {n}: died at engine start, recorded from its log", flush=True)
                del running[n]
            elif time.time() - t0 > deadline_s:
                p.kill()
                print(f"[{time.time() - t0:6.1f}s] killed {n} (deadline)", flush=True)
                p.wait()
                finish_record(outdir, n, p.returncode, killed=True)
                del running[n]
        started = True
        while queue and started and time.time() - t0 < deadline_s - 60:
            started = False
            for n in list(queue):
                gpu = gpu_slot(n, running, workers, gpus)
                if gpu is None:
                    continue
                queue.remove(n)
                env = config_env(parse(n), outdir)
                if gpu:
                    env["CUDA_VISIBLE_DEVICES"] = gpu
                f = open(logs / f"{n}.log", "w")
                p = subprocess.Popen([sys.executable, "-m", "bench.e2e.driver", "run", n, str(outdir.resolve())], stdout=f,
                                     stderr=subprocess.STDOUT, start_new_session=False, env=env, cwd=ROOT)
                running[n] = (p, time.time(), gpu)
                print(f"[{time.time() - t0:6.1f}s] start {n}" + (f" on GPU {gpu}" if gpu else ""), flush=True)
                started = True
                time.sleep(stagger_s)
                break
        if not queue and not running:
            break
        if queue and time.time() - t0 >= deadline_s - 60 and not running:
            print("deadline: not started:", queue, flush=True)
            break
        time.sleep(1)


def first_divergences(a: list[list[int]], b: list[list[int]]) -> list[int | None]:
    """Per request pair: the first position where the two output id lists differ (a shorter list differs where
    it ends), None when identical. Pairs beyond the shorter of `a` and `b` are not compared."""
    res = []
    for x, y in zip(a, b, strict=False):
        k = next((i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), None)
        if k is None and len(x) != len(y):
            k = min(len(x), len(y))
        res.append(k)
    return res


def acceptance(meta: list[dict]) -> dict:
    """Verify rounds, accepted drafts and their rates over the requests' meta of one workload."""
    verify = sum((m.get("spec_verify_ct") or 0) for m in meta)
    accepted = sum((m.get("spec_accepted_drafts") or 0) for m in meta)
    return {"verify_rounds": verify, "accepted_drafts": accepted,
            "accepted_per_round": round(accepted / verify, 4) if verify else None,
            "tokens_per_round": round((accepted + verify) / verify, 4) if verify else None}


def baseline(rs: dict, cfg: dict, algo: str) -> dict | None:
    """The result a configuration is compared with: MODELSET-ALGO with the same graph mode, else without graphs,
    on the same attention backend and page size (their suffix: AR has no drafter, so -fiv configurations take the
    -fi AR)."""
    att = attention_suffix(cfg)
    if algo == "ar" and att.startswith("-fiv"):
        att = "-fi" + att[len("-fiv"):]
    stem = f"{cfg['modelset']}-{algo}"
    return rs.get(stem + ("-graph" if cfg["graph"] else "") + att) or rs.get(stem + att)


def report(outdir: Path, result: Path, base: str = BASE) -> dict:
    """Every configuration against its baselines, as RESULT.json/.md; ``base`` picks the base's acceptance
    accounting (0.5.14+ count every draft the last round accepted)."""
    rs = {}
    for f in sorted(outdir.glob("*.json")):
        try:
            d = json.loads(f.read_text())
        except Exception:
            continue
        if "config" in d:
            rs[d["config"]["name"]] = d
    summary: dict = {"configs": {}, "lossless": {}, "vs_chain": {}, "acceptance": {}, "speed": {}, "round_stats": {}}
    for name, d in rs.items():
        summary["configs"][name] = {k: d.get(k) for k in ("ok", "error", "startup_s", "total_s")}
        if d.get("traceback"):
            summary["configs"][name]["traceback_tail"] = d["traceback"][-1500:]
    for name, d in rs.items():
        cfg = d["config"]
        if cfg["algo"] == "ar" or not d.get("ok"):
            continue
        base = baseline(rs, cfg, "ar")
        if not base or not base.get("ok"):
            continue
        for wl, w in d["workloads"].items():
            if wl.startswith("speed") or wl.startswith("sample") or wl not in base["workloads"]:
                continue
            a, b = w["output_ids"], base["workloads"][wl]["output_ids"]
            same = [x == y for x, y in zip(a, b, strict=False)]
            first_div = first_divergences(a, b)
            summary["lossless"].setdefault(name, {})[wl] = {
                "identical": all(same) and len(a) == len(b),
                "requests": len(a),
                "identical_requests": sum(same),
                "first_divergence": first_div,
                "tokens": sum(len(x) for x in a),
            }
            if wl.startswith("greedy") or wl.startswith("stop"):
                summary["acceptance"].setdefault(name, {})[wl] = acceptance(w["meta"])
    for name, d in rs.items():  # DDTree against the stock DFlash chain of the same models and graph mode
        cfg = d["config"]
        if cfg["algo"] != "ddtree" or not d.get("ok"):
            continue
        chain = baseline(rs, cfg, "chain")
        if not chain or not chain.get("ok"):
            continue
        for wl, w in d["workloads"].items():
            if not (wl.startswith("greedy") or wl.startswith("stop")) or wl not in chain["workloads"]:
                continue
            a, b = w["output_ids"], chain["workloads"][wl]["output_ids"]
            same = [x == y for x, y in zip(a, b, strict=False)]
            summary["vs_chain"].setdefault(name, {})[wl] = {
                "chain": chain["config"]["name"], "identical": all(same) and len(a) == len(b), "requests": len(a),
                "identical_requests": sum(same), "first_divergence": first_divergences(a, b)}
    for name, d in rs.items():
        w = d.get("workloads", {}).get("sample-T")
        if w:
            summary["acceptance"].setdefault(name, {})["sample-T"] = acceptance(w["meta"])
    for name, d in rs.items():
        for wl, runs in d.get("workloads", {}).items():
            if not wl.startswith("speed"):
                continue
            tps = sorted(r["tok_per_s"] for r in runs)
            verify = sum((m.get("spec_verify_ct") or 0) for r in runs for m in r["meta"])
            accepted = sum((m.get("spec_accepted_drafts") or 0) for r in runs for m in r["meta"])
            rms = sorted(r["round_ms"] for r in runs if r.get("round_ms") is not None)
            summary["speed"].setdefault(name, {})[wl] = {
                "tok_per_s_median": tps[len(tps) // 2],
                "tok_per_s_all": tps,
                "tokens_per_round": round((accepted + verify) / verify, 3) if verify else None,
                "round_ms_median": rms[len(rms) // 2] if rms else None,
                "round_ms_all": rms,
            }
    for name, d in rs.items():
        if d.get("round_stats", {}).get("batches"):
            summary["round_stats"][name] = d["round_stats"]
    expected_file = result.parent / "expected-acceptance.json"
    if expected_file.exists():  # measured acceptance on the agree models against the runtime-only replay
        expected = json.loads(expected_file.read_text())
        key = "accepted_per_round" if base == "0.5.11" else "accepted_all_per_round"
        summary["replay"] = {}
        for name, d in rs.items():
            cfg = d["config"]
            if cfg["modelset"] != "agree" or cfg["algo"] not in ("chain", "ddtree") or not d.get("ok"):
                continue
            want = expected.get("chain" if cfg["algo"] == "chain" else f"ddtree-b{cfg['budget']}", {}).get(key)
            w = d["workloads"].get("greedy-bs1")
            if want is None or not w:
                continue
            v = sum((m.get("spec_verify_ct") or 0) for m in w["meta"])
            a = sum((m.get("spec_accepted_drafts") or 0) for m in w["meta"])
            got = round(a / v, 4) if v else None
            summary["replay"][name] = {"measured": got, "replay": want, "equal": got == want}
    result.with_suffix(".json").write_text(json.dumps(summary, indent=1))
    lines = ["# DDTree e2e on the H200", "", "## Configurations", "", "| config | ok | start-up s | error |",
             "|---|---|---|---|"]
    for n, c in summary["configs"].items():
        lines.append(f"| {n} | {c['ok']} | {c.get('startup_s')} | {(c.get('error') or '')[:120]} |")
    lines += ["", "## Lossless (greedy output ids identical to the same model without speculative decoding)", "",
              "| config | workload | identical | requests identical | first divergence |", "|---|---|---|---|---|"]
    for n, wls in sorted(summary["lossless"].items()):
        for wl, v in wls.items():
            lines.append(f"| {n} | {wl} | {v['identical']} | {v['identical_requests']}/{v['requests']} | "
                         f"{[x for x in v['first_divergence'] if x is not None][:6]} |")
    lines += ["", "## DDTree against the stock DFlash chain (greedy output ids)", "",
              "| config | chain | workload | identical | requests identical |", "|---|---|---|---|---|"]
    for n, wls in sorted(summary["vs_chain"].items()):
        for wl, v in wls.items():
            lines.append(f"| {n} | {v['chain']} | {wl} | {v['identical']} | {v['identical_requests']}/{v['requests']} |")
    if summary.get("replay"):
        lines += ["", "## Acceptance against the runtime-only replay (agree models, greedy, batch 1)", "",
                  "| config | measured accepted/round | replay | equal |", "|---|---|---|---|"]
        for n, v in sorted(summary["replay"].items()):
            lines.append(f"| {n} | {v['measured']} | {v['replay']} | {v['equal']} |")
    lines += ["", "## Acceptance (accepted drafts per verify round; tokens per round = that + 1)", "",
              "| config | workload | rounds | accepted/round | tokens/round |", "|---|---|---|---|---|"]
    for n, wls in sorted(summary["acceptance"].items()):
        for wl, v in wls.items():
            lines.append(f"| {n} | {wl} | {v['verify_rounds']} | {v['accepted_per_round']} | {v['tokens_per_round']} |")
    if summary["speed"]:
        lines += ["", "## Speed (output tokens/s, median of 3; wall time of one generate call)", "",
                  "| config | batch | tok/s | all | tokens/round | round ms |", "|---|---|---|---|---|---|"]
        for n, wls in sorted(summary["speed"].items()):
            for wl, v in wls.items():
                lines.append(f"| {n} | {wl[len('speed-bs'):]} | {v['tok_per_s_median']} | {v['tok_per_s_all']} | "
                             f"{v['tokens_per_round']} | {v.get('round_ms_median')} |")
    if summary["round_stats"]:
        from bench.e2e.round_stats import table

        lines += ["", "## Launches and host µs per decode round (worker's forward_batch_generation; counts: median "
                  "of the profiled rounds)", ""] + table(summary["round_stats"])
    result.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return summary


def main() -> int:
    cmd = sys.argv[1]
    if cmd == "run":
        return run_one(sys.argv[2], Path(sys.argv[3]))
    if cmd == "orchestrate":
        outdir = Path(sys.argv[2])
        names = sys.argv[3].split(",")
        workers = int(os.environ.get("E2E_WORKERS", "5"))
        deadline = float(os.environ.get("E2E_DEADLINE", "420"))
        stagger = float(os.environ.get("E2E_STAGGER", "4"))
        orchestrate(outdir, names, workers, deadline, stagger)
        return 0
    if cmd == "report":
        s = report(Path(sys.argv[2]), Path(sys.argv[3]))
        print(json.dumps({k: s[k] for k in ("configs",)}, indent=1)[:6000])
        return 0
    raise SystemExit(f"unknown command {cmd}")


if __name__ == "__main__":
    sys.exit(main())
