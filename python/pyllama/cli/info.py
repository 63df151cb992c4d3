"""`pyllama info [--json]`: what this installation is and will do: version and distribution,
the extension's build, the CPU features found and the kernel set chosen from them (and why),
the float order, the ``PYLLAMA_*`` settings in force, GPU devices, optional extras, and the
model caches (pyllama's and the Hugging Face Hub's) with the models in them (as `pyllama list`)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import typer

from . import app

# Every environment variable pyllama reads, with what it does (the README's table).
SETTINGS = {
    "PYLLAMA_KERNELS": "force a kernel set: ref, avx2, avx2vnni, avx512, avx512bw (falls back to what the CPU runs)",
    "PYLLAMA_ORDER": "float order: llamacpp = llama.cpp's order for large batches (default: pyllama's)",
    "PYLLAMA_CACHE": "model cache directory",
    "PYLLAMA_NO_ROWS": "benchmarks: turn off the multi-row decode kernels",
    "PYLLAMA_NO_COLS": "benchmarks: decode batches of 2..7 tokens one token at a time (the old path)",
    "PYLLAMA_NO_RB": "benchmarks: prefill without the row-block / column-lane kernels (same results)",
    "PYLLAMA_NO_REPACK": "benchmarks: load Q5_0 / Q4_1 / Q4_K layer weights as in the file, not in the x4 decode layout (same results)",
    "PYLLAMA_GRAMMAR": "py = the pure-Python grammar matcher (the reference) instead of the Rust one",
    "PYLLAMA_LLAMA_CPP_DIR": "tests: a llama.cpp build directory for pyllama verify's comparison",
    "PYLLAMA_BENCH_MIB": "benchmarks: working-set size of the bandwidth probe",
    "PYLLAMA_BENCH_TYPES": "benchmarks: weight types of the kernel benchmark",
    "PYLLAMA_SLOW": "tests: run the long sweeps",
    "PYLLAMA_GPU": "cpu-ok = let GPU offload use a software adapter (Mesa's lavapipe; for tests)",
    "PYLLAMA_GPU_RESIDENT": "0 = offloaded layers send every matmul's activations across (the per-matmul mode) instead of staying on the GPU",
    "PYLLAMA_GPU_MAX_MIB": "cap on the MiB of weights uploaded to each GPU device (a load past it fails, saying how many layers fit)",
    "PYLLAMA_GPU_SUBGROUPS": "0 = GPU kernels reduce in workgroup memory even where the adapter offers subgroup operations",
    "PYLLAMA_GPU_REPEAT": "tests: list every usable GPU adapter N times, each its own device (a layer split on one adapter)",
    "PYLLAMA_NO_SGEMM": "benchmarks: F32 weights without the tiled (tinyBLAS-order) matmul",
}

DISTRIBUTION = "pyllama-gguf"


def _kernel_reason(kset: str, features: dict[str, bool], vnni: bool) -> str:
    forced = os.environ.get("PYLLAMA_KERNELS", "").strip().lower()
    have = [k for k, v in features.items() if v]
    # the set each PYLLAMA_KERNELS name selects (avx2vnni: the AVX2 set with its VNNI builds)
    if forced and {"ref": "ref", "avx2": "avx2", "avx2vnni": "avx2", "avx512": "avx512",
                   "avx512bw": "avx512bw", "neon": "neon"}.get(forced) == kset:
        why = f"forced by PYLLAMA_KERNELS={forced}"
    elif forced:
        why = f"PYLLAMA_KERNELS={forced} asked for a set this CPU cannot run (or an unknown name): the best it runs"
    elif kset == "avx512":
        why = "the CPU has AVX-512 F, BW, VL, DQ and VNNI"
    elif kset == "avx512bw":
        why = "the CPU has AVX-512 F, BW, VL and DQ but not VNNI"
    elif kset == "avx2":
        missing = [f for f in ("avx512f", "avx512bw", "avx512vl", "avx512dq") if not features.get(f)]
        why = "the CPU has AVX2, FMA and F16C" + (f" but not {', '.join(missing)}" if missing else "")
    elif kset == "neon":
        why = "aarch64 (NEON" + (", dotprod" if features.get("dotprod") else "") + ")"
    else:
        why = "no SIMD set this build has kernels for (" + (", ".join(have) or "no features found") + ")"
    if kset == "avx2":
        why += "; AVX-VNNI builds " + ("on" if vnni else "off")
    return why


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def _extras() -> dict[str, str | None]:
    from importlib import metadata

    out: dict[str, str | None] = {}
    for name in ("numpy", "typer", "jinja2", "starlette", "uvicorn", "ray", "huggingface_hub", "gguf"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def _cached_models() -> list[dict[str, Any]]:
    """pyllama list's models: pyllama's cache and the Hugging Face Hub cache."""
    from ..hub import cached_models, file_type

    return [{"name": m.name, "path": str(m.paths[0]), "size": m.size, "type": file_type(m.paths[0]),
             "source": m.source} for m in cached_models()]


def _subgroups(dev: dict) -> str:
    """Whether offload's kernels reduce with subgroup operations on adapter `dev`."""
    if not dev["subgroups"]:
        return "no subgroup operations: workgroup-memory reductions"
    lo, hi = dev["subgroup_sizes"]
    size = f"{lo}" if lo == hi else f"{lo}-{hi}"
    if dev["subgroups_used"]:
        return f"subgroup reductions (subgroups of {size})"
    return f"subgroups of {size} offered, not used (PYLLAMA_GPU_SUBGROUPS=0)"


def _gpu_report() -> dict:
    """The GPU backend's adapters (pyllama.gpu) and, when offload cannot run, why."""
    from .. import gpu

    return {"backend": "wgpu" if gpu.built() else None, "devices": gpu.devices(), "why": gpu.why_not()}


def collect() -> dict[str, Any]:
    """Everything `info` shows, as plain data (the --json output)."""
    import platform

    from .. import _core, __version__
    from .._models import cache_dir, smollm2_path
    from ..hub import hub_cache_dir

    feats, vnni = _core.cpu_features()
    features = dict(feats)
    kset = _core.kernel_set()
    try:
        from importlib import metadata

        dist = metadata.distribution(DISTRIBUTION)
        dist_info = {"name": DISTRIBUTION, "version": dist.version}
    except Exception:  # not installed as a distribution (a source tree on sys.path)
        dist_info = {"name": None, "version": None}
    try:
        n_cpu = len(os.sched_getaffinity(0))
    except AttributeError:
        n_cpu = os.cpu_count() or 1
    cache = cache_dir()
    default = smollm2_path()
    if default is None and (cache / "SmolLM2-135M-Instruct.Q4_1.gguf").is_file():
        default = cache / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return {
        "version": __version__,
        "distribution": dist_info,
        "python": f"{platform.python_implementation()} {platform.python_version()} ({sys.executable})",
        "extension": {"path": _core.__file__, **dict(_core.BUILD)},
        "platform": f"{platform.system()} {platform.machine()}",
        "cpu": {"name": _cpu_name(), "threads_available": n_cpu, "features": features},
        "kernel_set": {"name": kset, "why": _kernel_reason(kset, features, vnni), "avx_vnni": vnni},
        "float_order": "llamacpp" if os.environ.get("PYLLAMA_ORDER", "").lower() == "llamacpp" else "pyllama",
        "settings": {k: os.environ[k] for k in sorted(os.environ) if k.startswith("PYLLAMA_")},
        "gpu": _gpu_report(),
        "packages": _extras(),
        "cache_dir": str(cache),
        "default_model": str(default) if default else None,
        "hub_cache_dir": str(hub_cache_dir()),
        "cached_models": _cached_models(),
    }


@app.command()
def info(
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Show the installation: version, build, CPU features and the kernel set chosen (and
    why), PYLLAMA_* settings, GPU devices, optional packages, the model cache."""
    from .models import human_bytes

    d = collect()
    if as_json:
        print(json.dumps(d, indent=2))
        return
    dist = d["distribution"]
    ext = d["extension"]
    cpu = d["cpu"]
    print(f"pyllama {d['version']}"
          + (f" (distribution {dist['name']} {dist['version']})" if dist["name"] else " (from a source tree)"))
    print(f"python: {d['python']}")
    print(f"extension: {ext['path']} ({ext['profile']} build, {ext['target_os']} {ext['target_arch']}, "
          f"abi3 {ext['abi3']}+)")
    print(f"platform: {d['platform']}")
    print(f"cpu: {cpu['name']}, {cpu['threads_available']} threads available")
    print("cpu features: " + " | ".join(f"{k.upper()} = {int(v)}" for k, v in cpu["features"].items()))
    print(f"kernel set: {d['kernel_set']['name']} ({d['kernel_set']['why']})")
    print(f"float order: {d['float_order']}")
    if d["settings"]:
        for k, v in d["settings"].items():
            print(f"setting: {k}={v}" + (f"  ({SETTINGS[k]})" if k in SETTINGS else "  (not a setting pyllama reads)"))
    else:
        print("settings: no PYLLAMA_* variables set")
    g = d["gpu"]
    if not g["devices"]:
        print(f"gpu: none ({g['why']})")
    for i, dev in enumerate(g["devices"]):
        print(f"gpu device {i}: {dev['name']} ({dev['backend']}, {dev['type']}, driver {dev['driver'] or '?'}; "
              f"largest buffer {human_bytes(dev['max_buffer_size'])}; {_subgroups(dev)})"
              + ("" if dev["usable"] else " (software: not used unless PYLLAMA_GPU=cpu-ok)"))
    if g["devices"] and g["why"]:
        print(f"gpu: offload off ({g['why']})")
    print("packages: " + ", ".join(f"{k} {v}" if v else f"{k} (not installed)" for k, v in d["packages"].items()))
    print(f"cache dir: {d['cache_dir']}")
    print(f"hub cache dir: {d['hub_cache_dir']}")
    print(f"default model: {d['default_model'] or 'not fetched yet (pyllama generate fetches it)'}")
    models = d["cached_models"]
    if models:
        print(f"cached models ({len(models)}):")
        for m in models:
            print(f"  {m['name']}  {m['type']}  {human_bytes(m['size'])}  ({m['path']})")
    else:
        print("cached models: none")
