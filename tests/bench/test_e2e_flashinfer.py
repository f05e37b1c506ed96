"""The FlashInfer proof's plumbing on CPU (#28): the driver's -fi / -fiv configurations (engine arguments, the
unproven flag read from the backends table, which baselines the report compares them with) and what
bench/e2e/fi_bundle.py keeps of the wheels it trims (on small stand-in wheels; the real ones are checked by
bench/e2e/fi_cpu_check.sh, which needs the 0.5.17 bundle and a Python 3.12 venv like the GPU image)."""
from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from bench.e2e import driver, fi_bundle

ROOT = Path(__file__).resolve().parents[2]


def _kwargs(name: str, monkeypatch, base: str = "0.5.17") -> dict:
    monkeypatch.setattr(driver, "BASE", base)
    return driver.engine_kwargs(driver.parse(name))


def test_fi_suffixes_pick_the_attention_backends(monkeypatch):
    chain = _kwargs("agree-chain-graph-fi", monkeypatch)
    assert chain["attention_backend"] == "flashinfer" and chain["speculative_draft_attention_backend"] == "flashinfer"
    assert "speculative_ddtree_allow_unproven" not in chain  # not a DDTree server: the flag would be refused
    verify_only = _kwargs("agree-ddtree-b15-fiv", monkeypatch)
    assert verify_only["attention_backend"] == "flashinfer"
    assert verify_only["speculative_draft_attention_backend"] == "triton"
    plain = _kwargs("agree-ddtree-b15-graph", monkeypatch)
    assert plain["attention_backend"] == "triton" and plain["speculative_draft_attention_backend"] == "triton"
    assert "speculative_ddtree_allow_unproven" not in plain
    assert _kwargs("agree-ar-graph-fi", monkeypatch)["attention_backend"] == "flashinfer"
    cfg = driver.parse("q8b-ddtree-b16-graph-fi-p2")
    assert (cfg["attention"], cfg["pass"], cfg["budget"], cfg["graph"]) == ("flashinfer", 2, 16, True)


def test_ddtree_on_flashinfer_gets_the_unproven_flag_while_the_table_says_so(monkeypatch):
    # the real table: FlashInfer is wired but unproven today, triton proven
    assert driver.needs_unproven("flashinfer", 1) and not driver.needs_unproven("triton", 1)
    assert _kwargs("agree-ddtree-b15-graph-fi", monkeypatch)["speculative_ddtree_allow_unproven"] is True
    assert _kwargs("q8b-ddtree-sched-graph-fiv", monkeypatch)["speculative_ddtree_allow_unproven"] is True
    # once FlashInfer is proven (its row's status), the flag goes: SGLang refuses it where it gates nothing
    monkeypatch.setattr(driver, "needs_unproven", lambda attention, page_size: False)
    assert "speculative_ddtree_allow_unproven" not in _kwargs("agree-ddtree-b15-graph-fi", monkeypatch)


def test_baselines_share_the_attention_backend():
    names = ["agree-ar", "agree-ar-graph", "agree-ar-graph-fi", "agree-chain-graph", "agree-chain-graph-fi",
             "agree-chain-fiv"]
    rs = {n: {"name": n} for n in names}

    def base(name: str, algo: str):
        got = driver.baseline(rs, driver.parse(name), algo)
        return got and got["name"]

    assert base("agree-ddtree-b15-graph-fi", "ar") == "agree-ar-graph-fi"
    assert base("agree-ddtree-b15-graph-fi", "chain") == "agree-chain-graph-fi"
    assert base("agree-ddtree-b15-graph", "chain") == "agree-chain-graph"
    assert base("agree-ddtree-b15-graph-tattn", "ar") == "agree-ar-graph"  # other suffixes: as before
    assert base("agree-ddtree-b15-fiv", "chain") == "agree-chain-fiv"
    assert base("agree-ddtree-b15-graph-fiv", "ar") == "agree-ar-graph-fi"  # no drafter in plain decoding
    assert base("agree-ddtree-b15-fi", "ar") is None  # no eager FlashInfer AR: no comparison across backends
    assert driver.attention_suffix(driver.parse("agree-chain-pgraph-fiv-p1")) == "-fiv"


def test_page_size_suffix_sets_the_page_size_and_picks_baselines_of_the_same_page_size(monkeypatch):
    cfg = driver.parse("agree-ddtree-b15-graph-fi-ps16-p2")
    assert (cfg["page_size"], cfg["pass"], cfg["attention"]) == (16, 2, "flashinfer")
    assert driver.attention_suffix(cfg) == "-fi-ps16"
    kw = _kwargs("agree-ddtree-b15-graph-ps64", monkeypatch)
    assert kw["page_size"] == 64 and kw["attention_backend"] == "triton"
    assert _kwargs("agree-ar-graph", monkeypatch)["page_size"] == 1
    # the flag follows the real table: page sizes > 1 are wired, not proven, on every backend that pages
    table = driver.backends_table()
    for name, row in table.BACKENDS.items():
        for page in (1, 16, 64):
            want = row.status == table.WIRED_UNPROVEN or (page not in row.page_sizes and row.paged_wired)
            assert driver.needs_unproven(name, page) is want
    rs = {n: {"name": n} for n in ("agree-ar-graph", "agree-ar-graph-ps16", "agree-ar-graph-fi-ps16",
                                   "agree-chain-graph-fi-ps16")}
    assert driver.baseline(rs, driver.parse("agree-ddtree-b15-graph-ps16"), "ar")["name"] == "agree-ar-graph-ps16"
    assert driver.baseline(rs, driver.parse("agree-ddtree-b15-graph-fiv-ps16"), "ar")["name"] == \
        "agree-ar-graph-fi-ps16"
    assert driver.baseline(rs, driver.parse("agree-ddtree-b15-graph-fi-ps16"), "chain")["name"] == \
        "agree-chain-graph-fi-ps16"
    assert driver.baseline(rs, driver.parse("agree-ddtree-b15-graph-ps64"), "ar") is None  # never across pages


def _wheel(path: Path, files: dict[str, str]) -> zipfile.ZipFile:
    with zipfile.ZipFile(path, "w") as z:
        for n, text in files.items():
            z.writestr(n, text)
    return zipfile.ZipFile(path)


def _fi_roots() -> dict[str, str]:
    """One file for every FI_ROOTS pattern (the trim refuses a wheel whose JIT sources moved)."""
    out = {}
    for g in fi_bundle.FI_ROOTS:
        out[fi_bundle.FI_DATA + g.replace("*", "_x.cu")] = ""
    return out


def test_flashinfer_keeps_its_code_the_include_closure_and_the_cccl_headers(tmp_path: Path):
    d = fi_bundle.FI_DATA
    files = {**_fi_roots(),
             d + "csrc/batch_prefill_x.cu": '#include <flashinfer/attention/prefill.cuh>\n#include "tvm_ffi_utils.h"\n',
             d + "include/flashinfer/attention/prefill.cuh": '#include "../utils.cuh"\n#  include <cute/tensor.hpp>\n',
             d + "include/flashinfer/utils.cuh": "#include <cuda_runtime.h>\n",  # the toolkit's: not in the wheel
             d + "cutlass/include/cute/tensor.hpp": "#include <cute/config.hpp>\n",
             d + "cutlass/include/cute/config.hpp": "",
             d + "cutlass/include/cute/unused.hpp": "",
             d + "cutlass/examples/00_basic/main.cu": "#include <cute/tensor.hpp>\n",
             d + "csrc/fused_moe/moe.cu": "#include <cute/unused.hpp>\n",  # not a root: neither it nor what it needs
             d + "cccl/libcudacxx/include/cuda/std/__type_traits/aligned_union.h": "",  # whole: the toolkit's use it
             d + "cccl/cub/cub/cub.cuh": "", d + "cccl/benchmarks/run.py": "",
             "flashinfer/__init__.py": "", "flashinfer/cute_dsl/gemm.py": "", "build_backend.py": "",
             # can never import without the CuTe DSL / cuTile: dropped, but every __init__.py stays
             "flashinfer/cute_dsl/fmha.py": "import torch\nimport cutlass.cute as cute\n",
             "flashinfer/gemm/tile.py": "from cuda.tile import kernel\n",
             "flashinfer/dsl_pkg/__init__.py": "import cutlass\n", "flashinfer/dsl_pkg/inner.py": "x = 1\n",
             "flashinfer/guarded.py": "try:\n    import cutlass\nexcept ImportError:\n    cutlass = None\n",
             "flashinfer/lazy.py": "def f():\n    import cutlass\n", "flashinfer/bindings.py": "import cuda.bindings\n",
             "flashinfer_python-0.0.dist-info/METADATA": ""}
    kept = set(fi_bundle.flashinfer_keep(_wheel(tmp_path / "fi.whl", files)))
    for n in ("include/flashinfer/attention/prefill.cuh", "include/flashinfer/utils.cuh", "cutlass/include/cute/tensor.hpp",
              "cutlass/include/cute/config.hpp", "cccl/libcudacxx/include/cuda/std/__type_traits/aligned_union.h",
              "cccl/cub/cub/cub.cuh", "csrc/tvm_ffi_utils.h"):
        assert d + n in kept, n
    for n in ("cutlass/include/cute/unused.hpp", "cutlass/examples/00_basic/main.cu", "csrc/fused_moe/moe.cu",
              "cccl/benchmarks/run.py"):
        assert d + n not in kept, n
    assert {"flashinfer/__init__.py", "flashinfer/cute_dsl/gemm.py", "flashinfer/dsl_pkg/__init__.py",
            "flashinfer/guarded.py", "flashinfer/lazy.py", "flashinfer/bindings.py"} <= kept
    assert not {"build_backend.py", "flashinfer/cute_dsl/fmha.py", "flashinfer/gemm/tile.py",
                "flashinfer/dsl_pkg/inner.py"} & kept
    with pytest.raises(SystemExit, match="JIT's sources moved"):
        fi_bundle.flashinfer_keep(_wheel(tmp_path / "moved.whl", {"flashinfer/__init__.py": ""}))


def test_transformers_keeps_configs_tokenizers_and_the_listed_models_code(tmp_path: Path):
    m = "transformers/models/"
    files = {m + "qwen3/modeling_qwen3.py": "", m + "qwen3/modular_qwen3.py": "", m + "beit/modeling_beit.py": "",
             m + "beit/configuration_beit.py": "", m + "beit/image_processing_beit.py": "", m + "beit/__init__.py": "",
             m + "bert/tokenization_bert.py": "", m + "llama/convert_llama_weights_to_hf.py": "",
             m + "auto/modeling_auto.py": "", "transformers/modeling_utils.py": ""}
    kept = set(fi_bundle.transformers_keep(_wheel(tmp_path / "tf.whl", files)))
    assert kept == {m + "qwen3/modeling_qwen3.py", m + "beit/configuration_beit.py", m + "beit/__init__.py",
                    m + "bert/tokenization_bert.py", m + "auto/modeling_auto.py", "transformers/modeling_utils.py"}


def test_jit_times_reads_the_cache(tmp_path: Path):
    ops = tmp_path / ".cache" / "flashinfer" / "0.6.15.post1" / "90a" / "cached_ops"
    for name, built in (("cascade", True), ("batch_prefill_x", False)):
        (ops / name).mkdir(parents=True)
        (ops / name / "build.ninja").write_text("")
        os.utime(ops / name / "build.ninja", (1000, 1000))
        if built:
            (ops / name / f"{name}.so").write_bytes(b"\0" * 2048)
            os.utime(ops / name / f"{name}.so", (1042.5, 1042.5))
    lines = fi_bundle.jit_times(tmp_path)
    assert lines[0].startswith("  not built") and lines[0].endswith("batch_prefill_x")
    assert lines[1].split()[:2] == ["42.5", "s"] and lines[1].endswith("0.6.15.post1/90a  cascade")
    assert lines[-1] == "2 modules, 42.5 s of JIT builds (one after another when they did not overlap)"


def test_fi_env_supplies_what_the_toolkit_lacks(tmp_path: Path):
    """bench/e2e/fi_env.sh under gpu_run.sh's `set -u`, with a toolkit that has nvcc and headers but neither an
    unversioned libcuda.so nor cuRAND's headers, and a driver library only on LD_LIBRARY_PATH."""
    cuda = tmp_path / "cuda"
    (cuda / "bin").mkdir(parents=True)
    (cuda / "bin" / "nvcc").write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.88'\n")
    (cuda / "bin" / "nvcc").chmod(0o755)
    (cuda / "include").mkdir()
    (cuda / "include" / "cuda_runtime.h").write_text("")
    (cuda / "lib64").mkdir()
    (cuda / "lib64" / "libcudart.so").write_text("")
    driver_dir = tmp_path / "driver"
    driver_dir.mkdir()
    (driver_dir / "libcuda.so.1").write_text("")
    ws = tmp_path / "ws"
    script = ('set -u; . bench/e2e/fi_env.sh > "$WS.log"; '
              'echo "$CUDA_HOME|$FLASHINFER_WORKSPACE_BASE|$FLASHINFER_NO_DOWNLOAD|$FLASHINFER_CUBIN_DIR|'
              '$FLASHINFER_EXTRA_LDFLAGS|$FLASHINFER_EXTRA_CUDAFLAGS"')
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLASHINFER_", "CUDA_HOME"))}
    env.update(PATH=f"{cuda / 'bin'}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}/usr/bin:/bin",
               LD_LIBRARY_PATH=str(driver_dir), FLASHINFER_WORKSPACE_BASE=str(ws), WS=str(tmp_path / "fi_env"))
    r = subprocess.run(["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    home, base, no_dl, cubins, ld, cuda_flags = r.stdout.strip().split("|")
    assert (home, base, no_dl, cubins) == (str(cuda), str(ws), "1", str(ws / "cubins"))
    assert ld == f"-L{ws / 'ld'}" and os.readlink(ws / "ld" / "libcuda.so") == str(driver_dir / "libcuda.so.1")
    assert not (ws / "ld" / "libcudart.so").exists()  # the toolkit has it
    assert cuda_flags == f"-isystem {ws / 'include'}"  # cuRAND headers: the nvidia wheel's, where there are any
    log = (tmp_path / "fi_env.log").read_text()
    assert log.startswith(f"flashinfer JIT: CUDA_HOME={cuda} (release 13.0, V13.0.88)")
