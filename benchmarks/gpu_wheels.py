"""Wheels for benchmarks/gpu_check.py on a GPU machine that reaches no package registry (a lent one).

    make gpu-wheels    # python -m benchmarks.gpu_wheels download [--part-mib 40] [--with-ct2]

downloads, for the lent machines' python3 (3.12, x86-64), what their image lacks: onnxruntime-gpu (its
CUDA 13 build, 256 MB: the image's onnxruntime is a CPU build, and CUDA 13 with cuDNN 9 are there as pip
packages) and the server's packages the image has not (FastAPI, uvicorn, pydantic, ...: 14 MB).
`--with-ct2` adds CTranslate2 (43 MB) and the CUDA 12 cuBLAS it loads (nvidia-cublas-cu12, 581 MB; the
image has CUDA 13 only). A device call carries at most 64 MiB, so the wheels are split into numbered
folders (.gpu-wheels/1, 2, ..., each at most --part-mib) with files larger than that cut into parts.
Each device call but the last carries one folder and copies it to /tmp/gpu-wheels (kept while the
machine stays warm: the next call must come at once); the last carries its folder and runs
`python3 -m benchmarks.gpu_check`, which reassembles the parts (checked against SHA256SUMS), installs them
with pip --target and measures. The download prints the calls.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import site as sitepackages
import subprocess
import sys
import sysconfig
import tempfile
import tomllib
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEST = REPO / ".gpu-wheels"  # gitignored; a device call carries one numbered folder of it
STASH = Path("/tmp/gpu-wheels")  # on the lent machine: where the folders of earlier calls wait
SOURCES = (DEST, STASH)
SITE = Path("/tmp/gpu-check-site")  # kept while a lent machine stays warm: a second run installs nothing
CUDA = "CUDAExecutionProvider"
# ctypes.CDLL names: onnxruntime-gpu 1.31's CUDA provider needs the first five (cuDNN for some kernels);
# CTranslate2 4.8.5 loads the CUDA 12 cuBLAS
CUDA_LIBRARIES = ("libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13", "libcurand.so.10", "libcufft.so.12",
                  "libcudnn.so.9", "libcublas.so.12")
SERVER_MODULES = ("fastapi", "uvicorn", "pydantic_settings", "fastapi_offline", "orjson", "llguidance")
GPU_VERSION = "1.31.1"  # onnxruntime-gpu, as deploy/requirements.py's default (built for CUDA 13)
CUBLAS12 = "nvidia-cublas-cu12==12.9.3.13"  # CTranslate2 4.8.5 loads libcublas.so.12
SERVER_PACKAGES = ("fastapi", "uvicorn", "pydantic", "pydantic-settings", "fastapi-offline", "orjson", "llguidance")
SUMS = "SHA256SUMS"
PART = re.compile(r"^(?P<wheel>.+\.whl)\.part-(?P<index>\d+)-of-(?P<count>\d+)$")
# pip matches a manylinux tag's glibc version exactly: the ones these wheels use (the image has glibc 2.39)
PLATFORMS = ("manylinux1", "manylinux2014", *(f"manylinux_2_{n}" for n in (17, 24, 27, 28, 31, 34, 35, 39)))


class WheelError(RuntimeError):
    """The carried wheels are incomplete or corrupt."""


def pins() -> dict[str, str]:
    """pyproject.toml's exact pins (dependencies and the bench extra), by package name."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    found: dict[str, str] = {}
    for requirement in [*project["dependencies"], *project["optional-dependencies"]["bench"]]:
        name = re.split(r"[\[=<>~ ]", requirement, maxsplit=1)[0].lower()
        found.setdefault(name, requirement)
    return found


def server_requirements() -> list[str]:
    """The server's packages that the lent machines' image lacks, pinned as pyproject.toml pins them."""
    pinned = pins()
    return [pinned[name] for name in SERVER_PACKAGES]


def pip_download(requirements: list[str], into: Path, deps: bool, python_version: str) -> None:
    platforms = [arg for p in PLATFORMS for arg in ("--platform", f"{p}_x86_64")]
    command = [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--python-version", python_version,
               "--implementation", "cp", *platforms, "-d", str(into), *([] if deps else ["--no-deps"]),
               *requirements]
    subprocess.run(command, check=True)


def download(into: Path, gpu_version: str, with_ct2: bool, python_version: str) -> list[Path]:
    pip_download([f"onnxruntime-gpu=={gpu_version}"], into, deps=False, python_version=python_version)
    pip_download(server_requirements(), into, deps=True, python_version=python_version)
    if with_ct2:
        pip_download([pins()["ctranslate2"], CUBLAS12], into, deps=False, python_version=python_version)
    return sorted(into.glob("*.whl"))


def sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def split(wheels: list[Path], dest: Path, part_bytes: int) -> list[Path]:
    """The wheels in numbered folders of at most `part_bytes` each (a wheel larger than that in parts
    `NAME.whl.part-K-of-N`), first fit by decreasing size; SHA256SUMS of every whole wheel in each folder."""
    pieces: list[tuple[str, Path, int, int]] = []  # (file name, wheel, offset, length)
    for wheel in wheels:
        size = wheel.stat().st_size
        count = -(-size // part_bytes)
        if count == 1:
            pieces.append((wheel.name, wheel, 0, size))
            continue
        starts = range(0, size, part_bytes)
        pieces += [(f"{wheel.name}.part-{i + 1}-of-{count}", wheel, start, min(part_bytes, size - start))
                   for i, start in enumerate(starts)]
    bins: list[list[tuple[str, Path, int, int]]] = []
    for piece in sorted(pieces, key=lambda p: -p[3]):
        home = next((b for b in bins if sum(p[3] for p in b) + piece[3] <= part_bytes), None)
        if home is None:
            bins.append(home := [])
        home.append(piece)
    sums = "".join(f"{sha256(w)}  {w.name}\n" for w in wheels)
    shutil.rmtree(dest, ignore_errors=True)
    folders = []
    for number, content in enumerate(bins, start=1):
        folder = dest / str(number)
        folder.mkdir(parents=True)
        for name, wheel, offset, length in content:
            with wheel.open("rb") as f:
                f.seek(offset)
                (folder / name).write_bytes(f.read(length))
        (folder / SUMS).write_text(sums)
        folders.append(folder)
    return folders


def gather(sources: list[Path], into: Path) -> list[Path]:
    """Every wheel found under `sources`, whole or reassembled from its parts into `into`, checked against
    the SHA256SUMS found beside them. Raises WheelError naming a missing part or a wrong checksum."""
    whole: dict[str, Path] = {}
    parts: dict[str, dict[int, Path]] = {}
    counts: dict[str, int] = {}
    sums: dict[str, str] = {}
    for source in sources:
        for path in sorted(source.rglob("*")) if source.is_dir() else []:
            if path.name == SUMS:
                sums |= {name: digest for digest, name in (line.split() for line in path.read_text().splitlines())}
            elif path.suffix == ".whl":
                whole.setdefault(path.name, path)
            elif match := PART.match(path.name):
                parts.setdefault(match["wheel"], {})[int(match["index"])] = path
                counts[match["wheel"]] = int(match["count"])
    for name, found in parts.items():
        if name in whole:
            continue
        if missing := sorted(set(range(1, counts[name] + 1)) - set(found)):
            raise WheelError(f"{name}: parts {missing} of {counts[name]} are missing (carry every numbered "
                             f"folder of .gpu-wheels, each copied to {STASH} in a call of its own)")
        into.mkdir(parents=True, exist_ok=True)
        with (into / name).open("wb") as out:
            for index in range(1, counts[name] + 1):
                out.write(found[index].read_bytes())
        whole[name] = into / name
    for name, path in whole.items():
        if name in sums and sha256(path) != sums[name]:
            raise WheelError(f"{path}: its sha256 is not the one in {SUMS} (a part was cut short or mixed up)")
    return sorted(whole.values())


def install(wheels: list[Path], site: Path) -> None:
    """Into `site`, ahead of the interpreter's own packages on PYTHONPATH (the lent image's onnxruntime is a
    CPU build that must not win): no index, no dependencies (the folders hold what the image lacks)."""
    command = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--upgrade",
               "--target", str(site), *map(str, wheels)]
    subprocess.run(command, check=True, capture_output=True, text=True)


def nvidia_lib_dirs(roots: list[Path]) -> list[str]:
    """The `nvidia/*/lib` folders of the pip CUDA packages (nvidia/cu13/lib, nvidia/cudnn/lib, ...) under `roots`:
    nothing else tells the dynamic loader where they are (torch finds its own through its RUNPATH)."""
    return [str(p) for root in roots for p in sorted(root.glob("nvidia/*/lib")) if any(p.glob("*.so*"))]


def runtime_env(site: Path) -> dict[str, str]:
    """This environment with `site` and the repository first on PYTHONPATH and the CUDA libraries on
    LD_LIBRARY_PATH (read at a process's start: hence the re-executed measuring process)."""
    here = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *sitepackages.getsitepackages()]
    roots = [site, *map(Path, dict.fromkeys(here))]
    libraries = [*nvidia_lib_dirs(roots), *filter(None, os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep))]
    python_path = [str(site), str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return os.environ | {"PYTHONPATH": os.pathsep.join(python_path), "LD_LIBRARY_PATH": os.pathsep.join(libraries)}


def probe(env: dict[str, str], code: str) -> bool:
    """Whether `code` exits 0 in a fresh interpreter with `env`."""
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, timeout=120)
    return done.returncode == 0


def has_cuda_runtime(env: dict[str, str]) -> bool:
    return probe(env, f"import sys, onnxruntime as o; sys.exit({CUDA!r} not in o.get_available_providers())")


def missing_modules(env: dict[str, str], names: tuple[str, ...]) -> list[str]:
    code = "import importlib.util as u, sys; sys.exit(not u.find_spec({!r}))"
    return [name for name in names if not probe(env, code.format(name))]


def pip_install(requirements: list[str], site: Path, deps: bool) -> str | None:
    """pip from the index (a machine that reaches PyPI) into `site`; the error's last lines, or None."""
    command = [sys.executable, "-m", "pip", "install", "-q", "--upgrade", "--target", str(site), "--timeout", "15",
               "--retries", "1", *([] if deps else ["--no-deps"]), *requirements]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return "pip took over 300 s"
    return None if done.returncode == 0 else "\n".join(done.stderr.strip().splitlines()[-3:])


def ensure_runtime(args: argparse.Namespace) -> dict[str, Any]:
    """onnxruntime-gpu with a CUDA provider and the server's packages in `args.site`: present already, else from
    the carried wheels, else from PyPI. What happened, for the record (the provider check judges the result)."""
    record: dict[str, Any] = {"site": str(args.site), "installed": [], "errors": []}
    env = runtime_env(args.site)
    if has_cuda_runtime(env) and not missing_modules(env, SERVER_MODULES):
        return record | {"source": "present"}
    with tempfile.TemporaryDirectory() as scratch:
        try:
            wheels = gather(args.wheels or list(SOURCES), Path(scratch))
            if wheels:
                install(wheels, args.site)
                record["installed"] = [w.name for w in wheels]
        except (WheelError, subprocess.CalledProcessError, OSError) as exc:
            record["errors"].append(f"carried wheels: {getattr(exc, 'stderr', None) or exc}")
    record["source"] = "wheels" if record["installed"] else "pip"
    wanted = wanted_from_pip(args, runtime_env(args.site), record)
    if wanted and not index_reachable():
        record["errors"].append(f"the package index is not reachable: not installed {wanted}")
        return record
    for requirements, deps in wanted:
        print(f"pip install --target {args.site} {' '.join(requirements)}", flush=True)
        error = pip_install(requirements, args.site, deps)
        record["errors" if error else "installed"].append(f"pip {requirements}: {error}" if error else requirements)
    return record


Wanted = list[tuple[list[str], bool]]  # pip requirements, and whether pip installs their dependencies


def wanted_from_pip(args: argparse.Namespace, env: dict[str, str], record: dict[str, Any]) -> Wanted:
    """What is still missing, as pip requirements and whether pip takes their dependencies."""
    wanted: Wanted = []
    if not has_cuda_runtime(env):  # CUDA 13 and cuDNN as pip packages too, where the machine lacks them
        libraries = probe(env, f"import ctypes; [ctypes.CDLL(n) for n in {CUDA_LIBRARIES[:3] + CUDA_LIBRARIES[5:6]}]")
        package = "onnxruntime-gpu" if libraries else "onnxruntime-gpu[cuda,cudnn]"
        wanted.append(([f"{package}=={args.gpu_version}"], not libraries))
    if missing := missing_modules(env, SERVER_MODULES):
        wanted.append((server_requirements(), True))
        record["missing_modules"] = missing
    if args.rows == "yes" and not probe(env, "import ctypes, ctranslate2; ctypes.CDLL('libcublas.so.12')"):
        wanted.append(([pins()["ctranslate2"], CUBLAS12], False))
    return wanted


def index_reachable() -> bool:
    """Whether pip reaches its package index (a lent machine reaches none): one quick look-up, not pip's retries."""
    command = [sys.executable, "-m", "pip", "index", "versions", "onnxruntime-gpu", "--timeout", "5", "--retries", "0"]
    try:
        return subprocess.run(command, capture_output=True, timeout=30).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def plan(folders: list[Path]) -> str:
    """The device calls that bring the folders over (each carries one, named from the repository's root) and run
    the check."""
    names = [os.path.relpath(f, REPO) for f in folders]
    stash = f"mkdir -p {STASH} && cp -r {Path(names[0]).parent}/. {STASH}/"
    lines = [f'call {i}: carry ["{name}"], command: {stash}' for i, name in enumerate(names[:-1], 1)]
    check = "PYTHONUNBUFFERED=1 python3 -m benchmarks.gpu_check"
    lines.append(f'call {len(names)}: carry ["{names[-1]}"], command: {check}')
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("download",))
    parser.add_argument("--dest", type=Path, default=DEST)
    parser.add_argument("--part-mib", type=int, default=40, help="the largest folder a device call carries")
    parser.add_argument("--gpu-version", default=GPU_VERSION, help="onnxruntime-gpu version")
    parser.add_argument("--python-version", default="3.12", help="the GPU machine's python3")
    parser.add_argument("--with-ct2", action="store_true", help=f"also ctranslate2 and {CUBLAS12} (624 MB)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        wheels = download(Path(scratch), args.gpu_version, args.with_ct2, args.python_version)
        folders = split(wheels, args.dest, args.part_mib * 2**20)
    total = sum(p.stat().st_size for f in folders for p in f.iterdir())
    print(f"{len(wheels)} wheels, {total / 2**20:.0f} MiB in {len(folders)} folders under {args.dest}\n")
    print(plan(folders))


if __name__ == "__main__":
    main()
