"""Bases, patched trees and CPU stand-ins for the spec-v2 (SGLang 0.5.14 and later) patch-set tests.

Patched trees are built with the product's own patch-set code (the overlay a release would carry, plus every
unchanged base file), from the real wheels (`pip download --no-deps sglang==X`, cached). SGLang's modules are
imported in subprocesses whose PYTHONPATH holds the patched tree, the spec-v2 dependency folder
(tests/sglang_v2/requirements-cpu.txt, installed by `make install`) and small stand-ins written here: torchvision and
xgrammar (imported at module level, never used on these paths) and a "fake CUDA" sitecustomize that makes torch
report one sm90 GPU so that server arguments resolve as on an H200 (nothing is computed on a device).
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "sglang_v1"))
from sglang_series_helpers import write_torchvision_stub  # noqa: E402

import spec_v2_tables  # noqa: E402

#: patches/ddtree/spec-v2/bases.py and backends.py, loaded by path (pure data).
BASES_TABLE = spec_v2_tables.load("bases")
#: The target attention backends DDTree knows (backends.py: status, mask layout, reasons, page sizes).
BACKENDS_TABLE = spec_v2_tables.load("backends")
#: Where the bases' series differ (each base folder's ``traits:``; bases.py's ``Base`` says what each field means).
TRAITS = spec_v2_tables.bases_table()
#: Every spec-v2 base the patch set covers (one folder each under patches/ddtree/, with its traits).
BASES = tuple(TRAITS)
BaseTraits = BASES_TABLE.Base


def with_trait(name: str) -> tuple[str, ...]:
    """The spec-v2 bases whose traits have ``name`` true, oldest first."""
    return BASES_TABLE.with_trait(name, TRAITS)


DEPS = Path(os.environ.get("DDTREE_SGLANG_V2_DEPS", REPO / ".cache" / "sglang-v2-deps"))
#: Bases that pin other versions of some of those packages: requirements-cpu-<base>.txt, installed (by make install)
#: into DEPS-<base>, which goes on PYTHONPATH in front of DEPS for that base only (0.5.14 pins transformers 5.8.1).
BASE_DEPS = {p.stem.rsplit("-", 1)[1]: p for p in sorted(Path(__file__).parent.glob("requirements-cpu-*.txt"))}
REQUIRED = os.environ.get("DDTREE_REQUIRE_SGLANG_DEPS") == "1"

_XGRAMMAR = '''from typing import Any
StructuralTag = Any  # what sglang itself falls back to without xgrammar
def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return type(name, (), {})
'''

FAKE_CUDA = '''import types
import torch
_props = types.SimpleNamespace(name="NVIDIA H200", major=9, minor=0, total_memory=143771 * 2**20,
                               multi_processor_count=132, L2_cache_size=60 * 2**20, warp_size=32,
                               max_threads_per_multi_processor=2048, regs_per_multiprocessor=65536,
                               shared_memory_per_block_optin=232448, shared_memory_per_multiprocessor=233472,
                               is_integrated=False, uuid="fake", gcnArchName="", clock_rate=1980000,
                               memory_clock_rate=3201000, memory_bus_width=6144)
c = torch.cuda
c.is_available = lambda: True
c.device_count = lambda: 1
c.current_device = lambda: 0
c.set_device = lambda *a, **k: None
c.get_device_capability = lambda *a, **k: (9, 0)
c.get_device_properties = lambda *a, **k: _props
c.get_device_name = lambda *a, **k: "NVIDIA H200"
c.mem_get_info = lambda *a, **k: (140 * 2**30, 143771 * 2**20)
c.is_bf16_supported = lambda *a, **k: True
c.synchronize = lambda *a, **k: None
c.get_arch_list = lambda: ["sm_90", "sm_100"]
c.is_initialized = lambda: True
'''


def base_deps(version: str) -> list[Path]:
    """The dependency folders for ``version``, most specific first."""
    extra = [Path(f"{DEPS}-{version}")] if version in BASE_DEPS else []
    return [*extra, DEPS]


def need_deps(version: str | None = None) -> None:
    """Skip (or, in CI, fail) when a spec-v2 dependency folder is missing."""
    have = all((DEPS / name).is_dir() for name in ("fastapi", "transformers")) and all(
        (DEPS / name).is_dir() or importlib.util.find_spec(name) is not None for name in ("prometheus_client", "uvloop"))
    missing = [] if have else [DEPS]
    if version in BASE_DEPS and not (Path(f"{DEPS}-{version}") / "transformers").is_dir():
        missing.append(Path(f"{DEPS}-{version}"))
    if not missing:
        return
    msg = (f"{', '.join(map(str, missing))}: missing the spec-v2 SGLang dependencies (make install, or pip install "
           "--no-deps --target)")
    if REQUIRED:
        pytest.fail(msg)
    pytest.skip(msg)


def base_wheel(version: str) -> Path:
    from ddtree_deploy.errors import OperationFailed
    from ddtree_deploy.wheels import fetch_wheel

    try:
        return fetch_wheel("sglang", version)
    except OperationFailed as exc:
        if REQUIRED:
            raise
        pytest.skip(str(exc))


def pinned(version: str, package: str) -> str:
    """The version of ``package`` that the sglang ``version`` wheel pins (Requires-Dist: package==X)."""
    with zipfile.ZipFile(base_wheel(version)) as zf:
        meta = zf.read(f"sglang-{version}.dist-info/METADATA").decode()
    m = re.search(rf"^Requires-Dist: {re.escape(package)}==([^;\s]+)\s*$", meta, re.M | re.I)
    assert m, f"sglang {version} does not pin {package}"
    return m.group(1)


def build_patched(version: str, dest: Path) -> Path:
    """The whole sglang package of ``version`` with the ddtree patch set applied, as the product builds it."""
    from ddtree_deploy.patchset.apply import apply_patchset
    from ddtree_deploy.patchset.base import WheelBase
    from ddtree_deploy.patchset.build import write_overlay
    from ddtree_deploy.patchset.format import find_patchset_for

    base = WheelBase(base_wheel(version))
    ps = find_patchset_for("ddtree", version, root=REPO / "patches")
    result = apply_patchset(ps, base)
    write_overlay(result.overlay, base, dest, full=True)
    return dest


def model_dirs(work: Path, target: dict, drafter: dict) -> tuple[Path, Path]:
    """A target and a drafter folder holding only their config.json (server arguments read no more)."""
    tgt, drf = work / "tgt", work / "drf"
    for d, cfg in ((tgt, target), (drf, drafter)):
        d.mkdir()
        (d / "config.json").write_text(json.dumps(cfg))
    return tgt, drf


def stand_ins(dest: Path, *, fake_cuda: bool = False) -> list[str]:
    """PYTHONPATH entries with the stand-ins (torchvision, xgrammar; fake CUDA as sitecustomize when asked)."""
    write_torchvision_stub(dest / "stub")
    xg = dest / "xg" / "xgrammar"
    xg.mkdir(parents=True, exist_ok=True)
    (xg / "__init__.py").write_text(_XGRAMMAR)
    (xg / "structural_tag.py").write_text(_XGRAMMAR)
    paths = [str(dest / "stub"), str(dest / "xg")]
    if fake_cuda:
        (dest / "cuda").mkdir(exist_ok=True)
        (dest / "cuda" / "sitecustomize.py").write_text(FAKE_CUDA)
        paths.insert(0, str(dest / "cuda"))
    return paths


#: What SGLang's launcher, engine and every scheduler process run first: the plugins of group sglang.srt.plugins
#: (the overlay's ddtree_sglang_plugin dist-info), whose hooks are applied before any DDTree code runs.
LOAD_PLUGINS = "from sglang.srt.plugins import load_plugins as _load_plugins\n_load_plugins()\n"


def run_python(tree: Path, work: Path, code: str, *args: str, fake_cuda: bool = False, plugins: bool = True,
               timeout: int = 300) -> subprocess.CompletedProcess:
    """Run ``code`` with the patched ``tree`` importable as sglang, on CPU, with its base's dependencies; with
    ``plugins``, after SGLang's plugin loader, as every SGLang server process starts."""
    version = json.loads((tree / "overlay.json").read_text())["base_version"]
    need_deps(version)
    pp = [str(tree), *map(str, base_deps(version)), *stand_ins(work, fake_cuda=fake_cuda),
          os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in pp if p), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "SGLANG_IS_FLASHINFER_AVAILABLE": "false", "PYTHONWARNINGS": "ignore"}
    script = work / "script.py"
    script.write_text((LOAD_PLUGINS if plugins else "") + code)
    return subprocess.run([sys.executable, str(script), *args], cwd=work, env=env, capture_output=True, text=True,
                          timeout=timeout)


#: What the probe imports from a patched tree: every module the series touches and the vendored glue.
PROBE_MODULES = ("sglang.srt.server_args", "sglang.srt.arg_groups.speculative_hook", "sglang.srt.speculative.spec_info",
                 "sglang.srt.speculative.dflash_info_v2", "sglang.srt.speculative.dflash_worker_v2",
                 "sglang.srt.layers.attention.triton_backend",
                 "sglang.srt.model_executor.runner.decode_cuda_graph_runner",
                 *[f"sglang.srt.speculative.ddtree_v2.{m}"
                   for m in ("config", "draft_topk", "round", "sampling", "verify_input", "compat", "graph_widths",
                             "draft_schedule")])

# One subprocess per base (importing SGLang costs seconds): import the modules, then drive the glue's calls whose
# keywords or homes moved between the bases against that base's own classes (without their GPU start-up).
PROBE_SCRIPT = r'''
import importlib, json, sys, types
import torch
import transformers

for m in sys.argv[1:]:
    importlib.import_module(m)
from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2
from sglang.srt.speculative.ddtree_v2 import compat, round as ddround

out = {"imported": len(sys.argv) - 1, "transformers": transformers.__version__}


def bare_worker(**attrs):
    """The base's real worker class without its GPU start-up; unknown attributes fall through to a target worker
    that has none (as the class's __getattr__ delegates)."""
    w = object.__new__(DFlashWorkerV2)
    w._target_worker = types.SimpleNamespace()
    for k, v in attrs.items():
        setattr(w, k, v)
    return w


worker = bare_worker()
bonus = torch.tensor([5, 7, 9])
new_lens = torch.tensor([11, 12, 13])
reserved = torch.tensor([40, 41, 42], dtype=torch.int32)
nxt = compat.next_draft_input_decode(worker, draft_input=types.SimpleNamespace(reserved_seq_lens_cpu=reserved),
                                     bonus_tokens=bonus, new_seq_lens=new_lens)
tok = getattr(nxt, "bonus_tokens", None)
if tok is None:
    tok = nxt.verified_id
out["next"] = {"type": type(nxt).__name__, "tokens": tok.tolist(), "new_seq_lens": nxt.new_seq_lens.tolist(),
               "watermark": (nxt.cur_allocated_seq_lens_cpu.tolist()
                             if getattr(nxt, "cur_allocated_seq_lens_cpu", None) is not None else None),
               "verify_done": getattr(nxt, "verify_done", None) is not None,
               "has_verify_done_field": hasattr(nxt, "verify_done")}
out["names"] = {n: compat.base_name(n).__module__ for n in ("assign_extend_cache_locs_func", "GenerationBatchResult",
                                                             "apply_dflash_verify_logits_adjustments")}

backend = object.__new__(TritonAttnBackend)
backend._verify_mask = None  # 0.5.17's property reads it; older bases have no such attribute
backend.cuda_graph_custom_mask = torch.zeros(4096, dtype=torch.uint8)
rnd = object.__new__(ddround.DDTreeRound)
m = rnd.verify_mask(backend, 2, 1000, "cpu")
big = rnd.verify_mask(backend, 2, 5000, "cpu")
out["mask"] = {"in_graph_buffer": m.data_ptr() == backend.cuda_graph_custom_mask.data_ptr(), "numel": m.numel(),
               "too_big_in_buffer": big.data_ptr() == backend.cuda_graph_custom_mask.data_ptr(),
               "has_verify_mask": hasattr(TritonAttnBackend, "verify_mask")}
other = types.SimpleNamespace(cuda_graph_custom_mask=backend.cuda_graph_custom_mask)  # not a triton backend
out["mask"]["other_backend_in_buffer"] = (
    rnd.verify_mask(other, 2, 1000, "cpu").data_ptr() == backend.cuda_graph_custom_mask.data_ptr())

w = bare_worker(server_args=types.SimpleNamespace(tp_size=2))
with_ps = bare_worker(ps=types.SimpleNamespace(tp_size=4), server_args=types.SimpleNamespace(tp_size=1))
out["tp"] = [ddround.tp_size(w), ddround.tp_size(with_ps)]

# The backends table (ddtree_v2/backends.py) against this base: the --attention-backend values it accepts, the
# classes it has, and what the worker's start-up check makes of each class (it reads the class name only).
import pathlib, re
from sglang.srt import server_args as S
from sglang.srt.speculative.ddtree_v2 import backends as ddbackends

attn = pathlib.Path(importlib.import_module("sglang.srt.layers.attention").__path__[0])
classes = set(re.findall(r"^class (\w+)\(", "\n".join(f.read_text() for f in attn.rglob("*.py")), re.M))
out["backends"] = {name: {"choice": name in S.ATTENTION_BACKEND_CHOICES, "class": row.cls in classes}
                   for name, row in ddbackends.BACKENDS.items()}


def target_check(cls_name, allow):
    rnd = object.__new__(ddround.DDTreeRound)
    rnd.allow_unproven = allow
    wrapper = types.SimpleNamespace(full_attn_backend=type(cls_name, (), {})())  # as a hybrid wrapper holds it
    try:
        rnd.check_target(types.SimpleNamespace(attn_backend=wrapper, sliding_window_size=None), is_hybrid=False)
        return {"ok": True, "name": rnd.backend_name, "prefix_cols": rnd.prefix_cols}
    except ValueError as e:
        return {"ok": False, "msg": str(e)}


out["check_target"] = {f"{c}/{'allow' if a else 'default'}": target_check(c, a)
                       for c in [r.cls for r in ddbackends.BACKENDS.values()] + ["TorchNativeAttnBackend"]
                       for a in (False, True)}
print("RESULT" + json.dumps(out))
'''


# The FlashInfer verify metadata from a DDTree verify input (tests/sglang_v2/test_v2_backends.py reads the result).
FLASHINFER_SCRIPT = r'''
import json, torch
from sglang.srt.speculative.ddtree import build_tree, build_verify_inputs, draft_topk, mask_numel, write_verify_mask
import sglang.srt.speculative.dflash_info as dflash_info
from sglang.srt.speculative.ddtree_v2.verify_input import DDTreeVerifyInput


class KvIndices:  # the base's KV-index Triton kernel does not run in Triton's CPU interpreter: its torch equivalent
    def __getitem__(self, grid):
        def run(req_to_token, pool, lens, indptr, start, out, stride):
            for b in range(grid[0]):
                out[int(indptr[b]): int(indptr[b + 1])] = req_to_token[int(pool[b]), : int(lens[b])]
        return run


dflash_info.create_flashinfer_kv_indices_triton = KvIndices()
g = torch.Generator().manual_seed(3)
bs, depth, vocab, budget = 3, 5, 40, 9
n1 = budget + 1
lp, tok = draft_topk(torch.randn(bs, depth, vocab, generator=g), budget, impl="torch")
tree = build_tree(lp, tok, torch.randint(0, vocab, (bs,), generator=g), budget, impl="torch")
prefix = torch.tensor([7, 0, 12])
vin = build_verify_inputs(tree, prefix, impl="torch")
mask = torch.zeros(mask_numel(int(prefix.sum()), bs, n1), dtype=torch.bool)
write_verify_mask(vin.mask, prefix, mask, prefix_cols=True, max_prefix=int(prefix.max()), impl="torch")
req_to_token = torch.arange(4 * 64, dtype=torch.int32).view(4, 64) + 1000
pool = torch.tensor([2, 0, 3])
spec = DDTreeVerifyInput(draft_token=tree.token.reshape(-1), positions=vin.positions.reshape(-1),
                         draft_token_num=n1, custom_mask=mask, tree=tree)
kv_indices, kv_indptr, qo_indptr, got_mask = spec.generate_attn_arg_prefill(pool, prefix, int(prefix.sum()),
                                                                            req_to_token)
rows = []
for b in range(bs):
    p = int(prefix[b])
    block = got_mask[int(sum(n1 * (int(prefix[c]) + n1) for c in range(b))):][: n1 * (p + n1)].view(n1, p + n1)
    rows.append({"context_visible": bool(block[:, :p].all()), "tree_equal": bool(torch.equal(block[:, p:], vin.mask[b]))})
print("RESULT" + json.dumps({
    "qo_indptr": qo_indptr.tolist(), "kv_indptr": kv_indptr.tolist(),
    "kv_indices": kv_indices.tolist(), "rows": rows, "mask_numel": got_mask.numel(),
    "expect_kv": [int(x) for b in range(bs) for x in req_to_token[int(pool[b]), : int(prefix[b]) + n1]],
}))
'''

# After SGLang's plugin loader ran (run_python's preamble, as in every SGLang server process): each hook of the
# overlay's table is SGLang's HookRegistry wrapper around the base's own definition, calling our implementation.
PLUGIN_SCRIPT = r'''
import importlib, importlib.metadata, json, pkgutil
from sglang.srt.plugins.hook_registry import HookRegistry
from sglang.srt.speculative.ddtree_v2 import plugin

rows = []
for h in plugin.table()["hooks"]:
    owner_path, attr = h["target"].rsplit(".", 1)
    owner = pkgutil.resolve_name(owner_path)
    current = owner.__dict__.get(attr) if isinstance(owner, type) else getattr(owner, attr)
    fn = getattr(current, "__func__", current)
    module, name = h["hook"].split(":")
    impl = getattr(importlib.import_module(module), name)
    cells = [c.cell_contents for c in (getattr(fn, "__closure__", None) or ())]
    rows.append({"target": h["target"], "type": h["type"], "applied": h["target"] in HookRegistry._patched,
                 "wraps_base": hasattr(fn, "__wrapped__"), "calls_ours": any(c is impl for c in cells)})
try:
    plugin.require_applied("probe")
    required = "ok"
except RuntimeError as exc:
    required = str(exc)
eps = [{"name": ep.name, "value": ep.value, "dist": ep.dist.name if ep.dist else None}
       for ep in importlib.metadata.entry_points(group="sglang.srt.plugins")]
print("RESULT" + json.dumps({"hooks": rows, "refused": {" ".join(k): v for k, v in plugin._refused.items()},
                             "required": required, "entry_points": eps}))
'''

#: The scripts that share one subprocess per base, in order (name, code, argv). The FlashInfer one goes last: it
#: replaces a base kernel with its torch equivalent for the rest of the process.
# Tree verifies through DDTree's attention kernel (spec-v2/verify_attention.py): the triton backend's extend kernel
# attribute, read from the base's own source, wrapped; calls laid out as the backend's forward_extend makes them.
VERIFY_ATTN_SCRIPT = r'''
import functools, importlib, inspect, json, os, re, types
import torch
from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
from sglang.srt.speculative.ddtree_v2 import verify_attention as va

init_src = inspect.getsource(TritonAttnBackend.__init__)
module = re.search(r"from ([\w.]+) import \(?[^)]*?\bextend_attention_fwd\b", init_src, re.S).group(1)
real = importlib.import_module(module).extend_attention_fwd
params = list(inspect.signature(real).parameters)
calls = {"original": [], "tree": []}


@functools.wraps(real)
def original(*a, **k):
    calls["original"].append(1)


def tree(*a):
    calls["tree"].append({"scale": a[11], "max_len": a[12], "mask_is_arg": a[9] is mask})


wrapped = va.wrap(original, tree)
t = torch.zeros((4, 2, 8))
mask, ind = torch.ones(40, dtype=torch.bool), torch.zeros(3, dtype=torch.int64)
extra = {"logit_cap": 0.0, "sliding_window_size": -1, "sinks": None, "window_kv_offsets": None,
         "xai_temperature_len": -1, "page_size": 1, "score_mod": None, "aux_tensors": None, "extend_seq_lens_cpu": None}
extra = {k: v for k, v in extra.items() if k in params}


def call(custom_mask, **over):
    kw = dict(extra, **over)
    wrapped(t, t, t, t, t, t, ind, ind, ind, custom_mask, True, ind if custom_mask is not None else None, 2, 1.0, 1.0,
            0.125, **kw)
    return (len(calls["original"]), len(calls["tree"]))


fe = inspect.getsource(TritonAttnBackend.forward_extend)
kernel = getattr(TritonAttnBackend, "_forward_extend_kernel", None)  # 0.5.22+: forward_extend calls it, it calls ours
hook = "self.extend_attention_fwd(" in fe or (kernel is not None and "self._forward_extend_kernel(" in fe
                                             and "self.extend_attention_fwd(" in inspect.getsource(kernel))
out = {"module": module, "hook_point": hook,
       "chain": call(None), "tree": call(mask), "window": call(mask, sliding_window_size=16) if "sliding_window_size" in params else None,
       "sinks": call(mask, sinks=torch.zeros(2)) if "sinks" in params else None, "tree_args": calls["tree"][:1]}
backend = types.SimpleNamespace(extend_attention_fwd=real)
out["default_installs"] = va.install(backend, tree)
try:  # the scripts after this one in the same process must not see the variable
    os.environ["DDTREE_VERIFY_ATTN"] = "ddtree"
    out["installs"] = [va.install(backend, tree), va.install(backend, tree)]
    out["wrapped_once"] = getattr(backend.extend_attention_fwd, "__wrapped__", None) is real
    os.environ["DDTREE_VERIFY_ATTN"] = "fast"
    try:
        va.choice()
        out["bad_value"] = "accepted"
    except ValueError as e:
        out["bad_value"] = str(e)
finally:
    os.environ.pop("DDTREE_VERIFY_ATTN", None)
print("RESULT" + json.dumps(out))
'''

# DDTree's metrics and per-request budgets through the base's own classes (spec-v2/metrics.py, request_budget.py):
# SamplingParams.verify with a request's setting, a DDTree worker's round records (real runtime trees, walks and
# per-request cuts), the scheduler's real _resolve_spec_v2_tokens with the plugin's hook after it, the tokenizer
# manager's real _calculate_spec_decoding_metrics, /metrics through prometheus_client, and the in-round code run on
# meta tensors (any host read of a device value fails there) under an op log.
METRICS_SCRIPT = r'''
import importlib, json, pathlib, re, sys, types
import torch
from types import SimpleNamespace as NS
from torch.utils._python_dispatch import TorchDispatchMode
from sglang.srt.managers.scheduler_components.batch_result_processor import SchedulerBatchResultProcessor
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.managers.tokenizer_manager import TokenizerManager
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2
from sglang.srt.speculative.ddtree import build_tree, accept_walk, prune_tree
from sglang.srt.speculative.ddtree import metrics as rtm
from sglang.srt.speculative.ddtree_v2 import compat, metrics as ddm, request_budget
from sglang.srt.speculative.ddtree_v2.bases import BASES
from sglang.srt.speculative.ddtree_v2.config import base_version
from sglang.srt.speculative.ddtree_v2.round import DDTreeRound

out = {"meta_info_base": BASES[base_version()].meta_info}

# 1) a request's setting: ignored until DDTree's flags resolve in this process, then a bad one is refused
def verify(params):
    try:
        SamplingParams(max_new_tokens=8, custom_params=params).verify(100)
        return "ok"
    except ValueError as e:
        return str(e)

bad = {"ddtree": {"budget": -2}}
out["check_off"] = verify(bad)
request_budget.mark_enabled()
out["check_on"] = {k: verify(v) for k, v in {"bad_budget": bad, "unknown": {"ddtree": {"budegt": 4}},
                                            "good": {"ddtree": {"budget": 3}}, "off": {"ddtree": {"speculative": False}},
                                            "none": None}.items()}

# 2) a DDTree worker: one tree round (budget 8, three requests: the server's budget, 3, speculative false)
block, budget, bs, vocab = 6, 8, 3, 50
server = NS(speculative_ddtree_budget=budget, speculative_ddtree_schedule=None, speculative_ddtree_adapt=False,
            enable_metrics=True)
rnd = DDTreeRound(server, block_size=block)
worker = object.__new__(DFlashWorkerV2)
worker._target_worker = types.SimpleNamespace()
worker._ddtree = rnd


def make_req(i, params):
    sp = SamplingParams(max_new_tokens=64, custom_params=params)
    req = Req(f"req{i}", "", [1, 2, 3], sp)
    req.output_ids = [11]  # the prefill's token
    return req


reqs = [make_req(0, None), make_req(1, {"ddtree": {"budget": 3}}), make_req(2, {"ddtree": {"speculative": False}})]
g = torch.Generator().manual_seed(5)
lp, tok = torch.log_softmax(4 * torch.randn(bs, block - 1, vocab, generator=g), -1).sort(-1, descending=True)
tree = build_tree(lp[..., :budget].contiguous(), tok[..., :budget].contiguous(), torch.tensor([4, 5, 6]), budget,
                  impl="torch")
fc = tree.first_child.to(torch.int64)  # the target agrees with every node's first child where it has one
target = torch.where(fc >= 0, tree.token.gather(1, fc.clamp(min=0)), torch.full_like(tree.token, 49))
assert rnd.tree_round(worker, bs)
caps = request_budget.round_caps(reqs, rnd.budget)
out["caps"] = caps
pruned = prune_tree(tree, request_budget.caps_tensor(caps, "cpu"))
walk = accept_walk(pruned, target, impl="torch")
rnd.metrics.ensure(bs, rnd.budget)
rnd.metrics.count(pruned, target, walk.accepted_nodes)
GBR = compat.base_name("GenerationBatchResult")
stride = block
toks = torch.zeros(bs, stride, dtype=torch.int64)
toks[:, : walk.accepted_tokens.shape[1]] = walk.accepted_tokens.clamp(min=0)
tree_result = rnd.metrics.attach(GBR(next_token_ids=toks.view(-1), accept_lens=(walk.accept_len + 1).to(torch.int32),
                                     speculative_num_draft_tokens=stride), caps)
out["tree_accept"] = walk.accept_len.tolist()
solo = []  # each request alone at its own budget: the same walk
for i, c in enumerate(caps):
    if c == 0:
        solo.append(0)
        continue
    t = build_tree(lp[i:i + 1, :, :c].contiguous(), tok[i:i + 1, :, :c].contiguous(), torch.tensor([4 + i]), c,
                   impl="torch")
    solo.append(int(accept_walk(t, target[i:i + 1, : c + 1], impl="torch").accept_len[0]))
out["solo_accept"] = solo
# then a chain round (the schedule's 0 at this size): SGLang's own result, no record on it
rnd.metrics.begin(bs, 0)
chain_result = GBR(next_token_ids=torch.arange(bs * stride), accept_lens=torch.tensor([3, 1, 6], dtype=torch.int32),
                   speculative_num_draft_tokens=stride)

# 3) the scheduler's result processor reads the results (its real _resolve_spec_v2_tokens; the plugin's hook after it)
sched = object.__new__(SchedulerBatchResultProcessor)  # a frozen dataclass of the scheduler's parts
for name, value in {"model_worker": worker, "draft_worker": None,
                    "metrics_collector": NS(labels={"model_name": "tiny", "tp_rank": 0}),  # SGLang's: its labels
                    "metrics_reporter": NS(current_scheduler_metrics_enabled=True,  # 0.5.23 also snapshots its own
                                           snapshot_spec_decode_metrics=lambda *a, **k: None)}.items():
    object.__setattr__(sched, name, value)
batch = NS(reqs=reqs, has_grammar=False, forward_mode=NS(is_decode=lambda: True, is_extend=lambda: False),
           spec_algorithm=NS(is_dflash=lambda: True, is_none=lambda: False))
out["rounds"] = []
for res in (tree_result, chain_result):
    tokens = sched._resolve_spec_v2_tokens(res, batch)
    for req, t in zip(reqs, tokens):
        req.output_ids.extend(t)  # what process_batch_result_decode does next
    out["rounds"].append({"tokens": [len(t) for t in tokens],
                          "aligned": [len((r.customized_info or {}).get(rtm.ROUND_KEY) or []) == len(r.output_ids)
                                      for r in reqs]})
out["entries"] = [[e for e in (r.customized_info or {}).get(rtm.ROUND_KEY) or [] if e is not None] for r in reqs]

# 4) the tokenizer side: a finished request's meta_info (the tokens' accumulated values, as SGLang keeps them)
tm = object.__new__(TokenizerManager)
tm.server_args = NS(speculative_num_draft_tokens=budget + 1, speculative_dflash_block_size=block,
                    speculative_algorithm="DFLASH")
tm_module = sys.modules[TokenizerManager.__module__]
if hasattr(tm_module, "get_spec"):  # 0.5.19+ read the published arguments: these, as a server publishes them
    tm_module.get_spec = lambda: tm.server_args
metas = []
for r in reqs:
    meta = {rtm.ROUND_KEY: list((r.customized_info or {}).get(rtm.ROUND_KEY) or [])} if r.customized_info else {}
    recv = NS(spec_verify_ct=[r.spec_verify_ct], spec_num_correct_drafts=[r.spec_num_correct_drafts],
              completion_tokens=[len(r.output_ids)], spec_correct_drafts_histogram=[[]], spec_num_cap_tokens=None,
              spec_num_block_accept_tokens=None, spec_cap_lens_histogram=None)
    tm._calculate_spec_decoding_metrics(meta, recv, 0)
    metas.append(meta)
out["meta_info"] = metas

# 5) /metrics: DDTree's families through prometheus_client, none of them a name SGLang itself defines
from prometheus_client import REGISTRY, generate_latest
scrape = generate_latest(REGISTRY).decode()
acc = rtm.acceptance(scrape)
out["scrape"] = {k: acc[k] for k in ("drafts", "draft_tokens", "accepted_tokens", "accepted_per_depth", "rounds",
                                     "chain_rounds", "rank_observed", "rank_accepted")}
out["labels"] = sorted({m.group(1) for m in re.finditer(r'sglang:ddtree_rounds_total\{([^}]*)\}', scrape)})
srt = pathlib.Path(importlib.import_module("sglang.srt").__path__[0])
theirs = set()
for f in srt.rglob("*.py"):
    if "ddtree" in f.parts[-2] or f.parts[-2].startswith("ddtree"):
        continue
    theirs |= set(re.findall(r'["\'](sglang:[A-Za-z0-9_:]+)["\']', f.read_text(errors="replace")))
ours = {n for f in rtm.FAMILIES for n in (f.name, f.sample, f.name + "_bucket", f.name + "_sum")}
out["sglang_names"] = len(theirs)
out["clash"] = sorted(ours & theirs)
out["sglang_spec_names"] = sorted(n for n in theirs if "spec" in n)

# 6) the in-round code on meta tensors (a host read of a device value fails there), every op logged
class OpLog(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        self.ops.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


meta = lambda t: t.to("meta")
mtree = type(tree)(**{f: (meta(getattr(tree, f)) if isinstance(getattr(tree, f), torch.Tensor) else getattr(tree, f))
                      for f in ("token", "parent", "depth", "score", "first_child", "next_sibling", "num_nodes",
                                "max_depth")})
mrnd = DDTreeRound(server, block_size=block)
try:
    with OpLog() as log:
        mrnd.metrics.begin(bs, budget)
        mpruned = prune_tree(mtree, request_budget.caps_tensor(caps, "meta"))
        mrnd.metrics.count(mpruned, meta(target), meta(walk.accepted_nodes))
        mrnd.metrics.attach(NS(), caps)
    out["meta_run"] = {"ok": True, "ops": sorted(set(log.ops)), "counts_device": str(mrnd.metrics.counts.device)}
except Exception as e:
    out["meta_run"] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
print("RESULT" + json.dumps(out))
'''

# The commit with page size > 1 (spec-v2/round.py paged_kv_rows + the runtime's move_path_kv) on the base's real KV
# pool, built on CPU: the accepted path's rows copied into the slots of their positions in every layer's K and V.
PAGED_COMMIT_SCRIPT = r'''
import json, types
import torch
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
from sglang.srt.speculative import ddtree as rt
from sglang.srt.speculative.ddtree_v2 import round as ddround

NS = types.SimpleNamespace
pool = MHATokenToKVPool(64, 16, torch.bfloat16, 2, 8, 3, "cpu", False)
rows = ddround.paged_kv_rows(NS(token_to_kv_pool=pool))
for layer in range(3):  # row r of layer l holds r + 100 l (K) and -(r + 100 l) (V)
    ids = torch.arange(pool.get_key_buffer(layer).shape[0], dtype=torch.float32) + 100 * layer
    pool.get_key_buffer(layer).copy_(ids[:, None, None].expand_as(pool.get_key_buffer(layer)))
    pool.get_value_buffer(layer).copy_(-ids[:, None, None].expand_as(pool.get_value_buffer(layer)))
nodes = torch.tensor([[0, 2, 3, 5], [0, 1, -1, -1]], dtype=torch.int32)  # two requests' accepted paths
slots = torch.tensor([[16, 17, 18, 19, 20, 21], [32, 33, 34, 35, 36, 37]])
walk = rt.WalkResult(accepted_nodes=nodes, accept_len=torch.tensor([3, 1], dtype=torch.int32),
                     accepted_tokens=torch.zeros((2, 4), dtype=torch.int64), bonus_token=torch.zeros(2, dtype=torch.int64))
rt.move_path_kv(rows, *rt.kv_compaction(walk, slots, impl="torch"), impl="torch")
got = {"buffers": len(rows.buffers), "row": rows.row,
       "k": [[int(pool.get_key_buffer(l)[s, 0, 0]) for s in range(16, 22)] for l in range(3)],
       "v": [[int(pool.get_value_buffer(l)[s, 0, 0]) for s in range(32, 36)] for l in range(3)]}


def refused(p):
    try:
        ddround.paged_kv_rows(NS(token_to_kv_pool=p))
        return "accepted"
    except ValueError as e:
        return str(e)


got["hnd"] = refused(NS(kv_cache_layout="hnd", k_buffer=pool.k_buffer, v_buffer=pool.v_buffer))
got["scales"] = refused(NS(kv_cache_layout="nhd", k_buffer=pool.k_buffer, v_buffer=pool.v_buffer,
                           k_scale_buffer=[torch.zeros(1)]))
got["no_lists"] = refused(NS())
got["hybrid"] = len(ddround.paged_kv_rows(NS(token_to_kv_pool=NS(full_kv_pool=pool))).buffers)
print("RESULT" + json.dumps(got))
'''

CPU_SCRIPTS = (("probe", PROBE_SCRIPT, PROBE_MODULES), ("plugin", PLUGIN_SCRIPT, ()), ("metrics", METRICS_SCRIPT, ()),
               ("flashinfer", FLASHINFER_SCRIPT, ()), ("verify_attention", VERIFY_ATTN_SCRIPT, ()),
               ("paged_commit", PAGED_COMMIT_SCRIPT, ()))

# The start-up refusals of tests/sglang_v2/test_hybrid_v2.py, through DDTreeRound.check_target on each base's real
# classes: argv = (base, "hybrid" for a base whose series has the hybrid patch, else "plain").
REFUSALS_SCRIPT = r'''
import json, sys, types
import torch
from types import SimpleNamespace as NS
from sglang.srt.layers.attention.hybrid_linear_attn_backend import HybridLinearAttnBackend, Mamba2AttnBackend
from sglang.srt.layers.attention.linear.gdn_backend import GDNAttnBackend
from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
from sglang.srt.speculative.ddtree_v2.round import DDTreeRound

n1 = 17
Triton = type("TritonGDNKernel", (), {})
FlashInfer = type("FlashInferGDNKernel", (), {})


def cache(dedup=False, strided=False):
    temporal = torch.zeros(2, 5, 3, 8, 8)
    if strided:  # a page-major envelope: each slot's state spread over a wider row
        temporal = torch.zeros(2, 5, 3, 8, 16)[..., :8]
    if dedup:  # 0.5.17's sliding-window view: step t's window starts at column t
        phys = torch.zeros(2, 5, 24, n1 + 2)
        win = phys.as_strided((2, 5, n1, 24, 3), (phys.stride(0), phys.stride(1), 1, phys.stride(2), 1))
    else:
        win = torch.zeros(2, 5, n1, 24, 3)
    return NS(conv=[torch.zeros(2, 5, 24, 3)], temporal=temporal, intermediate_ssm=torch.zeros(2, 5, n1, 3, 8, 8),
              intermediate_conv_window=[win])


def runner(linear, *, pool=None, c=None):
    full = object.__new__(TritonAttnBackend)
    hyb = object.__new__(HybridLinearAttnBackend)
    hyb.full_attn_backend, hyb.linear_attn_backend = full, linear
    pool = pool or NS(enable_linear_replayssm=False, enable_linear_replayssm_spec=False, mamba_cache=c or cache())
    return NS(attn_backend=hyb, req_to_token_pool=NS(mamba_pool=pool), sliding_window_size=None,
              server_args=NS(speculative_num_draft_tokens=n1))


def gdn(kernels=(Triton, Triton, Triton), flashinfer=False, ddtree=True):
    g = object.__new__(GDNAttnBackend)
    d, e, v = (k() for k in kernels)
    g.kernel_dispatcher = NS(decode_kernel=d, extend_kernel=e, verify_kernel=v, verify_kernel_is_flashinfer=flashinfer)
    if ddtree is not None:
        g.ddtree = object() if ddtree else None
    return g


def check(mr, **kw):
    rnd = DDTreeRound(NS(speculative_ddtree_budget=16), block_size=16)  # no flag beside the budget
    try:
        rnd.check_target(mr, is_hybrid=True, **kw)
        return {"ok": True, "hybrid": rnd.hybrid}
    except ValueError as e:
        return {"ok": False, "msg": str(e), "hybrid": rnd.hybrid}


out = {}
out["gdn"] = check(runner(gdn()))
out["dflash1"] = check(runner(gdn()), worker=NS(selector=None))  # the worker a 0.5.19+ series passes
out["dflash2"] = check(runner(gdn()), worker=NS(selector=object()))  # a DFlash2 drafter's candidate selector
out["domino"] = check(runner(gdn()), worker=NS(selector=None, _is_domino=True))  # 0.5.20+: a Domino drafter
if sys.argv[2] == "hybrid":  # a base whose series has patch 0004
    from sglang.srt.layers.attention.linear.kda_backend import KDAAttnBackend
    from sglang.srt.layers.attention.linear.lightning_backend import LightningAttentionBackend
    from sglang.srt.layers.attention.linear.short_conv_backend import ShortConvAttnBackend
    out["mamba2"] = check(runner(object.__new__(Mamba2AttnBackend)))
    out["kda"] = check(runner(object.__new__(KDAAttnBackend)))
    out["lightning"] = check(runner(object.__new__(LightningAttentionBackend)))
    out["short_conv"] = check(runner(object.__new__(ShortConvAttnBackend)))
    out["flashinfer_verify"] = check(runner(gdn((Triton, Triton, FlashInfer), flashinfer=True)))
    out["flashinfer_decode"] = check(runner(gdn((FlashInfer, Triton, Triton))))
    out["replayssm"] = check(runner(gdn(), pool=NS(enable_linear_replayssm=False, enable_linear_replayssm_spec=True,
                                                   mamba_cache=cache())))
    out["replayssm_decode"] = check(runner(gdn(), pool=NS(enable_linear_replayssm=True,
                                                          enable_linear_replayssm_spec=False, mamba_cache=cache())))
    out["dedup_window"] = check(runner(gdn(), c=cache(dedup=True)))
    out["page_major"] = check(runner(gdn(), c=cache(strided=True)))
    out["not_built"] = check(runner(gdn(ddtree=False)))
    out["no_intermediate"] = check(runner(gdn(), c=NS(**{**vars(cache()), "intermediate_ssm": None})))
else:
    out["gdn_unpatched"] = check(runner(gdn(ddtree=None)))
print("RESULT" + json.dumps(out))
'''
#: The bases the refusals run on: every hybrid base, and 0.5.16 (no hybrid patch: it keeps refusing hybrids).
REFUSAL_BASES = (*with_trait("hybrid"), "0.5.16")


def cpu_scripts(version: str) -> tuple:
    """The CPU scripts of one base's batch (conftest.py's v2_scripts_for): CPU_SCRIPTS, and the refusals where they
    run."""
    if version not in REFUSAL_BASES:
        return CPU_SCRIPTS
    return (*CPU_SCRIPTS, ("refusals", REFUSALS_SCRIPT, (version, "hybrid" if TRAITS[version].hybrid else "plain")))

_BATCH = r'''
import json, runpy, sys, traceback
for name, path, argv in json.loads(sys.argv[1]):
    print("SCRIPT " + name, flush=True)
    sys.argv = [path, *argv]
    try:
        runpy.run_path(path, run_name="__main__")
    except BaseException:
        print("SCRIPTERROR " + json.dumps(traceback.format_exc()), flush=True)
'''


def run_scripts(tree: Path, work: Path, scripts=CPU_SCRIPTS) -> dict:
    """Run several scripts in one subprocess (importing SGLang once: seconds per base saved per script), each in its
    own namespace. Returns name -> its RESULT dict, or the text of why it has none (its traceback, or the
    subprocess's output when it died), so one script's failure fails only the tests that read it."""
    plan = []
    for name, code, argv in scripts:
        path = work / f"script_{name}.py"  # not flashinfer.py: it would shadow the package (0.5.22 imports it)
        path.write_text(code)
        plan.append((name, str(path), list(argv)))
    r = run_python(tree, work, _BATCH, json.dumps(plan))
    out: dict = {}
    name = None
    for line in r.stdout.splitlines():
        if line.startswith("SCRIPT "):
            name = line[len("SCRIPT "):]
            out[name] = "no RESULT line"
        elif name and line.startswith("RESULT"):
            out[name] = json.loads(line[len("RESULT"):])
        elif name and line.startswith("SCRIPTERROR "):
            out[name] = json.loads(line[len("SCRIPTERROR "):])
    for name, _, _ in scripts:
        if not isinstance(out.get(name), dict):
            out[name] = f"{out.get(name, 'never started')}\nrc={r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    return out


def script_result(results: dict, name: str) -> dict:
    """One script's RESULT from ``run_scripts`` (a clear assertion with its traceback or output if it has none)."""
    got = results[name]
    assert isinstance(got, dict), f"{name}: {got}"
    return got
