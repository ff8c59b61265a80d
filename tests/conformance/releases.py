"""Older releases of llama-cpp-python and MLX, fetched as packages: the Metal sources
authors still have in their trees, which must compile on sim unchanged.

Each is fetched with pip the first time a test asks for it (a source distribution of
llama-cpp-python, a macOS wheel of MLX, which is a zip pip downloads for any platform),
and only its Metal sources are kept, in the user's cache folder under the pinned version
(``mtwork-sources/metal-releases/``), as `llama_cpp_sdist` keeps the current one; nothing of
them lives in this repository.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from .llama_cpp_sdist import Unavailable

__all__ = ["LLAMA_2023", "LLAMA_LATE_2024", "MLX_EARLY_2024", "MLX_MID_2024", "llama_metal",
           "mlx_include"]

# December 2023: one ggml-metal.metal of 102 kernels, before function constants.
LLAMA_2023 = "llama-cpp-python==0.2.26"
# November 2024: ggml-metal.metal with flash attention (`(float4x4) sr4x4[i]/S`).
LLAMA_LATE_2024 = "llama-cpp-python==0.3.2"
# February 2024: bf16.h that tests __HAVE_BFLOAT__ (a struct of its own without it).
MLX_EARLY_2024 = "mlx==0.4.0"
# August 2024: quantized.h with qmv_fast, qmm_t, ... (MLX 0.32's are affine_*).
MLX_MID_2024 = "mlx==0.16.3"

_LLAMA_METAL = {LLAMA_2023: "vendor/llama.cpp/ggml-metal.metal",
                LLAMA_LATE_2024: "vendor/llama.cpp/ggml/src/ggml-metal/ggml-metal.metal"}
_LLAMA_COMMON = {LLAMA_LATE_2024: "vendor/llama.cpp/ggml/src/ggml-common.h"}


def _cache(spec: str) -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "mtwork-sources" / "metal-releases" / spec.replace("==", "-")


def _fetched(spec: str, pip_args: list[str], keep: Callable[[Path, Path], None]) -> Path:
    """The cache folder of `spec`, filled by `keep(download, folder)` the first time."""
    root = _cache(spec)
    if root.is_dir():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root.parent) as tmp:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                               *pip_args, spec, "-d", tmp], capture_output=True, text=True,
                              check=False)
        got = [p for p in Path(tmp).iterdir() if p.suffix in (".gz", ".whl")]
        if done.returncode or not got:
            reason = (done.stderr or done.stdout).strip()[-300:]
            raise Unavailable(f"pip download {spec} failed: {reason}")
        unpacked = Path(tmp) / "unpacked"
        keep(got[0], unpacked)
        try:  # whole or not at all: a run stopped half-way leaves no partial cache
            os.replace(unpacked, root)
        except OSError:
            if not root.is_dir():
                raise
    return root


def llama_metal(spec: str) -> Path:
    """The release's ggml-metal.metal (beside the ggml-common.h it includes, if any)."""
    wanted = [_LLAMA_METAL[spec], *([_LLAMA_COMMON[spec]] if spec in _LLAMA_COMMON else [])]

    def keep(archive: Path, into: Path) -> None:
        with tarfile.open(archive) as tar:
            top = tar.getnames()[0].split("/")[0]
            members = [m for m in tar.getmembers() if m.name[len(top) + 1:] in wanted]
            for m in members:
                m.name = m.name[len(top) + 1:]
            tar.extractall(into, members=members, filter="data")

    return _fetched(spec, ["--no-binary", ":all:"], keep) / _LLAMA_METAL[spec]


def mlx_include(spec: str) -> Path:
    """The `include/` folder of the release's macOS wheel (its Metal kernel headers)."""
    prefix = "mlx/include/mlx/backend/metal/kernels/"

    def keep(wheel: Path, into: Path) -> None:
        with zipfile.ZipFile(wheel) as z:
            for name in z.namelist():
                if name.startswith(prefix) and not name.endswith("/"):
                    z.extract(name, into)

    pip = ["--only-binary", ":all:", "--platform", "macosx_14_0_arm64", "--python-version",
           "3.11"]
    return _fetched(spec, pip, keep) / "mlx" / "include"
