"""Benchmark-only hook (bench/e2e, never shipped): launches and host microseconds per decode round of the
speculative worker (``DFlashWorkerV2.forward_batch_generation``: chain and DDTree) or of the plain worker
(``TpModelWorker.forward_batch_generation`` when it is the outermost call: AR), in the scheduler process.

How: bench/e2e/driver.py puts this directory first on PYTHONPATH for a ``-launch`` configuration and sets
``DDTREE_ROUND_STATS=DIR``; every process of that Engine imports this file at start-up, and an import hook wraps the
two methods right after SGLang's modules execute (nothing else is touched; another sitecustomize further down the
path is still run). Per decode round (extend batches are skipped) at batch size B:

- **host µs**: wall time of the call on the host. With the overlap scheduler the call only enqueues work, so this is
  the host cost of a round (it includes any wait on the GPU a round makes: a host sync shows up here).
- **launches**: for ``DDTREE_ROUND_STATS_PROFILED`` rounds per batch size (default 8), after
  ``DDTREE_ROUND_STATS_WARMUP`` (default 20) unprofiled ones, the call runs under torch's profiler (CPU + CUDA
  activities) and the CUDA runtime/driver calls it made are counted: kernel launches, graph launches, memcpy /
  memset calls; plus the GPU kernels that ran (graph kernels included). Host µs of those rounds are kept apart
  (the profiler inflates them); the host-µs statistics come from the unprofiled rounds only.

Writes ``DIR/round-stats-PID.json`` at a batch size's first round, every 50 rounds and after each profiled round (the scheduler is killed at
shutdown, so there is no final write).
"""
import json
import os
import threading
import time

try:
    from bench.e2e.import_hook import after_import, chain_next_sitecustomize
except ImportError as e:  # a hook that silently did nothing would measure something else: stop the process
    raise SystemExit(f"bench/e2e/round_stats_hook: {e}: the repository root must be on PYTHONPATH") from e

_DIR = os.environ.get("DDTREE_ROUND_STATS")
_TARGETS = {"sglang.srt.speculative.dflash_worker_v2": "DFlashWorkerV2", "sglang.srt.managers.tp_worker": "TpModelWorker"}
KERNEL_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                "cudaLaunchCooperativeKernel")
GRAPH_CALLS = ("cudaGraphLaunch", "cuGraphLaunch")
COPY_CALLS = ("cudaMemcpyAsync", "cudaMemsetAsync", "cudaMemcpy", "cudaMemset", "cuMemcpyAsync", "cuMemsetD8Async",
              "cuMemsetD32Async")
WARMUP = int(os.environ.get("DDTREE_ROUND_STATS_WARMUP", "20"))
PROFILED = int(os.environ.get("DDTREE_ROUND_STATS_PROFILED", "8"))

_local = threading.local()
_state = {"rounds": {}, "profiled": {}, "worker": None, "n": 0}


def _bs_of(batch):
    """Batch size of a decode batch, None for anything else (prefill / extend, idle, empty)."""
    mode = getattr(batch, "forward_mode", None)
    if mode is None or not hasattr(mode, "is_decode") or not mode.is_decode():
        return None
    if getattr(batch, "is_extend_in_batch", False):
        return None
    seq = getattr(batch, "seq_lens", None)
    n = int(seq.shape[0]) if seq is not None and hasattr(seq, "shape") else len(getattr(batch, "reqs", []) or [])
    return n or None


def count_events(events):
    """Counts of one profiled round from torch profiler events (name + device type)."""
    out = {"kernel_launches": 0, "graph_launches": 0, "copies": 0, "gpu_kernels": 0}
    for ev in events:
        name = ev.name
        if name in KERNEL_CALLS:
            out["kernel_launches"] += 1
        elif name in GRAPH_CALLS:
            out["graph_launches"] += 1
        elif name in COPY_CALLS:
            out["copies"] += 1
        elif str(getattr(ev, "device_type", "")).endswith("CUDA") and not name.startswith(("Memcpy", "Memset")):
            out["gpu_kernels"] += 1
    return out


def _write():
    path = os.path.join(_DIR, f"round-stats-{os.getpid()}.json")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"pid": os.getpid(), "worker": _state["worker"], "warmup": WARMUP, "profiled_rounds": PROFILED,
                   "host_us": _state["rounds"], "profiled": _state["profiled"]}, f)
    os.replace(tmp, path)


def _profiled_call(fn, args, kwargs):
    import torch
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=acts) as prof:
        t = time.perf_counter()
        result = fn(*args, **kwargs)
        host = (time.perf_counter() - t) * 1e6
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # flush the round's GPU activity into the trace (after the host timing)
    return result, host, count_events(prof.events())


def _wrap(cls_name, fn):
    def forward_batch_generation(self, *args, **kwargs):
        depth = getattr(_local, "depth", 0)
        batch = args[0] if args else kwargs.get("batch")
        bs = _bs_of(batch) if depth == 0 else None
        if bs is None:
            _local.depth = depth + 1
            try:
                return fn(self, *args, **kwargs)
            finally:
                _local.depth = depth
        key = str(bs)
        new_size = key not in _state["rounds"] and key not in _state["profiled"]
        done = len(_state["rounds"].get(key, [])) + len(_state["profiled"].get(key, []))
        profiled = WARMUP <= done < WARMUP + PROFILED
        _local.depth = 1
        try:
            if profiled:
                result, host, counts = _profiled_call(fn, (self, *args), kwargs)
                _state["profiled"].setdefault(key, []).append({"host_us": round(host, 1), **counts})
            else:
                t = time.perf_counter()
                result = fn(self, *args, **kwargs)
                _state["rounds"].setdefault(key, []).append(round((time.perf_counter() - t) * 1e6, 1))
        finally:
            _local.depth = 0
        _state["worker"] = _state["worker"] or cls_name
        _state["n"] += 1
        if profiled or new_size or _state["n"] % 50 == 0:
            _write()
        return result

    forward_batch_generation.__wrapped__ = fn
    return forward_batch_generation


def _wrap_worker(module) -> None:
    cls = getattr(module, _TARGETS[module.__name__], None)
    if cls is not None and "forward_batch_generation" in cls.__dict__:
        cls.forward_batch_generation = _wrap(cls.__name__, cls.forward_batch_generation)


if _DIR:
    os.makedirs(_DIR, exist_ok=True)
    after_import(_TARGETS, _wrap_worker)
chain_next_sitecustomize(__file__)
