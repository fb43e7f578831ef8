"""utils/cpu.py: the one probe of what this CPU computes natively, as the libraries' kernels see it (their caps from
the environment applied), the one line a command starts with, and the reference numerical path; and, in make test's
portable leg, that the leg really runs on the AVX2 path."""

import logging
import os
import shutil
import subprocess
import sys

import pytest

from utils import cpu

AVX2_EPYC = frozenset("fpu sse sse2 avx avx2 fma f16c bmi2".split())  # the AVX2-only machine of issue 64
ZEN5 = AVX2_EPYC | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16", "avx512_vnni", "avx_vnni"}
SAPPHIRE_RAPIDS = ZEN5 | {"amx_bf16", "amx_tile", "amx_int8"}
SKYLAKE_X = AVX2_EPYC | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"}


@pytest.mark.parametrize(("flags", "level"), [
    (frozenset({"sse2", "avx"}), "below avx2"), (AVX2_EPYC, "avx2"), (SKYLAKE_X, "avx512"), (ZEN5, "avx512_bf16"),
    (SAPPHIRE_RAPIDS, "amx"), (AVX2_EPYC | {"avx512_bf16"}, "avx2")])  # bf16 without AVX-512 BW/VL/DQ is no level
def test_a_cpu_is_at_the_highest_level_whose_features_it_all_has(flags, level):
    assert cpu.level_of(flags) == level


def test_the_environment_caps_each_library_as_the_library_reads_it():
    native = cpu.probe({}, (ZEN5, "AMD EPYC"))
    assert (native.onednn, native.aten, native.level, native.native_bf16, native.capped) == (
        "avx512_bf16", "avx512_bf16", "avx512_bf16", True, ())
    assert native.describe() == "avx2 avx512 avx512_bf16, no amx (AMD EPYC)"
    forced = cpu.probe({"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}, (ZEN5, "AMD EPYC"))
    assert (forced.onednn, forced.aten, forced.level, forced.native_bf16) == ("avx2", "avx2", "avx2", False)
    assert forced.describe() == ("avx2 avx512 avx512_bf16, no amx (AMD EPYC); used as avx2 "
                                 "(ONEDNN_MAX_CPU_ISA=AVX2, ATEN_CPU_CAPABILITY=avx2)")
    # bfloat16 follows oneDNN (its products), not ATen's vector width
    assert cpu.probe({"ATEN_CPU_CAPABILITY": "avx2"}, (ZEN5, "")).native_bf16 is True
    assert cpu.probe({"ONEDNN_MAX_CPU_ISA": "avx512_core"}, (ZEN5, "")).native_bf16 is False  # AVX-512 without bf16
    assert cpu.probe({"DNNL_MAX_CPU_ISA": "AVX2"}, (ZEN5, "")).onednn == "avx2"  # oneDNN's older name
    # a cap above the CPU, or a value oneDNN does not cap by, changes nothing
    assert cpu.probe({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}, (AVX2_EPYC, "")).capped == ()
    assert cpu.probe({"ONEDNN_MAX_CPU_ISA": "ALL"}, (SAPPHIRE_RAPIDS, "")).onednn == "amx"
    # the AVX2 machine: no native bfloat16, and the line says so
    assert cpu.probe({}, (AVX2_EPYC, "")).describe() == "avx2, no avx512"
    unknown = cpu.probe({}, (None, ""))
    assert unknown.native_bf16 is None and unknown.level is None and "unknown" in unknown.describe()


def test_the_compute_line_gives_the_cost_of_emulated_bfloat16(monkeypatch):
    monkeypatch.setattr(cpu, "caps", lambda: cpu.probe({}, (AVX2_EPYC, "AMD EPYC")))
    line = cpu.compute_line("bfloat16")
    assert line.startswith("compute: bfloat16 on the CPU: avx2, no avx512 (AMD EPYC); bfloat16 is emulated")
    assert cpu.EMULATED_BF16 in line and "float32 (no --cpu_bf16)" in line and "\n" not in line
    assert "emulated" not in cpu.compute_line("float32")
    monkeypatch.setattr(cpu, "caps", lambda: cpu.probe({}, (ZEN5, "")))
    assert "emulated" not in cpu.compute_line("bfloat16")
    assert cpu.compute_line("bfloat16", "cuda", "NVIDIA H200") == "compute: bfloat16 on NVIDIA H200"


def test_a_model_load_says_where_and_in_what_it_computes_once(make_args, caplog, monkeypatch, fresh_say_once):
    import torch

    from utils import models

    caplog.set_level(logging.INFO)
    for _ in range(2):
        models.load_model_and_tokenizer(models.ModelSettings.from_args(make_args()), trainable=False)
    lines = [r for r in caplog.records if r.getMessage().startswith("compute: ")]
    if torch.cuda.is_available():
        assert len(lines) == 1
        return
    assert [r.getMessage() for r in lines] == [f"compute: float32 on the CPU: {cpu.caps().describe()}"]
    assert lines[0].levelno == logging.INFO
    monkeypatch.setattr(cpu, "caps", lambda: cpu.probe({}, (AVX2_EPYC, "")))
    models.say_compute(torch.bfloat16)  # --cpu_bf16 on an AVX2 machine: a warning, with the cost
    assert caplog.records[-1].levelno == logging.WARNING and cpu.EMULATED_BF16 in caplog.records[-1].getMessage()


def test_the_reference_path_is_put_in_place_and_recognised():
    environ = {"ATEN_CPU_CAPABILITY": "avx512", "PATH": "/bin"}
    assert not cpu.pinned(environ)
    changed = cpu.pin(environ)
    assert set(changed) == set(cpu.PINNED) and cpu.pinned(environ) and environ["PATH"] == "/bin"
    assert environ["ATEN_CPU_CAPABILITY"] == "avx2"  # the user's wider path is replaced: the path is the point
    assert cpu.pin(environ) == []


@pytest.mark.cpu_path
def test_the_portable_leg_runs_on_the_avx2_path():
    """make test's portable leg sets REFLECTRL_PORTABLE_LEG=1 and the reference path's variables: torch's kernels,
    oneDNN (whose bfloat16 check torch's packed product follows), NumPy and this project's probe must all take the
    AVX2 path there, whatever the CPU, or the leg would test nothing. Outside the leg: skipped."""
    if os.environ.get("REFLECTRL_PORTABLE_LEG") != "1":
        pytest.skip("only in make test's portable leg")
    import torch

    assert cpu.pinned(), {name: os.environ.get(name) for name in cpu.PINNED}
    found = cpu.caps()
    if found.native is None or found.native == "below avx2":
        pytest.skip(f"this CPU is below the AVX2 path: {found.describe()}")
    assert found.level == "avx2" and found.native_bf16 is False
    assert torch.backends.cpu.get_cpu_capability() == "AVX2"
    assert not torch.ops.mkldnn._is_mkldnn_bf16_supported()  # oneDNN's bfloat16 path is off, as on AVX2
    from numpy._core import _multiarray_umath as numpy_simd  # NumPy's own table of the features its kernels use

    assert not any(numpy_simd.__cpu_features__.get(name) for name in ("X86_V4", "AVX512_ICL", "AVX512_SPR"))


@pytest.mark.cpu_path
def test_rl_with_a_bfloat16_reflector_runs_an_iteration(make_args, tmp_path):
    """--cpu_bf16 with a reflector: the frozen reflector computes in bfloat16 with packed weights where oneDNN packs
    them, torch's product where it does not (at 4359414 this stopped with oneDNN's traceback on an AVX2 CPU)."""
    import torch

    import rl_finetune

    if torch.cuda.is_available():
        pytest.skip("the CPU's bfloat16 path")
    args = make_args(cpu_bf16=True, env="taxi", reflect=True, reflect_max_new_tokens=4, max_steps=1, save_steps=1,
                     horizon=2, per_device_eval_batch_size=2, eval_steps=0, top_k=1)
    assert args.bf16 and args.packed_weights
    assert rl_finetune.main(args) == 0


# What MKL is told of the CPU's vendor, put before libtorch's own answer (LD_PRELOAD): MKL takes one path on an Intel
# CPU and another on any other vendor's, whatever MKL_CBWR says, except on its COMPATIBLE branch.
VENDOR_SHIM = """int mkl_serv_intel_cpu_true(void) { return INTEL; }
int mkl_serv_intel_cpu(void) { return INTEL; }
"""
# Float32 products at tiny-gpt2's and SmolLM2's shapes, with their gradients: the SHA-256 of each result's bytes.
PRODUCTS = """import hashlib, torch
torch.manual_seed(0); torch.set_num_threads(1)
for m, k, n in [(1, 64, 64), (7, 64, 192), (33, 64, 256), (128, 64, 4096), (64, 576, 1536), (200, 256, 64)]:
    a, b = torch.randn(m, k, requires_grad=True), torch.randn(k, n, requires_grad=True)
    product = a @ b
    product.sum().backward()
    print(*(hashlib.sha256(t.detach().numpy().tobytes()).hexdigest() for t in (product, a.grad, b.grad)))
"""


def test_the_reference_path_gives_mkl_the_same_products_on_intel_and_on_other_cpus(tmp_path):
    """The smoke golden's weights held on every AMD CPU and moved on Intel's (CI, 2026-12-02): MKL honours MKL_CBWR=AVX2
    on Intel only. Told by a shim that the CPU is Intel's, and then that it is not, MKL must compute the reference
    path's products to the bit; the shim's effect is checked too (the branch MKL reports for AVX2 moves with it)."""
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        pytest.skip("needs a C compiler for the vendor shim")
    shims = {}
    for intel in (0, 1):
        source = tmp_path / f"intel{intel}.c"
        source.write_text(VENDOR_SHIM.replace("INTEL", str(intel)))
        shims[intel] = tmp_path / f"intel{intel}.so"
        subprocess.run([compiler, "-shared", "-fPIC", "-o", str(shims[intel]), str(source)], check=True)

    def run(intel: int, **variables: str) -> subprocess.CompletedProcess:
        env = {**os.environ, **cpu.PINNED, **variables, "LD_PRELOAD": str(shims[intel])}
        return subprocess.run([sys.executable, "-c", PRODUCTS], env=env, capture_output=True, text=True, check=True)

    branch = {intel: run(intel, MKL_VERBOSE="1", MKL_CBWR="AVX2,STRICT").stdout for intel in (0, 1)}
    assert "CNR:AVX2,STRICT" in branch[1] and "CNR:AVX2,STRICT" not in branch[0], "the shim did not reach MKL"
    assert run(0).stdout == run(1).stdout, "MKL's products on the reference path depend on the CPU's vendor"
