#!/usr/bin/env python3
"""Stand-in for the ``llama-server`` binary, for running llama.cpp's own server test suite
(tools/server/tests) against ``pyllama serve``: set ``LLAMA_SERVER_BIN_PATH`` to this file.

The suite's ``ServerProcess.start`` (tests/utils.py) runs ``$LLAMA_SERVER_BIN_PATH <flags>``
with llama-server's flags. This script rewrites only what must be rewritten and then
``exec``s ``python -m pyllama serve <flags>`` (same process id, so the suite's terminate /
kill reach the server itself). Everything else is passed through untouched, so a flag that
pyllama serve does not know makes pyllama serve refuse to start: that is a finding, not
something to hide.

What is rewritten
-----------------
Models (the suite's presets download from Hugging Face, which is not reachable here):
  ``--hf-repo/-hf/-hfr R``, ``--hf-file/-hff F``, ``--model-url/-mu U`` are replaced by
  ``-m <SmolLM2-135M-Instruct>`` (``pyllama._models.smollm2_path()``, or
  ``$PYLLAMA_SHIM_MODEL``) **only** when they name one of the tiny text-generation test
  models of the presets (see ``TEXT_GEN_TEST_MODELS``): ``ggml-org/test-model-stories260K``
  (preset ``tinyllama2``), ``ggml-org/models`` + ``tinyllamas/stories260K.gguf`` (the
  ServerProcess default), ``ggml-org/test-model-stories260K-infill`` (preset
  ``tinyllama_infill``) and ``ggml-org/stories15M_MOE`` (preset ``stories15m_moe``).
  The substitution changes the model, so every test that checks model-specific output
  (generated text, token counts, BOS id ...) is expected to fail on it.
  NOT mapped, passed through unchanged (pyllama serve then refuses ``--hf-repo``):
  embedding / reranking / vision presets (bert-bge-small, jina-reranker, tinygemma3 with
  its mmproj), the split-GGUF loading test (tinyllamas/split/...: substituting a single
  file would not test split loading), and the real models of the slow tests (Phi-3.5,
  Llama-3.1-8B, Qwen ...).
  ``-m/--model PATH`` is passed through as given.

Dropped because they cannot change what the server does here:
  ``--offline``  -- "do not download": pyllama serve never downloads anything.

``--no-jinja`` is passed on: pyllama serve renders the built-in format the template matches.

Everything else (``--tags``, ``--cors-origins``, ``--reasoning``, ``--media-path``,
``--ui-mcp-proxy``, ``--backend_sampling``, ``--tools``, ``--models-dir`` ...) is passed
through as is. Environment variables (``LLAMA_ARG_*``) are not translated.

Environment
-----------
PYLLAMA_SHIM_MODEL          model file to use instead of SmolLM2 (default: the SmolLM2 path)
PYLLAMA_SHIM_PYTHON         interpreter that runs ``-m pyllama`` (default: this one if it can
                            import pyllama, else the repository's .venv/bin/python)
PYLLAMA_SHIM_DRY_RUN        1: print the pyllama command line and exit 0
"""

from __future__ import annotations

import os
import shlex
import sys

# (repo, file) of the text-generation presets; file None: the repo's default file
TEXT_GEN_TEST_MODELS = {
    ("ggml-org/test-model-stories260K", None),
    ("ggml-org/models", "tinyllamas/stories260K.gguf"),
    ("ggml-org/test-model-stories260K-infill", None),
    ("ggml-org/stories15M_MOE", "stories15M_MOE-F16.gguf"),
    ("ggml-org/stories15M_MOE", None),
}

HF_REPO_FLAGS = {"--hf-repo", "-hf", "-hfr"}
HF_FILE_FLAGS = {"--hf-file", "-hff"}
MODEL_URL_FLAGS = {"--model-url", "-mu"}


def _python() -> str:
    """The interpreter for ``-m pyllama``: $PYLLAMA_SHIM_PYTHON, this one when it has pyllama,
    else the repository's virtualenv (the shim may be started by a plain ``python3``)."""
    py = os.environ.get("PYLLAMA_SHIM_PYTHON")
    if py:
        return py
    import importlib.util

    if importlib.util.find_spec("pyllama") is not None:
        return sys.executable
    venv = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".venv", "bin", "python")
    return venv if os.path.exists(venv) else sys.executable


def _smollm2(python: str) -> str:
    path = os.environ.get("PYLLAMA_SHIM_MODEL")
    if path:
        return path
    if python == sys.executable:
        from pyllama import _models

        return str(_models.smollm2_path())
    import subprocess

    return subprocess.run([python, "-c", "from pyllama import _models; print(_models.smollm2_path())"],
                          check=True, capture_output=True, text=True).stdout.strip()


def _url_names_test_model(url: str) -> bool:
    # https://huggingface.co/<repo>/resolve/main/<file>
    for repo, file in TEXT_GEN_TEST_MODELS:
        if file is not None and f"/{repo}/" in url and url.endswith("/" + file):
            return True
    return False


def translate(argv: list[str], python: str = sys.executable) -> tuple[list[str], list[str]]:
    """llama-server argv (without argv[0]) -> (pyllama serve argv, notes on what changed)."""
    out: list[str] = []
    notes: list[str] = []
    hf_repo = hf_file = model_url = None
    model_flags: list[str] = []  # the original model flags, kept in order for pass-through
    i = 0
    while i < len(argv):
        a = argv[i]
        flag, eq, inline = a.partition("=") if a.startswith("--") else (a, "", "")
        takes_value = flag in HF_REPO_FLAGS | HF_FILE_FLAGS | MODEL_URL_FLAGS
        if takes_value:
            if eq:
                value = inline
                i += 1
            else:
                value = argv[i + 1] if i + 1 < len(argv) else ""
                i += 2
            model_flags += [flag, value]
            if flag in HF_REPO_FLAGS:
                hf_repo = value
            elif flag in HF_FILE_FLAGS:
                hf_file = value
            else:
                model_url = value
            continue
        if a == "--offline":
            notes.append("dropped --offline (pyllama serve never downloads)")
            i += 1
            continue
        out.append(a)
        i += 1

    if model_flags:
        repo = hf_repo.split(":", 1)[0] if hf_repo else None  # "repo:quant" -> repo
        mapped = False
        if repo is not None and (repo, hf_file) in TEXT_GEN_TEST_MODELS:
            mapped = True
        elif model_url is not None and _url_names_test_model(model_url):
            mapped = True
        if mapped:
            path = _smollm2(python)
            out = ["-m", path] + out
            notes.append(f"mapped {' '.join(model_flags)} -> -m {path}")
        else:
            out = model_flags + out
            notes.append(f"passed through {' '.join(model_flags)} (not a text-generation test model)")
    return out, notes


def main() -> None:
    python = _python()
    args, notes = translate(sys.argv[1:], python)
    cmd = [python, "-m", "pyllama", "serve", *args]
    for n in notes:
        print(f"llama_server_shim: {n}", file=sys.stderr)
    print(f"llama_server_shim: exec {shlex.join(cmd)}", file=sys.stderr, flush=True)
    if os.environ.get("PYLLAMA_SHIM_DRY_RUN", "0") not in ("", "0"):
        return
    sys.stdout.flush()
    os.execv(python, cmd)


if __name__ == "__main__":
    main()
