"""Extract the tensor contract of NVIDIA's ``inflight_batcher_llm`` Triton templates into
``trtspec/data/nvidia_inflight_batcher_llm.json`` (names, data types, dims, optionality, reshape).

The contract is tensorrtllm_backend at the last commit before the templates moved into
TensorRT-LLM's ``triton_backend/`` (c2e65b8, "Update TensorRT-LLM backend (#749)"). Usage, with a
clone of triton-inference-server/tensorrtllm_backend:

    python scripts/nvidia_contract.py --git-dir tensorrtllm_backend/.git --commit c2e65b8

Only the interface (tensor declarations) is read; the placeholders of the templates are filled
with neutral values (logits as TYPE_FP32) so that Triton's own protobuf schema parses them.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import subprocess

MODELS = ("ensemble", "preprocessing", "postprocessing", "tensorrt_llm", "tensorrt_llm_bls")
OUT = pathlib.Path(__file__).resolve().parent.parent / "trtspec" / "data" / "nvidia_inflight_batcher_llm.json"


def tensors(items, inputs: bool) -> list[dict]:
    from tritonclient.grpc import model_config_pb2

    out, seen = [], set()
    for x in items:
        if x.name in seen:  # NVIDIA's ensemble declares kv_cache_alloc_total_blocks twice
            continue
        seen.add(x.name)
        d = {"name": x.name, "data_type": model_config_pb2.DataType.Name(x.data_type), "dims": list(x.dims)}
        if inputs:
            d["optional"] = bool(x.optional)
            if x.HasField("reshape"):
                d["reshape"] = list(x.reshape.shape)
        out.append(d)
    return out


def dump(doc: dict) -> str:
    """JSON with one tensor per line (readable diffs)."""
    lines = ["{", f' "source": {json.dumps(doc["source"])},', f' "commit": {json.dumps(doc["commit"])},', ' "models": {']
    for i, (m, v) in enumerate(doc["models"].items()):
        lines.append(f'  {json.dumps(m)}: {{')
        for j, io in enumerate(("inputs", "outputs")):
            lines.append(f'   "{io}": [')
            lines += [f"    {json.dumps(t)}" + ("," if k < len(v[io]) - 1 else "") for k, t in enumerate(v[io])]
            lines.append("   ]" + ("," if j == 0 else ""))
        lines.append("  }" + ("," if i < len(doc["models"]) - 1 else ""))
    lines += [" }", "}"]
    return "\n".join(lines) + "\n"


def main() -> None:
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--git-dir", required=True)
    ap.add_argument("--commit", default="c2e65b8")
    ap.add_argument("-o", "--out", default=str(OUT))
    a = ap.parse_args()
    full = subprocess.run(["git", f"--git-dir={a.git_dir}", "rev-parse", a.commit], check=True,
                          capture_output=True, text=True).stdout.strip()
    doc = {"source": "triton-inference-server/tensorrtllm_backend all_models/inflight_batcher_llm", "commit": full,
           "models": {}}
    for m in MODELS:
        text = subprocess.run(["git", f"--git-dir={a.git_dir}", "show", f"{full}:all_models/inflight_batcher_llm/{m}/config.pbtxt"],
                              check=True, capture_output=True, text=True).stdout
        text = text.replace("${logits_datatype}", "TYPE_FP32").replace("${encoder_input_features_data_type}", "TYPE_FP16")
        text = re.sub(r"decoupled:\s*\$\{decoupled_mode\}", "decoupled: true", text)
        text = re.sub(r"\$\{[A-Za-z_]+\}", "1", text)
        cfg = text_format.Parse(text, model_config_pb2.ModelConfig())
        doc["models"][m] = {"inputs": tensors(cfg.input, True), "outputs": tensors(cfg.output, False)}
    pathlib.Path(a.out).write_text(dump(doc))
    print(f"wrote {a.out}: " + ", ".join(f"{m} {len(v['inputs'])} in / {len(v['outputs'])} out"
                                       for m, v in doc["models"].items()))


if __name__ == "__main__":
    main()
