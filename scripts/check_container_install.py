"""The Dockerfile's pip command, resolved here: does `pip install trtspec[serve,client,trtllm]`
inside NVIDIA's TRT-LLM image leave its torch, ModelOpt, TensorRT and numpy<2 alone?

docker cannot build here (no engine), so this runs the same pip command with --dry-run --report
against docker/container-constraints.txt (the image's pins) and prints what pip would install.
Exit 1 if that includes torch, nvidia-modelopt, tensorrt*, transformers (TRT-LLM pins its own) or
numpy>=2.

    python scripts/check_container_install.py [--json]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
FORBIDDEN = ("torch", "nvidia-modelopt", "tensorrt", "tensorrt-llm", "tensorrt_llm", "transformers")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--wheel-dir", tmp, str(ROOT)],
                       check=True, capture_output=True)
        wheel = next(pathlib.Path(tmp).glob("trtspec-*.whl"))
        report = pathlib.Path(tmp) / "report.json"
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--dry-run", "--ignore-installed",
                        "--report", str(report), "--constraint", str(ROOT / "docker" / "container-constraints.txt"),
                        f"{wheel}[serve,client,trtllm]"], check=True)
        installs = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.loads(report.read_text())["install"]}
    bad = {n: v for n, v in installs.items() if n in FORBIDDEN or n.startswith("tensorrt")
           or (n == "numpy" and int(v.split(".")[0]) >= 2)}
    if args.json:
        print(json.dumps({"would_install": installs, "forbidden": bad}, indent=2))
    else:
        print(f"pip would install {len(installs)} packages: " + ", ".join(f"{n}=={v}" for n, v in sorted(installs.items())))
        print("forbidden: " + (", ".join(f"{n}=={v}" for n, v in bad.items()) if bad else "none (the image's torch, "
                                "ModelOpt, TensorRT, transformers and numpy<2 stay)"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
