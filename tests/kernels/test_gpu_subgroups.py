"""Subgroup reductions in the GPU kernels (issue 17: "subgroup operations where the adapter
has them, a fallback where it does not"): where the adapter offers wgpu's SUBGROUP feature
(lavapipe does, subgroups of 8) the device is opened with it and the matrix-vector and
attention kernels reduce with subgroupAdd / subgroupMax; PYLLAMA_GPU_SUBGROUPS=0 keeps the
workgroup-memory tree. Both variants run the same tiny models against the CPU path with
test_gpu.py's tolerances (float models: mean |diff| <= 0.03, p99 <= 0.15; quantized
weights: 0.15 / 0.6), over a prompt and single-token steps (the matrix-vector kernel) and a
seq_rm re-decode, and against each other: another float summation order only (measured on
lavapipe: max |diff| 1.2e-4, mean 1.3e-5 on tiny-llama-F32, whose f16 cache rounding passes
last-bit differences on; <= 6e-5 / 3e-6 on the others). The test holds them to 1e-3 / 1e-4.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_gpu import _need_gpu
from test_gpu_kv import _close, _run
from test_logits import tiny_path

from pyllama import _core, gpu

CASES = [("tiny-llama-F32", "f16"), ("tiny-llama-Q8_0", "f16"), ("tiny-gemma2-F32", "f16"),
         ("tiny-qwen3-F32", "q8_0")]


def _adapter() -> dict:
    _need_gpu()
    return gpu.usable(allow_software=True)[0]


def _logits(monkeypatch, name, ctype, subgroups: bool):
    monkeypatch.setenv("PYLLAMA_GPU_SUBGROUPS", "1" if subgroups else "0")
    m = _core.Model([str(tiny_path(name))], n_gpu_layers=99, gpu_allow_software=True)
    got, ctx = _run(m, "steps", type_k=ctype, type_v=ctype)
    assert ctx.kv_gpu_bytes() > 0
    return got, m.offload


def test_adapter_reports_subgroups(monkeypatch):
    a = _adapter()
    if not a["subgroups"]:
        pytest.skip(f"adapter {a['name']} offers no subgroup operations")
    lo, hi = a["subgroup_sizes"]
    assert 1 <= lo <= hi <= 128, a
    assert a["subgroups_used"]
    monkeypatch.setenv("PYLLAMA_GPU_SUBGROUPS", "0")
    assert not gpu.usable(allow_software=True)[0]["subgroups_used"]


@pytest.mark.parametrize("name,ctype", CASES, ids=[f"{n}-{c}" for n, c in CASES])
def test_subgroup_and_fallback_reductions_match_cpu(monkeypatch, name, ctype):
    a = _adapter()
    want, _ = _run(_core.Model([str(tiny_path(name))]), "steps", type_k=ctype, type_v=ctype)
    tol = (0.03, 0.15) if name.endswith("F32") else (0.15, 0.6)
    fb, desc = _logits(monkeypatch, name, ctype, subgroups=False)
    assert "workgroup-memory reductions" in desc, desc
    _close(want, fb, f"{name} workgroup-memory reductions vs CPU", tol)
    if not a["subgroups"]:
        assert "no subgroup operations" in desc, desc
        return
    sg, desc = _logits(monkeypatch, name, ctype, subgroups=True)
    assert "subgroup reductions" in desc, desc
    _close(want, sg, f"{name} subgroup reductions vs CPU", tol)
    # the two variants: the same arithmetic summed in another order
    d = np.abs(sg - fb)
    print(f"{name}: subgroup vs workgroup-memory reductions: max |diff| {d.max():.2e} mean {d.mean():.2e}")
    assert d.max() <= 1e-3 and d.mean() <= 1e-4, (float(d.max()), float(d.mean()))
    assert not np.array_equal(sg, fb), "identical logits: did the subgroup kernels run?"
