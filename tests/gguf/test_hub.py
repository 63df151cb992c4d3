"""Models by name, offline: ``-hf REPO[:QUANT]`` / ``--hf-file`` on the subcommands,
``Llama.from_pretrained`` and ``pyllama list`` / ``rm``, over a Hugging Face cache built
here in huggingface_hub's layout (``models--owner--name/{refs/main,snapshots/<rev>,blobs}``)
with ``HF_HUB_OFFLINE=1``: nothing is downloaded. The quant rule is llama.cpp's
(common/download.cpp find_best_model)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pyllama import hub

if not hasattr(pytest.importorskip("huggingface_hub"), "HfApi"):  # tests/llama_cpp_python's stand-in module
    pytest.skip("huggingface_hub is not installed (pip install huggingface_hub)", allow_module_level=True)

REV = "0123456789abcdef0123456789abcdef01234567"
REPO = "tiny-org/Tiny-GGUF"
SMOL_REPO = "smol-org/SmolLM2-GGUF"


def make_hub_cache(cache: Path, repo: str, files: dict, revision: str = REV) -> Path:
    """Write ``files`` ({path in repo: source file}) into ``cache`` as huggingface_hub does:
    content-addressed blobs, a snapshot of relative symlinks, refs/main -> the revision."""
    folder = cache / ("models--" + repo.replace("/", "--"))
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / "main").write_text(revision)
    snap = folder / "snapshots" / revision
    for rel, src in files.items():
        data = Path(src).read_bytes()
        blob = folder / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        if not blob.exists():
            blob.write_bytes(data)
        entry = snap / rel
        entry.parent.mkdir(parents=True, exist_ok=True)
        entry.symlink_to(os.path.relpath(blob, entry.parent))
    return snap


def link_hub_cache(cache: Path, repo: str, files: dict, revision: str = REV) -> Path:
    """As make_hub_cache, but the blob is a symlink to the source (no copy of a real model)."""
    folder = cache / ("models--" + repo.replace("/", "--"))
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / "main").write_text(revision)
    snap = folder / "snapshots" / revision
    for i, (rel, src) in enumerate(files.items()):
        blob = folder / "blobs" / f"{i:064x}"
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.symlink_to(Path(src).resolve())
        entry = snap / rel
        entry.parent.mkdir(parents=True, exist_ok=True)
        entry.symlink_to(os.path.relpath(blob, entry.parent))
    return snap


@pytest.fixture
def hub_env(tmp_path, tiny_model_path, smollm2_path):
    """A Hub cache with a tiny model under four quant names (plus an mmproj and a split
    pair) and SmolLM2 under its real quant; the environment for an offline CLI run."""
    tiny = tiny_model_path("llama")
    cache = tmp_path / "hub"
    make_hub_cache(cache, REPO, {
        "mmproj-tiny-Q4_K_M.gguf": tiny,
        "tiny-Q8_0.gguf": tiny,
        "tiny-Q4_K_M.gguf": tiny,
        "tiny-q4_1.gguf": tiny,
        "sub/tiny-F16.gguf": tiny,
        "README.md": tiny,
    })
    link_hub_cache(cache, SMOL_REPO, {"SmolLM2-135M-Instruct.Q4_1.gguf": smollm2_path})
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env.update(HF_HUB_CACHE=str(cache), HF_HOME=str(tmp_path / "hf_home"), HF_HUB_OFFLINE="1",
               PYLLAMA_CACHE=str(tmp_path / "pyllama_cache"), HF_HUB_DISABLE_TELEMETRY="1")
    return cache, env


def run(env, *args, input=None):
    return subprocess.run([sys.executable, "-m", "pyllama", *args], env=env, capture_output=True, text=True,
                          timeout=300, input=input)


# -- llama.cpp's rule, as pure functions ---------------------------------------------------

FILES = sorted(["a/model-Q8_0.gguf", "model-Q4_K_M.gguf", "model-q5_k_m.gguf", "mmproj-model-Q4_K_M.gguf",
                "big-Q6_K-00002-of-00002.gguf", "big-Q6_K-00001-of-00002.gguf", "model.imatrix.gguf",
                "README.md"])


def test_repo_tag_split():
    assert hub.split_repo_tag("owner/name") == ("owner/name", "")
    assert hub.split_repo_tag("owner/name:q4_k_m") == ("owner/name", "q4_k_m")
    for bad in ("name", "a/b/c", "/b", "a/:Q4"):
        with pytest.raises(hub.HubError, match="expected <user>/<model>"):
            hub.split_repo_tag(bad)


def test_best_model_is_llama_cpps_rule():
    assert hub.best_model(FILES, "") == "model-Q4_K_M.gguf"  # Q4_K_M first, never the mmproj
    assert hub.best_model(FILES, "Q5_K_M") == "model-q5_k_m.gguf"  # case-insensitive
    assert hub.best_model(FILES, "q8_0") == "a/model-Q8_0.gguf"
    assert hub.best_model(FILES, "Q6_K") == "big-Q6_K-00001-of-00002.gguf"  # the first part of a split
    assert hub.best_model(FILES, "Q2_K") is None  # a tag that matches nothing: no fallback
    assert hub.best_model([f for f in FILES if "Q4_K_M" not in f], "") == "a/model-Q8_0.gguf"  # then Q8_0
    assert hub.best_model(["x.gguf", "y-F16.gguf"], "") == "x.gguf"  # then the first model file
    assert hub.split_files(FILES, "big-Q6_K-00001-of-00002.gguf") == [
        "big-Q6_K-00001-of-00002.gguf", "big-Q6_K-00002-of-00002.gguf"]
    assert hub.split_info("big-Q6_K-00002-of-00002.gguf") == hub.SplitInfo("big-Q6_K", "Q6_K", 2, 2)


# -- the CLI, offline ------------------------------------------------------------------------

def test_inspect_hf_picks_the_quant(hub_env):
    cache, env = hub_env
    for arg, want in ((REPO, "tiny-Q4_K_M.gguf"), (REPO + ":q8_0", "tiny-Q8_0.gguf"),
                      (REPO + ":Q4_1", "tiny-q4_1.gguf"), (REPO + ":f16", "sub/tiny-F16.gguf")):
        r = run(env, "inspect", "-hf", arg, "--json")
        assert r.returncode == 0, r.stderr
        assert f"snapshots/{REV}/{want}" in r.stdout, (arg, r.stdout[:300])
    r = run(env, "inspect", "-hf", REPO, "--hf-file", "tiny-q4_1.gguf")
    assert r.returncode == 0 and "tiny-q4_1.gguf" in r.stdout, r.stderr


@pytest.mark.parametrize("args, code, msg", [
    (["-hf", REPO + ":Q2_K"], 1, "no GGUF file for quant 'Q2_K' in tiny-org/Tiny-GGUF; available GGUF files:"),
    (["-hf", REPO, "--hf-file", "nope.gguf"], 1, "file 'nope.gguf' not found in tiny-org/Tiny-GGUF"),
    (["-hf", "nobody/nothing"], 1, "nobody/nothing is not in the Hugging Face cache"),
    (["-hf", "nothing"], 1, "invalid Hugging Face repo 'nothing'"),
    (["--hf-file", "x.gguf"], 2, "--hf-file needs -hf"),
    (["-m", "x.gguf", "-hf", REPO], 2, "not both"),
    (["--hf-token", "t"], 2, "--hf-token is only used with -hf"),
])
def test_hf_errors_are_one_line(hub_env, args, code, msg):
    _cache, env = hub_env
    r = run(env, "generate", "-p", "x", "-n", "1", *args)
    assert r.returncode == code, r.stderr
    assert "Traceback" not in r.stderr
    flat = " ".join(c for c in r.stderr.replace("│", " ").split())
    assert msg in flat, r.stderr
    if code == 1:
        assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: "), r.stderr


def test_generate_hf_equals_generate_m(hub_env, smollm2_path):
    _cache, env = hub_env
    args = ["-p", "The capital of France is", "-n", "8", "--temp", "0", "--no-perf"]
    a = run(env, "generate", "-hf", SMOL_REPO + ":q4_1", *args)
    b = run(env, "generate", "-m", str(smollm2_path), *args)
    assert a.returncode == 0, a.stderr
    assert a.stdout == b.stdout and len(a.stdout) > len("The capital of France is")


@pytest.mark.parametrize("cmd", [["chat", "-n", "4"], ["embedding", "-p", "hi"], ["tokenize", "-p", "hi"],
                                 ["serve", "--port", "-5"], ["perplexity", "-f", "/nonexistent"]])
def test_every_model_subcommand_takes_hf(hub_env, cmd):
    """Each subcommand that loads a model resolves -hf (here to a quant that is missing, so
    the run ends with the resolver's error and not a usage error about the flag)."""
    _cache, env = hub_env
    r = run(env, *cmd[:1], "-hf", REPO + ":IQ1_S", *cmd[1:], input="")
    if cmd[0] in ("serve", "perplexity"):  # their own checks run first: a usage error, not "no such option"
        assert r.returncode == 2 and "No such option" not in r.stderr, r.stderr
    else:
        assert r.returncode == 1, r.stderr
        assert "no GGUF file for quant 'IQ1_S'" in r.stderr
    r = run(env, cmd[0], "--help")
    assert "--hf-repo" in r.stdout and "--hf-file" in r.stdout and "--hf-token" in r.stdout


def test_missing_huggingface_hub_says_what_to_install(hub_env):
    _cache, env = hub_env
    code = ("import sys; sys.modules['huggingface_hub'] = None; "
            "from pyllama.cli import app; app(['generate', '-hf', 'a/b', '-p', 'x'])")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "pip install huggingface_hub" in r.stderr and "Traceback" not in r.stderr, r.stderr
    code = ("import sys; sys.modules['huggingface_hub'] = None; from pyllama import Llama\n"
            "try:\n    Llama.from_pretrained('a/b', '*.gguf')\nexcept ImportError as e:\n    print('IE', e)")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert "IE " in r.stdout and "pip install huggingface-hub" in r.stdout, r.stdout + r.stderr


# -- Llama.from_pretrained -------------------------------------------------------------------

@pytest.fixture
def offline(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


def test_from_pretrained_glob_and_cache_dir(hub_env, offline, smollm2_path):
    from pyllama import Llama

    cache, _env = hub_env
    llm = Llama.from_pretrained(SMOL_REPO, "*Q4_1.gguf", cache_dir=str(cache), n_ctx=256, verbose=False)
    assert Path(llm.model_path).name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert str(cache) in llm.model_path
    out = llm("The capital of France is", max_tokens=4, temperature=0)["choices"][0]["text"]
    ref = Llama(str(smollm2_path), n_ctx=256, verbose=False)("The capital of France is", max_tokens=4,
                                                           temperature=0)["choices"][0]["text"]
    assert out == ref


def test_from_pretrained_matching_rules(hub_env, offline, tmp_path):
    from pyllama import Llama

    cache, _env = hub_env
    with pytest.raises(ValueError, match="Multiple files found in tiny-org/Tiny-GGUF matching tiny-Q*"):
        Llama.from_pretrained(REPO, "tiny-Q*", cache_dir=str(cache))
    with pytest.raises(ValueError, match="No file found in tiny-org/Tiny-GGUF that match nothing"):
        Llama.from_pretrained(REPO, "nothing*", cache_dir=str(cache))
    with pytest.raises(ValueError, match="No file found"):
        Llama.from_pretrained(REPO, "tiny-Q8_0.gguf", additional_files=["nope-*.gguf"], cache_dir=str(cache))
    with pytest.raises(ValueError, match="local_dir_use_symlinks"):
        Llama.from_pretrained(REPO, "tiny-Q8_0.gguf", local_dir_use_symlinks=True, cache_dir=str(cache))
    with pytest.raises(TypeError):
        Llama.from_pretrained(REPO, "tiny-Q8_0.gguf", cache_dir=str(cache), n_ctxx=5)
    # a subfolder, and additional_files fetched too (copied into local_dir)
    local = tmp_path / "local"
    hub.pretrained_path(REPO, "sub/*.gguf", ["*q4_1*"], local_dir=local, cache_dir=cache)
    assert (local / "sub" / "tiny-F16.gguf").is_file() and (local / "tiny-q4_1.gguf").is_file()
    assert not (local / "tiny-q4_1.gguf").is_symlink()


# -- pyllama list / rm -----------------------------------------------------------------------

def test_list_and_rm(hub_env, smollm2_path):
    cache, env = hub_env
    pc = Path(env["PYLLAMA_CACHE"])
    pc.mkdir()
    (pc / "SmolLM2-135M-Instruct.Q4_1.gguf").symlink_to(smollm2_path)
    r = run(env, "list")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split()[:4] == ["NAME", "TYPE", "SIZE", "MODIFIED"]
    rows = {ln.split()[0]: ln.split() for ln in lines[1:]}
    assert set(rows) == {"SmolLM2-135M-Instruct.Q4_1.gguf", f"{SMOL_REPO}:Q4_1", f"{REPO}:Q4_K_M",
                         f"{REPO}:Q8_0", f"{REPO}:Q4_1", f"{REPO}:F16"}  # no mmproj, no README
    assert rows[f"{SMOL_REPO}:Q4_1"][1] == "Q4_1"  # the GGUF's general.file_type
    assert rows[f"{REPO}:Q8_0"][1] == "F32"  # the tiny model is F32 whatever its name says
    assert rows[f"{SMOL_REPO}:Q4_1"][2:4] == ["98", "MB"]

    r = run(env, "rm", REPO)  # four models in that repo
    assert r.returncode == 1 and "ambiguous" in r.stderr and f"{REPO}:Q8_0" in r.stderr, r.stderr
    r = run(env, "rm", "no/such:Q4_0")
    assert r.returncode == 1 and "no cached model named 'no/such:Q4_0'" in r.stderr, r.stderr
    blobs = set((cache / "models--tiny-org--Tiny-GGUF" / "blobs").iterdir())
    r = run(env, "rm", f"{REPO}:q8_0", f"{REPO}:Q4_1")
    assert r.returncode == 0, r.stderr
    assert f"deleted '{REPO}:Q8_0'" in r.stdout
    snap = cache / "models--tiny-org--Tiny-GGUF" / "snapshots" / REV
    assert not (snap / "tiny-Q8_0.gguf").exists() and (snap / "tiny-Q4_K_M.gguf").exists()
    assert set((cache / "models--tiny-org--Tiny-GGUF" / "blobs").iterdir()) == blobs  # still linked by the rest
    r = run(env, "rm", f"{REPO}:Q4_K_M", f"{REPO}:F16", f"{SMOL_REPO}:Q4_1", "SmolLM2-135M-Instruct.Q4_1")
    assert r.returncode == 0, r.stderr
    assert (cache / "models--tiny-org--Tiny-GGUF" / "snapshots" / REV / "mmproj-tiny-Q4_K_M.gguf").exists()
    assert not (cache / "models--smol-org--SmolLM2-GGUF").exists()  # nothing left: the repo folder goes
    assert smollm2_path.is_file()  # only the cache entries were removed
    assert not (pc / "SmolLM2-135M-Instruct.Q4_1.gguf").exists()
    r = run(env, "list")
    assert r.returncode == 0 and r.stdout.splitlines()[1:] == [], r.stdout


def test_bench_hf(hub_env, smollm2_path):
    _cache, env = hub_env
    r = run(env, "bench", "-hf", SMOL_REPO, "-p", "4", "-n", "0", "-r", "1", "-t", "1", "-o", "jsonl")
    assert r.returncode == 0, r.stderr
    import json

    row = json.loads(r.stdout)
    assert row["model_filename"].endswith(f"snapshots/{REV}/SmolLM2-135M-Instruct.Q4_1.gguf")
    r = run(env, "bench", "-p", "4")
    assert r.returncode == 2 and "-hf" in r.stderr
    link_hub_cache(_cache, "smol-org/Two", {"a-Q4_K_M.gguf": smollm2_path, "b-Q8_0.gguf": smollm2_path})
    r = run(env, "bench", "-hf", f"smol-org/Two,{SMOL_REPO}", "-hff", "b-Q8_0.gguf", "-p", "4", "-n", "0", "-r", "1",
            "-t", "1", "-o", "jsonl")
    assert r.returncode == 0, r.stderr
    assert [json.loads(x)["model_filename"].rsplit("/", 1)[1] for x in r.stdout.splitlines()] == [
        "b-Q8_0.gguf", "SmolLM2-135M-Instruct.Q4_1.gguf"]  # -hff pairs with the first -hf (else a-Q4_K_M)
    r = run(env, "bench", "-hf", REPO, "-hff", "a.gguf,b.gguf", "-p", "4")
    assert r.returncode == 2 and "2 --hf-file values for 1 -hf repos" in " ".join(r.stderr.split())


@pytest.mark.parametrize("cmd", ["generate", "chat", "serve", "embedding", "perplexity", "bench", "tokenize",
                                 "inspect", "verify"])
def test_hf_flags_in_every_help(cmd):
    from typer.testing import CliRunner

    from pyllama.cli import app

    out = CliRunner().invoke(app, [cmd, "--help"]).stdout
    for flag in ("-hf", "--hf-repo", "-hff", "--hf-file", "-hft", "--hf-token"):
        assert flag in out, (cmd, flag)


# -- the download path, against a local stand-in for the Hub (HF_ENDPOINT) ------------------

def _fake_hub(files: dict, seen: list, status: int = 200):
    """Serves huggingface_hub's calls for repo o/r: the tree listing, HEAD and GET of
    /o/r/resolve/main/<file> (plain HTTP, no Xet); every request is recorded with its
    Authorization header. ``status`` != 200 answers everything with that code."""
    import hashlib
    import http.server
    import json
    import threading

    class H(http.server.BaseHTTPRequestHandler):
        def _send(self, code, body=b"", headers=()):
            self.send_response(code)
            for k, v in headers:
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_GET(self):
            seen.append((self.command, self.path, self.headers.get("Authorization")))
            if status != 200:
                return self._send(status)
            if self.path.startswith("/api/models/o/r/tree/"):
                body = json.dumps([{"type": "file", "path": p, "size": len(b), "oid": hashlib.sha1(b).hexdigest()}
                                   for p, b in files.items()]).encode()
                return self._send(200, body, [("Content-Type", "application/json")])
            if self.path.startswith("/o/r/resolve/main/"):
                b = files.get(self.path.split("/resolve/main/", 1)[1])
                if b is None:
                    return self._send(404, b"", [("X-Error-Code", "EntryNotFound")])
                return self._send(200, b, [("ETag", f'"{hashlib.sha256(b).hexdigest()}"'), ("X-Repo-Commit", "f" * 40),
                                           ("Content-Type", "application/octet-stream")])
            return self._send(404)

        do_HEAD = do_GET

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def test_hf_downloads_into_the_hub_cache(tmp_path, tiny_model_path):
    tiny = Path(tiny_model_path("llama")).read_bytes()
    seen: list = []
    srv = _fake_hub({"tiny-Q8_0.gguf": tiny, "tiny-Q4_K_M.gguf": tiny, "README.md": b"hi"}, seen)
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
        env.update(HF_HUB_CACHE=str(tmp_path / "hub"), HF_HOME=str(tmp_path / "home"), HF_HUB_DISABLE_XET="1",
                   HF_ENDPOINT=f"http://127.0.0.1:{srv.server_address[1]}", HF_HUB_DISABLE_TELEMETRY="1",
                   PYLLAMA_CACHE=str(tmp_path / "pc"))
        r = run(env, "inspect", "-hf", "o/r", "--hf-token", "hf_secret")
        assert r.returncode == 0, r.stderr
        snap = tmp_path / "hub" / "models--o--r" / "snapshots" / ("f" * 40)
        assert f"{snap}/tiny-Q4_K_M.gguf" in r.stdout
        assert (tmp_path / "hub" / "models--o--r" / "refs" / "main").read_text() == "f" * 40
        assert [s[:2] for s in seen] == [("GET", "/api/models/o/r/tree/main?recursive=true&expand=false"),
                                         ("HEAD", "/o/r/resolve/main/tiny-Q4_K_M.gguf"),
                                         ("GET", "/o/r/resolve/main/tiny-Q4_K_M.gguf")]
        assert {s[2] for s in seen} == {"Bearer hf_secret"}  # --hf-token on every request
        assert not (snap / "tiny-Q8_0.gguf").exists()  # only the chosen file
    finally:
        srv.shutdown()
        srv.server_close()
    # offline now: the same name resolves from the cache, and list shows it
    env["HF_HUB_OFFLINE"] = "1"
    r = run(env, "inspect", "-hf", "o/r:Q4_K_M")
    assert r.returncode == 0 and f"{snap}/tiny-Q4_K_M.gguf" in r.stdout, r.stderr
    r = run(env, "list")
    assert [ln.split()[0] for ln in r.stdout.splitlines()[1:]] == ["o/r:Q4_K_M"]


def test_an_unusable_hub_falls_back_to_the_cache(hub_env):
    """A Hub that answers 400 to everything (no retries): the cached snapshot's files are
    listed and used, as with no network; HF_TOKEN is what huggingface_hub sends."""
    cache, env = hub_env
    seen: list = []
    srv = _fake_hub({}, seen, status=400)
    try:
        env = {**env, "HF_ENDPOINT": f"http://127.0.0.1:{srv.server_address[1]}", "HF_TOKEN": "hf_env"}
        del env["HF_HUB_OFFLINE"]
        r = run(env, "inspect", "-hf", REPO + ":q4_1")
        assert r.returncode == 0 and "tiny-q4_1.gguf" in r.stdout, r.stderr
        assert seen and {s[2] for s in seen} == {"Bearer hf_env"}
    finally:
        srv.shutdown()
        srv.server_close()
