"""`pyllama info`: what it reports must be what the extension actually chose and what the
environment actually says."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pyllama import _core


def _info(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    e = dict(os.environ)
    for k in list(e):
        if k.startswith("PYLLAMA_"):
            del e[k]
    e["HF_HUB_CACHE"] = str(Path(e.get("PYLLAMA_CACHE", "/nonexistent")) / "hub")
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "pyllama", "info", *args], capture_output=True, text=True, env=e,
                          timeout=120)


def test_info_json_matches_the_extension(tmp_path):
    r = _info("--json", env={"PYLLAMA_CACHE": str(tmp_path), "HF_HUB_CACHE": str(tmp_path / "hub")})
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    import pyllama

    assert d["version"] == pyllama.__version__
    assert d["kernel_set"]["name"] == _core.kernel_set()
    feats, vnni = _core.cpu_features()
    assert d["cpu"]["features"] == dict(feats)
    assert d["extension"]["profile"] in ("release", "debug")
    import platform

    assert d["extension"]["target_arch"] == platform.machine()
    assert d["cache_dir"] == str(tmp_path)
    assert d["settings"] == {"PYLLAMA_CACHE": str(tmp_path)}  # HF_HUB_CACHE is not a PYLLAMA_ setting
    assert d["cached_models"] == []
    # the adapters the extension finds (none without the GPU backend), each named
    # (through JSON, as the command prints them: subgroup_sizes is a tuple in Python)
    assert d["gpu"]["devices"] == json.loads(json.dumps(_core.gpu_devices()))
    assert (d["gpu"]["backend"] == "wgpu") == _core.gpu_built()
    if not _core.gpu_built():
        assert d["gpu"]["devices"] == [] and "without the GPU backend" in d["gpu"]["why"]


def test_info_names_the_forced_kernel_set_and_why(tmp_path):
    r = _info("--json", env={"PYLLAMA_KERNELS": "ref", "PYLLAMA_CACHE": str(tmp_path)})
    d = json.loads(r.stdout)
    assert d["kernel_set"]["name"] == "ref"
    assert "forced by PYLLAMA_KERNELS=ref" in d["kernel_set"]["why"]
    r = _info(env={"PYLLAMA_KERNELS": "ref", "PYLLAMA_CACHE": str(tmp_path)})
    assert "kernel set: ref (forced by PYLLAMA_KERNELS=ref)" in r.stdout
    assert "setting: PYLLAMA_KERNELS=ref" in r.stdout


def test_info_flags_an_unknown_setting(tmp_path):
    r = _info(env={"PYLLAMA_KERNLES": "ref", "PYLLAMA_CACHE": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert "setting: PYLLAMA_KERNLES=ref  (not a setting pyllama reads)" in r.stdout


def test_info_lists_cached_models(tmp_path, tiny_model_path):
    import shutil

    shutil.copy(tiny_model_path("llama"), tmp_path / "m.gguf")
    size = (tmp_path / "m.gguf").stat().st_size
    d = json.loads(_info("--json", env={"PYLLAMA_CACHE": str(tmp_path), "HF_HUB_CACHE": str(tmp_path / "hub")}).stdout)
    assert d["cached_models"] == [{"name": "m.gguf", "path": str(tmp_path / "m.gguf"), "size": size, "type": "F32",
                                   "source": "pyllama"}]
    assert d["hub_cache_dir"] == str(tmp_path / "hub")


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="reads /proc/cpuinfo")
def test_info_features_agree_with_the_kernel_choice():
    feats = dict(_core.cpu_features()[0])
    kset = _core.kernel_set()
    if os.environ.get("PYLLAMA_KERNELS"):
        pytest.skip("PYLLAMA_KERNELS is set for this run")
    if kset == "avx512":
        assert all(feats[f] for f in ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512vnni", "avx2", "fma", "f16c"))
    elif kset == "avx512bw":
        assert all(feats[f] for f in ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx2", "fma", "f16c"))
        assert not feats["avx512vnni"]
    elif kset == "avx2":
        assert feats["avx2"] and feats["fma"] and feats["f16c"]
        assert not all(feats[f] for f in ("avx512f", "avx512bw", "avx512vl", "avx512dq"))


def test_info_knows_every_setting_pyllama_reads():
    """Every PYLLAMA_* variable the package or the extension reads has a line in info's
    table (else info would call it "not a setting pyllama reads")."""
    import re

    from pyllama.cli.info import SETTINGS

    root = Path(__file__).resolve().parents[2]
    read = set()
    for sub, pat in (("python/pyllama", "*.py"), ("rust/core/src", "*.rs"), ("rust/py/src", "*.rs")):
        for f in (root / sub).rglob(pat):
            read |= set(re.findall(r"PYLLAMA_[A-Z0-9_]+", f.read_text(encoding="utf-8", errors="replace")))
    assert read - set(SETTINGS) == set(), read - set(SETTINGS)
