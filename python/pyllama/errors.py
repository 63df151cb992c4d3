"""The exception hierarchy: everything pyllama raises on purpose derives from PyllamaError."""

from ._core import GGUFError, LoadCancelled, PyllamaError, StateError, UnsupportedModelError


class InvalidBatchError(PyllamaError, ValueError):
    """A batch that llama_decode would reject with -1 (bad token, seq_id or position)."""


class ContextFullError(PyllamaError):
    """No KV-cache slot for the batch (llama_decode would return 1); the cache is unchanged."""


class Aborted(PyllamaError):
    """The abort callback stopped llama_decode (it would return 2). The KV cache keeps the
    first ``n_done`` of the batch's ``n_ubatches`` micro-batches."""

    n_done: int = 0
    n_ubatches: int = 0


class DecodeError(PyllamaError, RuntimeError):
    """A fatal error inside the forward pass (llama_decode would return ``code``, < -1):
    the last decode left no outputs, and the KV cache keeps the micro-batches finished
    before the failing one. The underlying error is the ``__cause__``."""

    code: int = -3


# Shown and pickled as pyllama.<Name>, where users import them from (the Rust-defined
# ones above say the same).
for _cls in (InvalidBatchError, ContextFullError, Aborted, DecodeError):
    _cls.__module__ = "pyllama"
del _cls

__all__ = [
    "Aborted",
    "ContextFullError",
    "DecodeError",
    "GGUFError",
    "InvalidBatchError",
    "LoadCancelled",
    "PyllamaError",
    "StateError",
    "UnsupportedModelError",
]
