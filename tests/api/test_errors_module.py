"""The exception classes live, for users, in ``pyllama`` (issue 18): their ``__module__`` says
so (not the private ``pyllama._core``), tracebacks print ``pyllama.GGUFError``, and they pickle
(a worker process can send one back) because pickle finds them there."""

from __future__ import annotations

import pickle

import pytest

import pyllama
from pyllama import _core

NAMES = ["PyllamaError", "GGUFError", "UnsupportedModelError", "LoadCancelled", "StateError",
         "InvalidBatchError", "ContextFullError", "Aborted", "DecodeError"]


@pytest.mark.parametrize("name", NAMES)
def test_exception_module_is_pyllama(name):
    cls = getattr(pyllama, name)
    assert cls.__module__ == "pyllama"
    assert issubclass(cls, pyllama.PyllamaError)
    e = pickle.loads(pickle.dumps(cls("why")))
    assert type(e) is cls and str(e) == "why"


def test_core_raises_the_same_classes(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 20)
    with pytest.raises(pyllama.GGUFError) as info:
        _core.Model([str(bad)])
    assert type(info.value).__module__ == "pyllama"
    assert _core.GGUFError is pyllama.GGUFError
