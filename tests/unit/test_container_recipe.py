"""docker/Dockerfile at its seams (no Docker engine here): it parses, its base image is the
recipe's default TRT-LLM container, and its pip command installs extras that exist, under the
image's constraints, checking the image's versions before and after. The resolution itself is
scripts/check_container_install.py (pip --dry-run --report; needs the package index)."""

from __future__ import annotations

import pathlib
import re
import tomllib

from trtspec.config import TrtllmOptions

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "docker" / "Dockerfile"
INSTRUCTIONS = {"FROM", "ARG", "RUN", "COPY", "WORKDIR", "ENV", "EXPOSE", "ENTRYPOINT", "CMD", "LABEL", "USER"}


def _instructions() -> list[tuple[str, str]]:
    out, buf = [], ""
    for line in DOCKERFILE.read_text().splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        buf += line.rstrip("\\").rstrip() + " "
        if not line.rstrip().endswith("\\"):
            word, _, rest = buf.strip().partition(" ")
            out.append((word, rest))
            buf = ""
    assert not buf, "a continued line never ends"
    return out


def test_every_instruction_is_known_and_the_build_has_two_stages():
    ins = _instructions()
    assert {w for w, _ in ins} <= INSTRUCTIONS, {w for w, _ in ins} - INSTRUCTIONS
    assert [w for w, _ in ins].count("FROM") == 2


def test_the_base_image_is_the_recipe_default_container():
    arg = next(rest for w, rest in _instructions() if w == "ARG" and rest.startswith("BASE_IMAGE="))
    assert arg.split("=", 1)[1] == TrtllmOptions().container_image


def test_the_pip_command_installs_existing_extras_under_the_image_constraints_and_checks_versions():
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    run = " ".join(rest for w, rest in _instructions() if w == "RUN" and "pip install" in rest)
    asked = set(re.search(r"\[([a-z,\-]+)\]\"", run).group(1).split(","))
    assert asked == {"serve", "client", "trtllm"} and asked <= extras
    assert "--constraint /tmp/container-constraints.txt" in run
    assert "diff /tmp/versions-before.txt /tmp/versions-after.txt" in run
    pins = (ROOT / "docker" / "container-constraints.txt").read_text()
    assert re.search(r"^torch==", pins, re.M) and re.search(r"^nvidia-modelopt==", pins, re.M) and "numpy<2" in pins
    # TRT-LLM pins transformers; the image's version must satisfy trtspec[client]'s range as it is
    assert re.search(r"^transformers==", pins, re.M)
    for pkg in ("torch", "nvidia-modelopt", "tensorrt_llm", "transformers", "numpy"):
        assert f"'{pkg}'" in run, f"the before/after version check leaves out {pkg}"
