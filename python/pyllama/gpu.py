"""GPU devices (the wgpu backend, built with the cargo feature ``gpu``).

``devices()`` lists the adapters wgpu finds (Vulkan, Metal, DX12), hardware first;
``available()`` says whether offload can run here: the backend is built and an adapter is
usable. A software adapter (Mesa's lavapipe: ``type == "cpu"``) is usable only when asked
for, with ``allow_software=True`` or ``PYLLAMA_GPU=cpu-ok``: it is slower than the CPU
kernels and is there for testing. ``n_gpu_layers`` (``Model.load``, ``Llama``,
``llama_model_params``, ``-ngl``) puts the matmuls of the last N layers on the usable
adapters as llama.cpp places them: ``split_mode`` "layer" (the default, ``-sm``) spreads the
layers over every usable adapter in proportion to ``tensor_split`` (``-ts``; equal shares by
default), "none" puts them all on adapter ``main_gpu`` (``-mg``). For the shared decoder's
architectures whole layers run there (with ``offload_kqv`` and an F32, F16, Q8_0, Q4_0, Q4_1,
Q5_0 or Q5_1 cache, the KV cache and attention too), the residual stream crossing once per device border; other
layers send each matmul's activations to the device and back.

``PYLLAMA_GPU_REPEAT=N`` (for tests) lists every usable adapter N times, each entry opened
as a device of its own: a layer split across devices on a machine with one adapter.
"""

from __future__ import annotations

import functools
from typing import Any

from . import _core


def built() -> bool:
    """True when this extension carries the wgpu backend."""
    return bool(_core.gpu_built())


@functools.lru_cache(maxsize=4)
def _devices(allow_software: bool, env: str, env_sg: str) -> tuple[dict[str, Any], ...]:
    return tuple(_quiet_driver(lambda: _core.gpu_devices(allow_software)))


# what a Vulkan driver prints on stderr when the process has no XDG_RUNTIME_DIR (Mesa's
# lavapipe in a container): about its window-system support, not compute; dropped
_HARMLESS = ("XDG_RUNTIME_DIR",)


def _quiet_driver(fn):
    """Run the first adapter enumeration (the only time wgpu makes an instance, in Rust)
    with the process's stderr captured, passing on every line except the drivers' harmless
    window-system ones."""
    import os
    import sys
    import tempfile

    try:
        saved = os.dup(2)
    except OSError:
        return fn()
    with tempfile.TemporaryFile() as tmp:
        try:
            sys.stderr.flush()
            os.dup2(tmp.fileno(), 2)
            return fn()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            for line in tmp.read().decode("utf-8", "replace").splitlines():
                if not any(h in line for h in _HARMLESS):
                    print(line, file=sys.stderr)


def devices(allow_software: bool = False) -> list[dict[str, Any]]:
    """Every adapter found (name, type, backend, driver, driver_info, vendor, device,
    max_buffer_size, max_storage_binding, subgroups, subgroup_sizes, subgroups_used, usable);
    empty without the backend. ``subgroups``: the adapter offers subgroup operations;
    ``subgroups_used``: offload's matrix-vector and attention kernels reduce with them (not
    with ``PYLLAMA_GPU_SUBGROUPS=0``, which keeps the workgroup-memory reductions).
    Enumerated once per process (and per PYLLAMA_GPU / PYLLAMA_GPU_SUBGROUPS value)."""
    import os

    if not built():
        return []
    env = os.environ.get("PYLLAMA_GPU", ""), os.environ.get("PYLLAMA_GPU_SUBGROUPS", "")
    return [dict(d) for d in _devices(bool(allow_software), *env)]


def usable(allow_software: bool = False) -> list[dict[str, Any]]:
    """The adapters offload may use, in ``main_gpu`` / ``tensor_split`` order (each
    ``PYLLAMA_GPU_REPEAT`` times)."""
    import os

    try:
        n = int(os.environ.get("PYLLAMA_GPU_REPEAT", "1"))
    except ValueError:
        n = 1
    return [d for d in devices(allow_software) if d["usable"] for _ in range(max(n, 1))]


def available(allow_software: bool = False) -> bool:
    """True when ``n_gpu_layers`` would put work on a GPU adapter."""
    return bool(usable(allow_software))


def why_not() -> str:
    """Why ``available()`` is false, in a few words (for warnings and ``pyllama info``)."""
    if not built():
        return "this pyllama was built without the GPU backend (cargo feature 'gpu')"
    all_ = devices()
    if not all_:
        return "no GPU adapter found (no Vulkan, Metal or DX12 driver)"
    if not usable():
        return "only software adapters found; PYLLAMA_GPU=cpu-ok uses them"
    return ""
