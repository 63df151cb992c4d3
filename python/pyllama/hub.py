"""Models by name: Hugging Face Hub repositories and the local model caches.

- ``-hf REPO[:QUANT]`` / ``--hf-file FILE`` (every CLI subcommand that loads a model):
  llama.cpp's rule (common/download.cpp ``common_download_get_hf_plan``) for which GGUF of a
  repository to use, fetched through ``huggingface_hub`` into its cache, with its progress
  bars and its token (``HF_TOKEN``, ``hf auth login``, or ``--hf-token``).
- :func:`pretrained_path`: ``Llama.from_pretrained``'s file matching (llama-cpp-python
  0.3.36: a glob that must match exactly one file, ``additional_files`` for split parts).
- :func:`cached_models` / :func:`remove_model`: ``pyllama list`` / ``pyllama rm`` over the
  pyllama model cache (:func:`pyllama._models.cache_dir`) and the Hub cache. These read the
  cache layout directly (``models--owner--name/{refs,snapshots,blobs}``), so they work
  without ``huggingface_hub`` installed.

Offline (``HF_HUB_OFFLINE=1``, or no network) the repository's file list comes from the
cached snapshot, as llama.cpp does, and the files from the cache.
"""

from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from .errors import PyllamaError

INSTALL_HINT = "pip install huggingface_hub"
DEFAULT_TAGS = ("Q4_K_M", "Q8_0")  # llama.cpp's find_best_model, when no quant is given


class HubError(PyllamaError):
    """A model could not be found or fetched by name (the message says why and what to do)."""


def _hub():
    try:
        import huggingface_hub
    except ImportError:
        raise HubError(f"models from the Hugging Face Hub need the huggingface_hub package: {INSTALL_HINT} "
                       "(or pip install 'pyllama-gguf[hf]')") from None
    return huggingface_hub


def hub_cache_dir() -> Path:
    """The Hub cache: huggingface_hub's own setting when installed, else the same rules
    (HF_HUB_CACHE, HUGGINGFACE_HUB_CACHE, HF_HOME/hub, XDG_CACHE_HOME/huggingface/hub)."""
    try:
        from huggingface_hub import constants

        return Path(constants.HF_HUB_CACHE)
    except ImportError:
        pass
    env = os.environ
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
                                              "huggingface")
    hub = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE") or os.path.join(os.path.expanduser(home), "hub")
    return Path(os.path.expanduser(os.path.expandvars(hub)))


def _offline() -> bool:
    try:
        from huggingface_hub import constants

        return bool(constants.HF_HUB_OFFLINE)
    except ImportError:
        return os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")


# -- llama.cpp's -hf REPO[:QUANT] rule -------------------------------------------------------

def split_repo_tag(value: str) -> tuple[str, str]:
    """``owner/name[:quant]`` -> (repo, tag); llama.cpp's common_download_split_repo_tag."""
    parts = value.split(":")
    tag = parts[-1] if len(parts) > 1 else ""
    repo = parts[0]
    if len(repo.split("/")) != 2 or not all(repo.split("/")):
        raise HubError(f"invalid Hugging Face repo {value!r}: expected <user>/<model>[:quant]")
    return repo, tag


_SPLIT_RE = re.compile(r"^(.+)-([0-9]{5})-of-([0-9]{5})$", re.I)
_TAG_RE = re.compile(r"[-.]([A-Z0-9_]+)$", re.I)


@dataclass
class SplitInfo:
    prefix: str = ""
    tag: str = ""
    index: int = 0
    count: int = 0


def split_info(path: str) -> SplitInfo:
    """llama.cpp's get_gguf_split_info: ``name-Q4_K_M-00001-of-00003.gguf`` ->
    (prefix ``name-Q4_K_M``, tag ``Q4_K_M``, 1, 3); an empty SplitInfo for a non-.gguf name."""
    if not path.endswith(".gguf"):
        return SplitInfo()
    prefix = path[:-5]
    index = count = 1
    m = _SPLIT_RE.match(prefix)
    if m:
        prefix, index, count = m[1], int(m[2]), int(m[3])
    t = _TAG_RE.search(prefix)
    return SplitInfo(prefix, t[1].upper() if t else "", index, count)


def is_model_file(path: str) -> bool:
    """llama.cpp's gguf_filename_is_model: a .gguf that is not a projector, imatrix or
    speculative-decoding sidecar."""
    if not path.endswith(".gguf"):
        return False
    name = path.rsplit("/", 1)[-1]
    return not any(k in name for k in ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-"))


def best_model(files: list[str], tag: str) -> Optional[str]:
    """llama.cpp's find_best_model: the first model file whose path contains ``TAG.`` or
    ``TAG-`` (case-insensitive; the first part of a split model), trying Q4_K_M then Q8_0
    when no tag is given and then the first model file. None when nothing matches."""
    for t in ([tag] if tag else list(DEFAULT_TAGS)):
        pat = re.compile(re.escape(t) + "[.-]", re.I)
        for f in files:
            if is_model_file(f) and pat.search(f):
                s = split_info(f)
                if s.count > 1 and s.index != 1:
                    continue
                return f
    if not tag:
        for f in files:
            if is_model_file(f):
                s = split_info(f)
                if s.count > 1 and s.index != 1:
                    continue
                return f
    return None


def split_files(files: list[str], primary: str) -> list[str]:
    """All parts of the split model ``primary`` belongs to (just ``primary`` if not split)."""
    s = split_info(primary)
    if s.count <= 1:
        return [primary]
    return [f for f in files if (lambda o: o.count == s.count and o.prefix == s.prefix)(split_info(f))]


# -- the repository's file list: the Hub, or the cached snapshot -----------------------------

def _repo_folder(cache: Path, repo: str) -> Path:
    return cache / ("models--" + repo.replace("/", "--"))


def _snapshot_dir(cache: Path, repo: str, revision: Optional[str]) -> Optional[Path]:
    folder = _repo_folder(cache, repo)
    rev = revision or "main"
    ref = folder / "refs" / rev
    commit = ref.read_text().strip() if ref.is_file() else rev
    snap = folder / "snapshots" / commit
    return snap if snap.is_dir() else None


def _walk(root: Path) -> list[str]:
    out = []
    for dirpath, _dirs, names in os.walk(root):
        for n in names:
            out.append(Path(dirpath, n).relative_to(root).as_posix())
    return sorted(out)


def repo_files(repo: str, *, revision: Optional[str] = None, cache_dir: Optional[str | os.PathLike] = None,
               token: Optional[str] = None) -> list[str]:
    """Paths of the files in ``repo`` (sorted): from the Hub, or, offline or when the Hub
    cannot be reached, from the cached snapshot (as llama.cpp does)."""
    hub = _hub()
    from huggingface_hub import errors as herr

    cache = Path(cache_dir) if cache_dir is not None else hub_cache_dir()
    why = "HF_HUB_OFFLINE is set"
    if not _offline():
        try:
            return sorted(hub.HfApi(token=token).list_repo_files(repo, revision=revision))
        except herr.GatedRepoError:
            raise HubError(f"{repo} is a gated repository: accept its terms on huggingface.co and log in "
                           "(hf auth login, or set HF_TOKEN / --hf-token)") from None
        except herr.RepositoryNotFoundError:
            raise HubError(f"Hugging Face repository {repo} not found (if it is private, set HF_TOKEN "
                           "or pass --hf-token)") from None
        except herr.RevisionNotFoundError:
            raise HubError(f"{repo}: revision {revision!r} not found") from None
        except herr.HFValidationError as e:
            raise HubError(f"invalid Hugging Face repo {repo!r}: {e}") from None
        except Exception as e:  # no network, proxy, DNS, 5xx: use what is cached
            why = f"the Hub could not be reached ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
    snap = _snapshot_dir(cache, repo, revision)
    if snap is None:
        raise HubError(f"{repo} is not in the Hugging Face cache ({cache}) and {why}")
    return _walk(snap)


def _download(repo: str, files: list[str], *, revision=None, cache_dir=None, local_dir=None, token=None) -> list[Path]:
    _hub()
    # from its defining module: the package attribute is what test suites (llama-cpp-python's
    # conftest) replace with stand-ins
    from huggingface_hub import errors as herr
    from huggingface_hub import file_download as hub

    out = []
    for f in files:
        try:
            try:
                p = hub.hf_hub_download(repo_id=repo, filename=f, revision=revision, cache_dir=cache_dir,
                                        local_dir=local_dir, token=token)
            except herr.LocalEntryNotFoundError:
                if local_dir is None:
                    raise
                # offline, huggingface_hub looks only in local_dir: copy the cached file there
                import shutil

                src = hub.hf_hub_download(repo_id=repo, filename=f, revision=revision, cache_dir=cache_dir,
                                          token=token, local_files_only=True)
                p = Path(local_dir) / f
                p.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, p)
        except herr.LocalEntryNotFoundError:
            raise HubError(f"{repo}/{f} is not in the Hugging Face cache and cannot be downloaded "
                           f"({'HF_HUB_OFFLINE is set' if _offline() else 'no connection to the Hub'})") from None
        except (herr.GatedRepoError, herr.RepositoryNotFoundError, herr.EntryNotFoundError,
                herr.RevisionNotFoundError) as e:
            raise HubError(f"cannot download {repo}/{f}: {str(e).splitlines()[0]}") from None
        except OSError as e:
            raise HubError(f"cannot download {repo}/{f}: {e}") from None
        out.append(Path(p))
    return out


def hf_model(hf_repo: str, hf_file: Optional[str] = None, *, token: Optional[str] = None,
             cache_dir: Optional[str | os.PathLike] = None) -> Path:
    """``-hf REPO[:QUANT]`` (and ``--hf-file``): the local path of the chosen model file
    (first part for a split model; all parts are fetched), downloading what is missing."""
    repo, tag = split_repo_tag(hf_repo)
    files = repo_files(repo, cache_dir=cache_dir, token=token)
    ggufs = [f for f in files if f.endswith(".gguf")]
    listing = "; available GGUF files: " + (", ".join(ggufs) if ggufs else "none")
    if hf_file:
        if hf_file not in files:
            raise HubError(f"file {hf_file!r} not found in {repo}" + listing)
        primary = hf_file
    else:
        primary = best_model(files, tag)
        if primary is None:
            what = f"no GGUF file for quant {tag!r}" if tag else "no GGUF model file"
            raise HubError(f"{what} in {repo}" + listing)
    paths = _download(repo, split_files(files, primary), cache_dir=cache_dir, token=token)
    return paths[split_files(files, primary).index(primary)]


def pretrained_path(repo_id: str, filename: str, additional_files: Optional[list] = None, *,
                    local_dir=None, cache_dir=None, token: Optional[str] = None) -> Path:
    """llama-cpp-python's from_pretrained file choice: ``filename`` and each of
    ``additional_files`` is a glob (fnmatch) over the repository's paths that must match
    exactly one file (ValueError otherwise, listing the files); all are fetched and the
    path of ``filename``'s match is returned."""
    _hub()
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    if not isinstance(filename, str):
        raise TypeError(f"filename must be a str (a file name or glob), got {type(filename).__name__}")
    try:
        validate_repo_id(repo_id)
    except HFValidationError as e:
        raise ValueError(str(e)) from None
    files = repo_files(repo_id, cache_dir=cache_dir, token=token)

    def one(pattern: str) -> str:
        if not isinstance(pattern, str):
            raise TypeError(f"additional_files entries must be str, got {type(pattern).__name__}")
        m = [f for f in files if fnmatch.fnmatch(f, pattern)]
        if not m:
            raise ValueError(f"No file found in {repo_id} that match {pattern}\n\nAvailable Files:\n{files}")
        if len(m) > 1:
            raise ValueError(f"Multiple files found in {repo_id} matching {pattern}\n\nAvailable Files:\n{files}")
        return m[0]

    main = one(filename)
    extra = [one(p) for p in additional_files or []]
    return _download(repo_id, [main] + extra, cache_dir=cache_dir, local_dir=local_dir, token=token)[0]


# -- pyllama list / rm -----------------------------------------------------------------------

@dataclass
class CachedModel:
    name: str  # what `pyllama rm` and `-hf` take: "owner/repo:Q4_K_M", or a file name in pyllama's cache
    paths: list[Path]  # the files (all parts of a split model); for the Hub, the snapshot entries
    size: int
    mtime: float
    source: str  # "pyllama" or "hf"
    repo: str = ""
    file: str = ""  # path inside the repository
    aliases: list[str] = field(default_factory=list)


def _file_type(path: Path) -> str:
    """The GGUF's file type as a quant name ("Q4_1", "Q4_K_M", "F16"): general.file_type,
    else the most common type among its 2-D weights (llama.cpp's guess); "?" if unreadable."""
    try:
        from .gguf import GGUFFile

        g = GGUFFile(str(path))
    except Exception:
        return "?"
    ft = g.metadata.get("general.file_type")
    if isinstance(ft, int):
        from ._api_system import _FTYPE_NAMES

        name = _FTYPE_NAMES.get(ft)
        if name:
            base, _, size = name.partition(" - ")
            if base == "all F32":
                return "F32"
            if size in ("Small", "Medium", "Large"):
                return f"{base}_{size[0]}"
            return base
    counts: dict[str, int] = {}
    for t in g.tensors:
        if len(t.shape) == 2 and t.name.endswith(".weight"):
            counts[str(t.type)] = counts.get(str(t.type), 0) + 1
    return max(counts, key=counts.get) if counts else "?"


def file_type(path: Path) -> str:
    return _file_type(path)


def _pyllama_cache_models() -> list[CachedModel]:
    from ._models import cache_dir

    root = cache_dir()
    if not root.is_dir():
        return []
    out = []
    for p in sorted(root.glob("*.gguf")):
        if not p.is_file():
            continue
        s = split_info(p.name)
        if s.count > 1 and s.index != 1:
            continue
        parts = [p] if s.count <= 1 else sorted(q for q in root.glob("*.gguf")
                                                if (lambda o: o.count == s.count and o.prefix == s.prefix)(split_info(q.name)))
        st = [q.stat() for q in parts]
        out.append(CachedModel(p.name, parts, sum(x.st_size for x in st), max(x.st_mtime for x in st), "pyllama",
                               file=p.name))
    return out


def _hub_cache_models() -> list[CachedModel]:
    cache = hub_cache_dir()
    if not cache.is_dir():
        return []
    out = []
    for folder in sorted(cache.glob("models--*--*")):
        repo = folder.name[len("models--"):].replace("--", "/", 1)
        snaps = folder / "snapshots"
        if not snaps.is_dir():
            continue
        main = _snapshot_dir(cache, repo, None)
        # a path in several snapshots: refs/main's copy wins, else the newest
        by_path: dict[str, Path] = {}
        for snap in sorted(snaps.iterdir(), key=lambda s: (s == main, s.stat().st_mtime)):
            for f in _walk(snap):
                if f.endswith(".gguf") and (snap / f).exists():
                    by_path[f] = snap / f
        files = sorted(by_path)
        for f in files:
            if not is_model_file(f):
                continue
            s = split_info(f)
            if s.count > 1 and s.index != 1:
                continue
            parts = split_files(files, f)
            st = [by_path[q].stat() for q in parts]
            name = f"{repo}/{f}"
            aliases = []
            if s.tag and best_model(files, s.tag) == f:
                name, aliases = f"{repo}:{s.tag}", [name]
            out.append(CachedModel(name, [by_path[q] for q in parts], sum(x.st_size for x in st),
                                   max(x.st_mtime for x in st), "hf", repo=repo, file=f, aliases=aliases))
    return out


def cached_models() -> list[CachedModel]:
    """Every model in pyllama's cache and in the Hub cache (split models once)."""
    return _pyllama_cache_models() + _hub_cache_models()


def find_cached(name: str) -> list[CachedModel]:
    """The cached models ``name`` refers to: a listed name (case-insensitive quant), an
    alias (``owner/repo/file.gguf``), a bare ``owner/repo`` (each of its models), or a file
    name in pyllama's cache with or without ``.gguf``."""
    models = cached_models()
    low = name.lower()
    exact = [m for m in models if m.name.lower() == low or any(a.lower() == low for a in m.aliases)]
    if exact:
        return exact
    if m := [m for m in models if m.source == "pyllama" and m.name.lower() == low + ".gguf"]:
        return m
    return [m for m in models if m.source == "hf" and m.repo.lower() == low]


def remove_model(m: CachedModel) -> int:
    """Delete a cached model's files; returns the bytes freed. For the Hub cache: the
    snapshot entries in every snapshot, their blobs when nothing else links to them, and the
    repository folder once no snapshot holds a file."""
    freed = 0
    if m.source == "pyllama":
        for p in m.paths:
            freed += p.stat().st_size
            p.unlink()
        return freed
    folder = _repo_folder(hub_cache_dir(), m.repo)
    rel = split_files(_all_snapshot_paths(folder), m.file)
    blobs: set[Path] = set()
    for snap in (folder / "snapshots").iterdir():
        for r in rel:
            e = snap / r
            if e.is_symlink():
                blobs.add(Path(os.path.normpath(e.parent / os.readlink(e))))
                e.unlink()
            elif e.is_file():
                freed += e.stat().st_size
                e.unlink()
    still = {Path(os.path.normpath(e.parent / os.readlink(e))) for e in _snapshot_entries(folder) if e.is_symlink()}
    for b in blobs - still:
        if b.is_file():
            freed += b.stat().st_size
            b.unlink()
    for snap in (folder / "snapshots").iterdir():  # drop emptied directories
        for d in sorted((Path(p) for p, _, _ in os.walk(snap)), key=lambda p: -len(p.parts)):
            if d.is_dir() and not any(d.iterdir()):
                d.rmdir()
    if not any(_snapshot_entries(folder)):
        import shutil

        shutil.rmtree(folder)
    return freed


def _snapshot_entries(folder: Path) -> list[Path]:
    snaps = folder / "snapshots"
    if not snaps.is_dir():
        return []
    return [Path(p, n) for snap in snaps.iterdir() for p, _, names in os.walk(snap) for n in names]


def _all_snapshot_paths(folder: Path) -> list[str]:
    snaps = folder / "snapshots"
    out = set()
    for snap in snaps.iterdir():
        out.update(_walk(snap))
    return sorted(out)
