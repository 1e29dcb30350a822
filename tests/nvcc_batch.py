"""nvcc over a test module's kernel programs at once. CI has 2 cores: the programs of a module compile
concurrently, once, and each parametrized test then checks its own result. Device code only (`-cubin`,
as MLX compiles the kernels at run time with NVRTC): with the host pass too a kernel took ~3.7 s, without
it ~1.5 s, with the same ptxas report (registers, spills)."""

from __future__ import annotations

import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict

NVCC = shutil.which("nvcc")
HEADER = "#include <cstdint>\n#include <cuda_bf16.h>\n#include <cuda_fp16.h>\n#include <cooperative_groups.h>\n"


def nvcc(text: str, folder: Path, name: str) -> subprocess.CompletedProcess:
    """One program's device code compiled for sm_90, with ptxas's register and spill report on stderr."""
    src = folder / f"{name}.cu"
    src.write_text(HEADER + text)
    return subprocess.run([NVCC or "nvcc", "-std=c++17", "-arch=sm_90", "-Xptxas", "-v", "-cubin", str(src), "-o",
                           str(folder / f"{name}.cubin")], capture_output=True, text=True, timeout=300)


def nvcc_all(programs: Dict[str, str], folder: Path) -> Dict[str, subprocess.CompletedProcess]:
    """{name: program} -> {name: nvcc's result}, as many at a time as the machine has cores."""
    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        futures = {name: pool.submit(nvcc, text, folder, name) for name, text in programs.items()}
        return {name: f.result() for name, f in futures.items()}
