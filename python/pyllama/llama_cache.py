"""llama-cpp-python's prompt caches: token sequence -> saved :class:`~pyllama.llama.LlamaState`.

``Llama.set_cache(cache)`` makes every completion look up the cached state whose tokens share
the longest prefix with the prompt (and load it when that beats what the context already
holds), then store the state after the completion under prompt + completion tokens, so a
later prompt that starts the same way decodes only its new part.

- :class:`LlamaRAMCache`: states in memory, least recently used dropped past ``capacity_bytes``.
- :class:`LlamaDiskCache`: one file per state in ``cache_dir`` (pyllama's own file: a magic,
  a JSON header, the token ids, the logits and the checksummed context state; no pickle, so
  a cache directory is data, never code), oldest files removed past ``capacity_bytes``. A
  damaged file is skipped with a warning and deleted, never loaded.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
from collections import OrderedDict
from pathlib import Path
from typing import Optional, Sequence, Tuple

import numpy as np

from .generation import common_prefix

log = logging.getLogger("pyllama")

__all__ = ["BaseLlamaCache", "LlamaRAMCache", "LlamaDiskCache", "LlamaCache"]


class BaseLlamaCache:
    """Tokens -> LlamaState, looked up by longest common prefix (llama-cpp-python's API:
    ``cache[tokens]`` raises KeyError when no key shares a first token, ``tokens in
    cache``, ``cache[tokens] = state``, ``cache_size``, ``capacity_bytes``)."""

    def __init__(self, capacity_bytes: int = (2 << 30)):
        if isinstance(capacity_bytes, bool) or not isinstance(capacity_bytes, int) or capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be an int >= 0, got {capacity_bytes!r}")
        self.capacity_bytes = capacity_bytes

    @property
    def cache_size(self) -> int:
        raise NotImplementedError

    def _keys(self):
        raise NotImplementedError

    def _find_longest_prefix_key(self, key: Tuple[int, ...]) -> Optional[Tuple[int, ...]]:
        best, best_n = None, 0
        for k in self._keys():
            n = common_prefix(k, key)
            if n > best_n:
                best, best_n = k, n
        return best

    def __contains__(self, key: Sequence[int]) -> bool:
        return self._find_longest_prefix_key(tuple(int(t) for t in key)) is not None


class LlamaRAMCache(BaseLlamaCache):
    """States in memory (an OrderedDict in recency order)."""

    def __init__(self, capacity_bytes: int = (2 << 30)):
        super().__init__(capacity_bytes)
        self.cache_state: "OrderedDict[Tuple[int, ...], object]" = OrderedDict()

    @property
    def cache_size(self) -> int:
        return sum(int(s.llama_state_size) for s in self.cache_state.values())

    def _keys(self):
        return self.cache_state.keys()

    def __getitem__(self, key: Sequence[int]):
        k = self._find_longest_prefix_key(tuple(int(t) for t in key))
        if k is None:
            raise KeyError("Key not found")
        self.cache_state.move_to_end(k)
        return self.cache_state[k]

    def __setitem__(self, key: Sequence[int], value) -> None:
        k = tuple(int(t) for t in key)
        self.cache_state.pop(k, None)
        self.cache_state[k] = value
        while self.cache_size > self.capacity_bytes and self.cache_state:
            self.cache_state.popitem(last=False)


_MAGIC = b"PYLLAMA-PROMPT-CACHE\x00\x01"


class LlamaDiskCache(BaseLlamaCache):
    """States as files in ``cache_dir`` (made if missing)."""

    def __init__(self, cache_dir: str = ".cache/llama_cache", capacity_bytes: int = (2 << 30)):
        super().__init__(capacity_bytes)
        self.cache_dir = Path(cache_dir)
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self._index: dict = {}  # key -> file path
        for f in self.cache_dir.glob("*.pyllama-cache"):
            try:
                self._index[tuple(self._read(f, header_only=True))] = f
            except (OSError, ValueError) as e:
                self._drop(f, e)

    @property
    def cache_size(self) -> int:
        return sum(f.stat().st_size for f in self._index.values() if f.exists())

    def _keys(self):
        return list(self._index)

    @staticmethod
    def _drop(f: Path, why) -> None:
        log.warning("LlamaDiskCache: %s is damaged (%s); removed", f, why)
        try:
            f.unlink()
        except OSError:
            pass

    def _read(self, f: Path, header_only: bool = False):
        with open(f, "rb") as fh:
            if fh.read(len(_MAGIC)) != _MAGIC:
                raise ValueError("not a pyllama prompt-cache file")
            (n,) = struct.unpack("<Q", fh.read(8))
            if n > 1 << 26:
                raise ValueError("header too large")
            head = json.loads(fh.read(n).decode("utf-8"))
            key = head["key"]
            if not isinstance(key, list) or not all(isinstance(t, int) for t in key):
                raise ValueError("bad key")
            if header_only:
                return key
            body = fh.read()
        from .llama import LlamaState

        sizes = head["sizes"]
        if sum(sizes) != len(body) or len(sizes) != 3:
            raise ValueError(f"the file is {len(body)} bytes after its header, expected {sum(sizes)}")
        if hashlib.sha256(body).hexdigest() != head["sha256"]:
            raise ValueError("checksum mismatch")
        a, b, _ = sizes
        ids = np.frombuffer(body[:a], dtype=np.intc).copy()
        scores = np.frombuffer(body[a:a + b], dtype=np.single).reshape(head["scores_shape"]).copy()
        return LlamaState(input_ids=ids, scores=scores, n_tokens=int(head["n_tokens"]), llama_state=body[a + b:],
                          llama_state_size=len(body) - a - b, seed=int(head["seed"]))

    def __getitem__(self, key: Sequence[int]):
        want = tuple(int(t) for t in key)
        while True:  # a damaged best entry is dropped and the next best tried
            k = self._find_longest_prefix_key(want)
            if k is None:
                raise KeyError("Key not found")
            f = self._index[k]
            try:
                value = self._read(f)
            except (OSError, ValueError, KeyError) as e:
                del self._index[k]
                self._drop(f, e)
                continue
            os.utime(f)  # recency for eviction
            return value

    def __setitem__(self, key: Sequence[int], value) -> None:
        k = tuple(int(t) for t in key)
        ids = np.ascontiguousarray(value.input_ids, dtype=np.intc).tobytes()
        scores_arr = np.ascontiguousarray(value.scores, dtype=np.single)
        state = bytes(value.llama_state)[: int(value.llama_state_size)]
        body = ids + scores_arr.tobytes() + state
        head = json.dumps({"key": list(k), "n_tokens": int(value.n_tokens), "seed": int(value.seed),
                           "scores_shape": list(scores_arr.shape), "sizes": [len(ids), scores_arr.nbytes, len(state)],
                           "sha256": hashlib.sha256(body).hexdigest()}).encode("utf-8")
        name = hashlib.sha256(np.asarray(k, dtype=np.int64).tobytes()).hexdigest()[:32] + ".pyllama-cache"
        f = self.cache_dir / name
        tmp = f.with_suffix(".tmp")
        with open(tmp, "wb") as fh:
            fh.write(_MAGIC + struct.pack("<Q", len(head)) + head + body)
        os.replace(tmp, f)
        self._index[k] = f
        # oldest first until under the capacity
        while self.cache_size > self.capacity_bytes and self._index:
            old_k = min(self._index, key=lambda x: self._index[x].stat().st_mtime_ns if self._index[x].exists() else 0)
            old = self._index.pop(old_k)
            try:
                old.unlink()
            except OSError:
                pass


LlamaCache = LlamaRAMCache
