"""What each extra installs, measured: build the wheel once, install it non-editable into one fresh
venv per extra, and record the packages pip put there, the venv's size on disk and the time.

    python scripts/measure_extras.py [--extras core,client,...] [--keep DIR]

Extras that need torch get `torch==2.13.0` first (the CPU build on this machine's disk, as the
Makefile does): an unpinned torch would pull a multi-GB CUDA build, which is what a GPU user
already has. Writes bench/results/extras.json and bench/results/extras.md.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
EXTRAS = ("core", "client", "serve", "torch-runtime", "quantize", "cpu-triton", "gguf", "trtllm", "all")
NEEDS_TORCH = {"torch-runtime", "quantize", "all"}
TORCH_PIN = "torch==2.13.0"
WATCH = ("torch", "nvidia-modelopt", "transformers", "tritonclient", "nvidia-pytriton", "numpy")


def build_wheel(out: pathlib.Path) -> pathlib.Path:
    """``pip wheel --no-deps`` of this checkout into ``out`` (what a release uploads)."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--wheel-dir", str(out), str(ROOT)],
                   check=True, capture_output=True)
    return next(out.glob("trtspec-*.whl"))


def make_venv(path: pathlib.Path, wheel: pathlib.Path, extra: str | None, *, torch_first: bool,
              byte_compile: bool = True) -> float:
    """A fresh venv at ``path`` with ``wheel[extra]`` installed non-editable; returns the seconds.
    ``byte_compile=False`` skips pip's ``.pyc`` pass over every installed file (half of an
    ``[all]`` install's time here); modules then compile when first imported, as they would."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    pip = [str(path / "bin" / "python"), "-m", "pip", "install", "-q", *([] if byte_compile else ["--no-compile"])]
    if torch_first:
        subprocess.run([*pip, TORCH_PIN], check=True)
    subprocess.run([*pip, f"{wheel}[{extra}]" if extra else str(wheel)], check=True)
    return time.perf_counter() - t0


def installed(path: pathlib.Path) -> dict[str, str]:
    out = subprocess.run([str(path / "bin" / "python"), "-m", "pip", "list", "--format", "json"],
                         check=True, capture_output=True, text=True).stdout
    return {p["name"].lower(): p["version"] for p in json.loads(out) if p["name"].lower() not in ("pip", "setuptools")}


def size_mb(path: pathlib.Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink()) / 2**20


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--extras", default=",".join(EXTRAS), help="comma-separated; 'core' = no extra")
    ap.add_argument("--keep", type=pathlib.Path, default=None, help="keep the venvs under this folder")
    args = ap.parse_args()
    extras = [e.strip() for e in args.extras.split(",") if e.strip()]
    unknown = sorted(set(extras) - set(EXTRAS))
    if unknown:
        ap.error(f"--extras: unknown {unknown}; choose from {', '.join(EXTRAS)}")
    base = args.keep or pathlib.Path(tempfile.mkdtemp(prefix="trtspec-extras-"))
    base.mkdir(parents=True, exist_ok=True)
    rows = []
    try:
        wheel = build_wheel(base / "dist")
        empty = base / "venv-empty"
        subprocess.run([sys.executable, "-m", "venv", str(empty)], check=True)
        empty_mb = size_mb(empty)
        for extra in extras:
            venv = base / f"venv-{extra}"
            seconds = make_venv(venv, wheel, None if extra == "core" else extra, torch_first=extra in NEEDS_TORCH)
            pkgs = installed(venv)
            rows.append({
                "extra": extra, "packages": len(pkgs), "size_mb": round(size_mb(venv) - empty_mb, 1),
                "install_s": round(seconds, 1), "torch_first": extra in NEEDS_TORCH,
                "watch": {w: pkgs.get(w) for w in WATCH}, "installed": pkgs,
            })
            print(f"{extra:14} {len(pkgs):4d} packages {rows[-1]['size_mb']:8.1f} MB {seconds:6.1f} s", flush=True)
            if args.keep is None:
                shutil.rmtree(venv)
    finally:
        if args.keep is None:
            shutil.rmtree(base, ignore_errors=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    record = {"python": sys.version.split()[0], "wheel": wheel.name, "torch_pin_first": TORCH_PIN,
              "size": "MB on disk in the venv beyond an empty venv", "rows": rows}
    (RESULTS / "extras.json").write_text(json.dumps(record, indent=2) + "\n")
    lines = ["| extra | packages | size in venv | install | " + " | ".join(WATCH) + " |",
             "|---|---:|---:|---:|" + "---|" * len(WATCH)]
    for r in rows:
        lines.append(f"| `{r['extra']}` | {r['packages']} | {r['size_mb']:.0f} MB | {r['install_s']:.0f} s | "
                     + " | ".join(r["watch"][w] or "–" for w in WATCH) + " |")
    table = "\n".join(lines)
    (RESULTS / "extras.md").write_text(
        f"# What each extra installs ({wheel.name}, Python {record['python']})\n\n"
        f"Fresh venv per extra, wheel installed non-editable; extras that need torch got `{TORCH_PIN}` first "
        "(CPU build). Size: MB on disk beyond an empty venv. Reproduce: `python scripts/measure_extras.py`.\n\n"
        + table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
