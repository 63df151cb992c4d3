"""Read-only views of a :class:`pyllama._core.VocabStore` with the list / dict interface the
vocabulary code uses (``texts[i]``, ``texts_bytes[i]``, ``text_to_id.get(s)``).

The tables themselves live in Rust, compactly: as Python lists and dicts of str and bytes
they took ~30 MiB for SmolLM2's 49k-token vocabulary (measured with tracemalloc), and about
90 MB with the metadata copy for Gemma's 262k.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence


class _Seq(Sequence):
    __slots__ = ("_store", "_n", "_get")

    def __init__(self, store, get) -> None:
        self._store = store
        self._n = len(store)
        self._get = get

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._get(j) for j in range(*i.indices(self._n))]
        return self._get(i)

    def __iter__(self) -> Iterator:
        return map(self._get, range(self._n))


class TokenTexts(_Seq):
    """``texts[i]``: token i's text as str (invalid UTF-8 via surrogateescape)."""

    __slots__ = ()

    def __init__(self, store) -> None:
        super().__init__(store, store.token_text)


class TokenBytes(_Seq):
    """``texts_bytes[i]``: token i's raw bytes."""

    __slots__ = ()

    def __init__(self, store) -> None:
        super().__init__(store, store.token_bytes)


class TokenIndex(Mapping):
    """Token text (str or bytes) -> id; for duplicate texts the later id wins (llama.cpp's
    ``token_to_id``)."""

    __slots__ = ("_store", "_id")

    def __init__(self, store) -> None:
        self._store = store
        self._id = store.id_of

    def get(self, key, default=None):
        if not isinstance(key, (str, bytes)):
            return default
        tid = self._id(key)
        return default if tid is None else tid

    def __getitem__(self, key) -> int:
        tid = self.get(key)
        if tid is None:
            raise KeyError(key)
        return tid

    def __contains__(self, key) -> bool:
        return self.get(key) is not None

    def __iter__(self) -> Iterator[str]:
        """Each distinct text once (the id it maps to is the last with that text)."""
        texts = self._store.token_text
        for i in range(len(self._store)):
            t = texts(i)
            if self._id(t) == i:
                yield t

    def __len__(self) -> int:
        return sum(1 for _ in self)
