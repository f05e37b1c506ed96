"""A CPU stand-in for `sglang.Engine`, so that gpu_run.sh and the e2e driver's whole flow run without a GPU.

E2E_DRY_RUN=1 makes `python -m bench.e2e.driver run` use it. It checks the plumbing (orchestration, deadlines, report,
tarballs, round_share, chisq, report), not SGLang: its outputs are what a lossless engine would give.
- greedy: agree models follow the target's cycle (any token -> C0 -> C1 -> ...), other models a fixed function of
  the prompt; the same for AR, chain and DDTree, so the report sees them identical.
- T > 0 on agree models: tokens drawn from the target's exact law (workloads.target_law), so the goodness-of-fit
  p-values of a dry run are uniform.
- meta: spec_verify_ct / spec_accepted_drafts from a nominal tokens-per-round (1 for AR).
- start_profile / stop_profile: a small chrome trace with the frames, launches and kernels of a DDTree round.
- `-launch` configurations: each decode round calls a stand-in worker's forward_batch_generation, wrapped by
  bench/e2e/round_stats_hook/sitecustomize.py as SGLang's worker is, so its files and summary are exercised.
- E2E_DRY_FAIL_START=NAME[,NAME...]: those configurations fail at start-up as SGLang's engines do: a child process
  prints a traceback ending in E2E_DRY_FAIL_ERROR (default: the 27B drafter's old sliding-window error) and sends
  the parent SIGQUIT while the parent waits for it; the parent then runs the engine's SIGQUIT handler (the driver's,
  or SGLang's default: kill the whole process tree, this process included; E2E_DRY_DEFAULT_SIGQUIT=1 forces it).
"""
from __future__ import annotations

import gzip
import json
import math
import os
import signal
import sys
import time
from pathlib import Path

import torch

from bench.e2e.workloads import CYCLE, NEXT, target_law


class _DecodeMode:
    def is_decode(self) -> bool:
        return True


class DryBatch:
    """What the round-stats hook reads of a decode batch."""

    def __init__(self, bs: int) -> None:
        self.forward_mode = _DecodeMode()
        self.seq_lens = torch.zeros(bs, dtype=torch.int64)
        self.is_extend_in_batch = False


class DryWorker:
    def forward_batch_generation(self, batch: DryBatch) -> torch.Tensor:
        return (batch.seq_lens + 1).sum()  # a little host work standing in for a round's launches


def largest_budget(budget: object) -> int:
    """A budget N, or a schedule's largest budget (auto: the built-in table's 64)."""
    if budget is None:
        return 1
    text = str(budget)
    if text == "auto":
        return 64
    return max(int(e.split(":")[-1]) for e in text.split(",")) or 1


FAIL_ERROR = "ValueError: DFLASH sliding_attention layers require config.sliding_window."
_CHILD = """import os, signal, sys, time
sys.stderr.write("Traceback (most recent call last):\\n  File \\"scheduler.py\\", line 1, in run_scheduler_process\\n")
sys.stderr.write(sys.argv[1] + "\\n"); sys.stderr.flush()
os.kill(int(sys.argv[2]), signal.SIGQUIT)
time.sleep(60)  # a child that lingers, as SGLang's detokenizer would: the handler must end it
"""


def _kill_tree(signum, frame) -> None:  # noqa: ARG001 - SGLang's launch-phase handler: the whole tree, parent too
    import psutil

    for child in psutil.Process().children(recursive=True):
        child.kill()
    os.kill(os.getpid(), signal.SIGKILL)


class DryEngine:
    def __init__(self, cfg: dict, model_dir: str, sigquit_handler=None) -> None:
        self.cfg = cfg
        if cfg["name"] in os.environ.get("E2E_DRY_FAIL_START", "").split(","):
            import subprocess

            default = os.environ.get("E2E_DRY_DEFAULT_SIGQUIT") == "1"  # as if the engine had no custom handler
            signal.signal(signal.SIGQUIT, _kill_tree if default or sigquit_handler is None else sigquit_handler)
            child = subprocess.Popen([sys.executable, "-c", _CHILD, os.environ.get("E2E_DRY_FAIL_ERROR", FAIL_ERROR),
                                      str(os.getpid())])
            child.wait()  # the engine waits for its scheduler's ready message; the signal ends the wait
            raise RuntimeError("dry engine: the failing child exited without signalling")
        self.model_dir = Path(model_dir)
        self.tpr = 1.0 if cfg["algo"] == "ar" else 1.34 if cfg["algo"] == "chain" else 1.0 + math.log2(
            1 + largest_budget(cfg["budget"])) / 2
        hook = sys.modules.get("sitecustomize")
        self.worker = DryWorker()
        if os.environ.get("DDTREE_ROUND_STATS") and hasattr(hook, "_wrap"):
            DryWorker.forward_batch_generation = hook._wrap("DryWorker", DryWorker.forward_batch_generation)
        self.gen = torch.Generator().manual_seed(0)
        self._law: dict[float, torch.Tensor] = {}
        self._prof_dir: Path | None = None
        self._last_rounds = 1

    def _greedy(self, p: list[int], n: int, stop: set[int]) -> list[int]:
        out: list[int] = []
        prev = p[-1]
        for i in range(n):
            if self.cfg["modelset"].startswith("agree"):
                tok = NEXT.get(prev, CYCLE[0])
            else:
                tok = 4 + (sum(p) * 31 + i * 17) % 396
            out.append(tok)
            prev = tok
            if tok in stop:
                break
        return out

    def _sample(self, ps: list[list[int]], n: int, temperature: float) -> list[list[int]]:
        if temperature not in self._law:
            self._law[temperature] = target_law(self.model_dir, temperature)
        law = self._law[temperature]
        prev = torch.tensor([p[-1] for p in ps])
        out = torch.empty(len(ps), n, dtype=torch.long)
        for i in range(n):
            prev = torch.multinomial(law[prev], 1, generator=self.gen).squeeze(1)
            out[:, i] = prev
        return out.tolist()

    def generate(self, input_ids: list[list[int]], sampling_params: dict) -> list[dict]:
        t0 = time.perf_counter()
        n = int(sampling_params.get("max_new_tokens", 16))
        temperature = float(sampling_params.get("temperature", 1.0))
        if temperature > 0 and self.cfg["modelset"].startswith("agree"):
            outs = self._sample(input_ids, n, temperature)
        else:
            stop = set(sampling_params.get("stop_token_ids") or [])
            outs = [self._greedy(p, n, stop) for p in input_ids]
        res = []
        for p, o in zip(input_ids, outs, strict=True):
            meta = {"completion_tokens": len(o), "prompt_tokens": len(p), "finish_reason": {"type": "length"},
                    "e2e_latency": time.perf_counter() - t0}
            if self.cfg["algo"] != "ar":
                rounds = max(1, math.ceil(len(o) / self.tpr))
                meta.update(spec_verify_ct=rounds, spec_accepted_drafts=len(o) - rounds,
                            spec_accept_length=len(o) / rounds)
            res.append({"output_ids": o, "meta_info": meta})
        self._last_rounds = max((m["meta_info"].get("spec_verify_ct") or 1) for m in res)
        for _ in range(self._last_rounds if self.cfg["algo"] != "ar" else max(len(o) for o in outs)):
            self.worker.forward_batch_generation(DryBatch(len(input_ids)))
        return res

    def start_profile(self, output_dir: str, **_: object) -> None:
        self._prof_dir = Path(output_dir)

    def stop_profile(self) -> None:
        assert self._prof_dir is not None, "stop_profile without start_profile"
        path = self._prof_dir / f"{time.time()}-TP-0.trace.json.gz"
        with gzip.open(path, "wt") as fh:
            json.dump({"traceEvents": synthetic_round_trace(self._last_rounds, gdn_kernels(self.cfg))}, fh)
        self._prof_dir = None

    def shutdown(self) -> None:
        pass


# (frame, children, own launches as (kernel name, us)); file paths as the profiler prints them for the overlay.
ROUND = ("sglang/srt/speculative/dflash_worker.py(1234): forward_batch_generation", [
    ("sglang/srt/speculative/dflash_worker.py(565): _prepare_for_speculative_decoding", [
        ("sglang/srt/model_executor/model_runner.py(2400): forward", [], [("draft_graph_kernel", 40.0)]),
        ("sglang/srt/speculative/ddtree_info.py(223): prepare_ddtree_verify", [
            ("sglang/srt/speculative/ddtree_verify.py(69): ddtree_draft_topk", [], [("_chunk_topk_kernel", 6.0)]),
            ("sglang/srt/speculative/ddtree/tree.py(30): build_tree", [], [("_build_tree_kernel", 9.0)]),
            ("sglang/srt/speculative/ddtree/verify.py(20): build_verify_inputs", [], [("_verify_kernel", 4.0)]),
            ("sglang/srt/speculative/ddtree_info.py(69): prepare_for_verify", [
                ("sglang/srt/speculative/ddtree_verify.py(249): build_ddtree_verify_mask", [],
                 [("_ddtree_expand_mask_kernel", 3.0)])], [("index_kernel", 2.0)])], [])], []),
    ("sglang/srt/managers/tp_worker.py(300): forward_batch_generation", [
        ("sglang/srt/model_executor/model_runner.py(2400): forward", [], [("target_graph_kernel", 120.0)])], []),
    ("sglang/srt/speculative/ddtree_info.py(95): verify", [
        ("sglang/srt/speculative/ddtree_verify.py(264): sample_target_tokens_per_node", [], [("argmax_kernel", 5.0)]),
        ("sglang/srt/speculative/ddtree/walk.py(12): accept_walk", [], [("_walk_kernel", 4.0)]),
        ("sglang/srt/speculative/ddtree_verify.py(296): accepted_kv_and_hidden_index", [],
         [("_compaction_kernel", 3.0)])], [("memcpy_d2h", 2.0)]),
    ("sglang/srt/speculative/dflash_worker.py(984): _append_target_hidden_to_draft_kv", [], [("kv_append", 8.0)])],
    [])


def gdn_kernels(cfg: dict) -> list[tuple[str, float]]:
    """The GatedDeltaNet verify kernels a hybrid target's round launches (names as SGLang 0.5.17 / the DDTree runtime
    give them; bench/e2e/gdn_share.py groups them), per GDN layer; none for dense targets."""
    if cfg["modelset"] not in ("hyb", "hyblive", "q36"):
        return []
    layers = 48 if cfg["modelset"] == "q36" else 3
    if cfg["algo"] == "ddtree":
        per = [("_tree_conv_kernel", 3.0), ("fused_gdn_gating_kernel", 1.0), ("_tree_gdn_kernel", 6.0)]
        commit = [("_commit_kernel", 4.0)]
    else:
        per = [("_causal_conv1d_update_kernel", 2.0), ("fused_sigmoid_gating_delta_rule_update_kernel", 4.0)]
        commit = [("fused_mamba_state_scatter_with_mask_kernel", 2.0)]
    return per * layers + commit


def synthetic_round_trace(rounds: int, gdn: list[tuple[str, float]] | None = None, pid: int = 1,
                          tid: int = 1) -> list[dict]:
    """Chrome-trace events of `rounds` DDTree rounds: host frames 10 us apart, GPU kernels back to back; ``gdn``:
    extra kernels launched in the round's target forward (a hybrid target's GatedDeltaNet verify)."""
    ev: list[dict] = []
    round_ = ROUND
    if gdn:
        name, children, launches = ROUND
        children = [(n, c, ll + list(gdn)) if "tp_worker" in n else (n, c, ll) for n, c, ll in children]
        round_ = (name, children, launches)
    state = {"t": 0.0, "gpu": 0.0, "corr": 0}

    def emit(node: tuple) -> None:
        name, children, launches = node
        start = state["t"]
        state["t"] += 10.0
        for kname, us in launches:
            state["corr"] += 1
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": pid, "tid": tid,
                       "ts": state["t"], "dur": 1.0, "args": {"correlation": state["corr"]}})
            state["gpu"] = max(state["gpu"], state["t"] + 5.0)
            ev.append({"ph": "X", "cat": "kernel", "name": kname, "pid": 0, "tid": 7, "ts": state["gpu"], "dur": us,
                       "args": {"correlation": state["corr"], "device": 0, "stream": 7}})
            state["gpu"] += us
            state["t"] += 10.0
        for c in children:
            emit(c)
        state["t"] += 10.0
        ev.append({"ph": "X", "cat": "python_function", "name": name, "pid": pid, "tid": tid, "ts": start,
                   "dur": state["t"] - start, "args": {}})

    for _ in range(rounds):
        emit(round_)
    return ev
