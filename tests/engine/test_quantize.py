"""`trtspec quantize`: real ModelOpt on the tiny pair, every format on CPU, every export read back.

Cost control (the suite runs on 2 shared cores): each format is quantized once per module
(4 × 64 calibration tokens, a small quality measurement) and the result is shared by the tests
that need it; the HF / TRT-LLM exports run on the 1-layer draft.
"""

from __future__ import annotations

import json
import pathlib
import shutil

import pytest
import torch
from click.testing import CliRunner
from safetensors import safe_open

from tests.conftest import worker_threads
from tests.greedy import plain_and_speculative
from trtspec.config import ModelSpec
from trtspec.errors import ConfigError, ModelError, StageError
from trtspec.quantize import (
    FORMATS,
    QualitySettings,
    Refused,
    check_combination,
    make_quantization,
    quantize_model,
    quantize_spec,
)

FAST = QualitySettings(eval_windows=2, eval_seq_len=64, prompts=2, prompt_tokens=24, max_new_tokens=8)
KV = {"fp8": "fp8", "int8_sq": "int8"}  # exercise both KV-cache formats on the way
ACTIVATIONS = {"fp8", "int8_sq", "w4a8_awq", "nvfp4"}  # formats that also quantize activations


@pytest.fixture(scope="module", autouse=True)
def _threads():
    prev = torch.get_num_threads()
    torch.set_num_threads(worker_threads())
    yield
    torch.set_num_threads(prev)


@pytest.fixture(scope="module")
def quantized_target(tiny_models, tmp_path_factory):
    """fmt → QuantizeResult of the tiny target (torch export, --pair the draft); quantized once."""
    target, draft = tiny_models
    root = tmp_path_factory.mktemp("quantized")
    done: dict = {}

    def get(fmt: str):
        if fmt == "nvfp4" and not nvfp4_backend_available():
            pytest.skip("this ModelOpt has no custom quantization backends: NVFP4 on CPU needs 0.47 "
                        "(test_nvfp4_on_cpu_needs_custom_backends checks the error)")
        if fmt not in done:  # FMT+int8_head: quantization.lm_head int8_wo as well
            base, _, head = fmt.partition("+")
            q = make_quantization(base, KV.get(base, "none"), calib_size=4, calib_seq_len=64,
                                  lm_head="int8_wo" if head == "int8_head" else "none")
            done[fmt] = quantize_model(target, q, "torch", root / f"target-{fmt}", pair=draft, quality=FAST)
        return done[fmt]

    return get


def nvfp4_backend_available() -> bool:
    from trtspec.quantize.nvfp4_cpu import register

    return register()


def test_nvfp4_on_cpu_needs_custom_backends(tiny_models, tmp_path):
    """Where ModelOpt has no custom quantization backends (0.37, NVIDIA's TRT-LLM 1.2 container),
    NVFP4 on CPU is refused with the version and the fix, and nothing is written."""
    if nvfp4_backend_available():
        pytest.skip("this ModelOpt has custom backends (0.47): NVFP4 runs on CPU, tested above")
    out = tmp_path / "q"
    with pytest.raises(Exception) as e:
        quantize_model(tiny_models[1], make_quantization("nvfp4", calib_size=4, calib_seq_len=64), "torch", out,
                       quality=FAST)
    assert "custom quantization backends" in str(e.value) and "0.47" in str(e.value)
    _no_leftovers(out)


def _no_leftovers(out: pathlib.Path) -> None:
    assert not out.exists()
    assert not list(out.parent.glob(f".{out.name}.tmp-*")), "a temporary export folder was left behind"


# --------------------------------------------------------------------------------------------
# every format on CPU: torch export restores, matches ModelOpt, serves with speculation


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_format_quantizes_and_torch_export_restores(fmt, quantized_target, tiny_models):
    import modelopt.torch.opt as mto
    from transformers import AutoModelForCausalLM

    from trtspec.quantize.runtime import load_quantized, prepare_modelopt, quiet
    from trtspec.speculative.model import load_causal_lm

    target, _ = tiny_models
    res = quantized_target(fmt)
    out = res.out_dir
    m = json.loads((out / "trtspec.json").read_text())
    assert (m["kind"], m["export"], m["format"], m["kv_cache"]) == ("quantized", "torch", fmt, KV.get(fmt, "none"))
    import modelopt

    # the installed ModelOpt's version is recorded
    assert m["modelopt_version"] == modelopt.__version__ and len(m["source"]["sha256"]) == 64
    assert m["calibration"]["dataset"] == "builtin" and m["calibration"]["tokens"] == 4 * 64
    assert m["role"] == "target"

    q = json.loads((out / "quality.json").read_text())
    assert 0.8 <= q["top1_agreement"] <= 1.0 and q["kl_divergence"] >= 0
    assert abs(q["perplexity_change_pct"]) < 10
    assert q["runtime_vs_modelopt_max_abs_diff"] < 1e-4
    acc = q["acceptance"]
    assert acc["quantized"] == "target" and acc["before"]["drafted"] > 0 and acc["after"]["drafted"] > 0
    assert acc["speculative_greedy_identical"] is True
    tf = acc["teacher_forced_agreement"]
    assert 0.2 < tf["before"] <= 1 and abs(tf["after"] - tf["before"]) < 0.2

    # the export restores onto our CausalLM with quantizers active (weights folded: quantized once)
    model = load_quantized(out, kernels="emulated")
    enabled = {n.rsplit(".", 1)[-1] for n, mod in model.named_modules() if n.endswith("_quantizer") and mod.is_enabled}
    assert ("input_quantizer" in enabled) == (fmt in ACTIVATIONS), enabled
    assert ("k_bmm_quantizer" in enabled) == (fmt in KV), enabled
    base = load_causal_lm(target)
    w, w0 = model.model.layers[0].mlp.down_proj.weight, base.model.layers[0].mlp.down_proj.weight
    assert not torch.equal(w, w0)  # fake-quantized (SmoothQuant/AWQ also rescale it)
    # ... and computes what ModelOpt's own fake-quant HF model restored from the same state computes
    prepare_modelopt()
    with quiet():
        hf = mto.restore(AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32), str(out / "modelopt_state.pth"))
    x = torch.randint(0, model.args.vocab_size, (2, 48), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        ours, ref = model(x, None), hf(input_ids=x).logits
    assert (ours - ref).abs().max() < 1e-4 * max(1.0, float(ref.abs().max()))


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_quantized_target_speculative_greedy_equals_plain(fmt, quantized_target, tiny_models):
    """The export served by the torch runtime: loaded through ``load_model`` (manifest dispatch),
    plain greedy (Engine without proposer) == speculative greedy (Engine + DraftModelProposer)."""
    from transformers import AutoTokenizer

    from trtspec.prompts import stdlib_snippets
    from trtspec.speculative.runtime import load_model

    from trtspec.config import NATIVE_KERNELS
    from trtspec.speculative.model import Int4Linear, Int8Linear

    _, draft_dir = tiny_models
    out = quantized_target(fmt).out_dir
    target = load_model(str(out), torch.float32, torch.device("cpu"))  # quantized_kernels: native
    native = (fmt, "cpu") in NATIVE_KERNELS
    assert any(type(m).__name__ == "QuantLinear" for m in target.modules()) == (not native)
    assert any(isinstance(m, (Int8Linear, Int4Linear)) for m in target.modules()) == native
    draft = load_model(str(draft_dir), torch.float32, torch.device("cpu"))
    tok = AutoTokenizer.from_pretrained(str(out))  # the export carries the tokenizer
    prompts = [tok(p, add_special_tokens=False)["input_ids"][:32] for p in stdlib_snippets(2)]
    plain, spec = plain_and_speculative(target, draft, prompts, max_tokens=14, max_seq_len=64)
    assert [g.token_ids for g in spec] == [g.token_ids for g in plain]
    assert sum(g.stats.accepted for g in spec) > 0


def test_int8_wo_target_runs_on_int8_kernels_with_the_checkpoints_own_values(quantized_target):
    """runtime.quantized_kernels native: the INT8 weight-only export runs on Int8Linear (torch's
    INT8-weight kernel) with ModelOpt's own INT8 values (round(w * 127 / amax), the grid its
    fake-quant computes with: no second quantization), and its logits stay within bf16-activation
    rounding of the fake-quant model; emulated keeps ModelOpt's fake-quant."""
    from trtspec.quantize.runtime import load_quantized
    from trtspec.speculative.model import Int8Linear

    out = quantized_target("int8_wo").out_dir
    native, emulated = load_quantized(out), load_quantized(out, kernels="emulated")
    assert native.weight_only == "int8" and not native.modelopt_quantized and emulated.modelopt_quantized
    for i, layer in enumerate(native.model.layers):
        ref = emulated.model.layers[i]
        for lin, parts in ((layer.self_attn.fused, [ref.self_attn.q_proj, ref.self_attn.k_proj, ref.self_attn.v_proj]),
                           (layer.mlp.fused, [ref.mlp.gate_proj, ref.mlp.up_proj]),
                           (layer.self_attn.o_proj, [ref.self_attn.o_proj]), (layer.mlp.down_proj, [ref.mlp.down_proj])):
            assert isinstance(lin, Int8Linear)
            folded = torch.cat([p.weight for p in parts])  # ModelOpt's fake-quantized weights (q * amax / 127)
            amax = folded.abs().amax(1)  # the per-channel range: the max |q| of a row is 127
            assert torch.equal(lin.qweight.float(), torch.round(folded * (127.0 / amax)[:, None]))
            assert lin.qweight.abs().amax() == 127
    x = torch.randint(0, native.args.vocab_size, (2, 48), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        a, b = native(x, None), emulated(x, None)
    assert (a - b).abs().max() < 0.05 * float(b.abs().max())  # bf16 activations in the INT8 kernel
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() > 0.97


@pytest.mark.parametrize("fmt", ["int4_wo", "int4_awq"])
def test_int4_target_runs_on_int4_kernels_with_the_checkpoints_own_values(fmt, quantized_target):
    """runtime.quantized_kernels native for INT4 weight-only (blocks of 128) and INT4-AWQ: the
    export runs on Int4Linear (torch's CPU INT4 kernel) with ModelOpt's own INT4 values
    (round(w * 7 / amax) per block, read back from its fake-quant grid: no second quantization)
    and, for AWQ, its activation pre-scales; logits within bf16-activation rounding of ModelOpt's
    fake-quant, the same greedy tokens."""
    from trtspec.quantize.runtime import load_quantized
    from trtspec.speculative.model import Int4Linear

    out = quantized_target(fmt).out_dir
    native, emulated = load_quantized(out), load_quantized(out, kernels="emulated")
    assert native.weight_only == "int4" and not native.modelopt_quantized and emulated.modelopt_quantized
    awq = fmt == "int4_awq"
    for i, layer in enumerate(native.model.layers):
        ref = emulated.model.layers[i]
        if awq:  # one AWQ pre-scale per projection: q, k, v, gate and up keep their own matmul
            pairs = [(getattr(layer.self_attn, n), [getattr(ref.self_attn, n)]) for n in ("q_proj", "k_proj", "v_proj")]
            pairs += [(getattr(layer.mlp, n), [getattr(ref.mlp, n)]) for n in ("gate_proj", "up_proj")]
        else:
            pairs = [(layer.self_attn.fused, [ref.self_attn.q_proj, ref.self_attn.k_proj, ref.self_attn.v_proj]),
                     (layer.mlp.fused, [ref.mlp.gate_proj, ref.mlp.up_proj])]
        for lin, parts in pairs + [(layer.self_attn.o_proj, [ref.self_attn.o_proj]),
                                   (layer.mlp.down_proj, [ref.mlp.down_proj])]:
            assert isinstance(lin, Int4Linear) and (lin.pre_quant_scale is not None) == awq
            folded = torch.cat([p.weight for p in parts])  # ModelOpt's fake-quantized weights (q * amax / 7)
            out_f, in_f = folded.shape
            blocks = folded.view(out_f, in_f // 128, 128)
            assert torch.allclose(lin.qweight.float().view_as(blocks) * lin.scales.float()[..., None], blocks,
                                  rtol=1e-2, atol=1e-6)  # the same grid, with the scales in bf16
            assert lin.qweight.min() >= -8 and lin.qweight.max() <= 7
    x = torch.randint(0, native.args.vocab_size, (2, 48), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        a, b = native(x, None), emulated(x, None)
    assert (a - b).abs().max() < 0.05 * float(b.abs().max())  # bf16 activations in the INT4 kernel
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() > 0.97


def test_int8_lm_head_under_an_int4_body_makes_speculation_bit_identical(quantized_target):
    """quantization.lm_head int8_wo: ModelOpt quantizes the LM head too (its own INT8 values and
    per-channel ranges, read back from its fake-quant grid), the native model runs it on
    Int8Linear under an INT4 body, and with runtime.batch_invariant the bf16 target's speculative
    greedy output is token for token its plain greedy output (every linear row-invariant, the
    attention per query row; tests/unit/test_batch_invariance.py shows what that changes at
    Qwen2.5's attention shape, where the tiny target's would not show it)."""
    from transformers import AutoTokenizer

    from trtspec.prompts import stdlib_snippets
    from trtspec.quantize.runtime import load_quantized
    from trtspec.speculative.model import Int4Linear, Int8Linear

    res = quantized_target("int4_wo+int8_head")
    m = json.loads((res.out_dir / "trtspec.json").read_text())
    assert m["lm_head"] == "int8_wo" and m["format"] == "int4_wo"
    assert m["key"] != quantized_target("int4_wo").manifest["key"]  # a different artifact, not a cache hit
    assert {"quantizer_name": "*lm_head*weight_quantizer", "cfg": {"num_bits": 8, "axis": 0}} in m["modelopt_config"]["quant_cfg"]
    native, emulated = load_quantized(res.out_dir), load_quantized(res.out_dir, kernels="emulated")
    assert native.weight_only == "int4" and isinstance(native.model.layers[0].mlp.down_proj, Int4Linear)
    head = native.lm_head
    assert isinstance(head, Int8Linear)
    folded = emulated.lm_head.weight  # ModelOpt's fake-quantized head: q * amax / 127 per output channel
    assert torch.equal(head.qweight.float(), torch.round(folded * (127.0 / folded.abs().amax(1))[:, None]))

    native = load_quantized(res.out_dir, dtype=torch.bfloat16).batch_invariant_(True)  # as deployed on CPU
    draft = load_quantized(quantized_target("int8_wo").out_dir, dtype=torch.bfloat16)  # a different model: real rejections
    tok = AutoTokenizer.from_pretrained(str(res.out_dir))
    prompts = [tok(p, add_special_tokens=False)["input_ids"][:32] for p in stdlib_snippets(3)]
    plain, spec = plain_and_speculative(native, draft, prompts, max_tokens=24, max_seq_len=72)
    assert [g.token_ids for g in spec] == [g.token_ids for g in plain]
    assert 0 < sum(g.stats.accepted for g in spec) < sum(g.stats.drafted for g in spec)


def test_lm_head_is_refused_where_the_torch_runtime_does_not_run_it(tiny_models, tmp_path):
    from trtspec.cli import main

    with pytest.raises(ConfigError, match=r"quantization\.lm_head.*torch runtime only") as e:
        check_combination("int4_awq", export="hf", lm_head="int8_wo")
    assert "--export torch" in e.value.fix
    with pytest.raises(ConfigError, match=r"quantization\.lm_head.*int4"):
        make_quantization("int4_wo", lm_head="int4")
    out = tmp_path / "out"
    r = CliRunner().invoke(main, ["quantize", "--model", str(tiny_models[1]), "--format", "int4_wo", "--lm-head",
                                  "int8_wo", "--export", "trtllm", "-o", str(out)])
    assert r.exit_code == 2 and "quantization.lm_head" in r.output, r.output
    _no_leftovers(out)


def test_nvfp4_cpu_emulation_equals_modelopt_real_quantization():
    if not nvfp4_backend_available():
        pytest.skip("this ModelOpt has no custom quantization backends (NVFP4 on CPU needs 0.47)")
    from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor

    from trtspec.quantize.nvfp4_cpu import nvfp4_fake_quant

    w = torch.randn(64, 256, generator=torch.Generator().manual_seed(0)) * 0.05
    w[0, :16] = 0  # an all-zero block
    w[1, :16] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] * 2) * 0.01  # E2M1 ties
    amax = w.abs().amax()
    q, scale, scale2 = NVFP4QTensor.quantize(w, 16, weights_scaling_factor_2=amax / (6 * 448))
    ref = q.dequantize(dtype=torch.float32, scale=scale, double_scale=scale2, block_sizes={-1: 16})
    assert torch.equal(nvfp4_fake_quant(w, amax), ref)


# --------------------------------------------------------------------------------------------
# HF and TRT-LLM exports load back (on the 1-layer draft: fast)


def test_hf_export_from_recipe_spec(tiny_models, tmp_path):
    """The pipeline's call: a recipe ModelSpec, the export its runtime consumes, reused when current."""
    _, draft = tiny_models
    spec = ModelSpec(model=str(draft), quantization={"format": "fp8", "kv_cache": "fp8",
                                                      "calibration": {"size": 4, "seq_len": 64}})
    out = tmp_path / "draft-fp8"
    res = quantize_spec(spec, out, backend="trtllm-pytorch", quality=None)
    assert res.export == "hf" and not res.cached
    assert res.quality is None and not (out / "quality.json").exists()
    again = quantize_spec(spec, out, backend="trtllm-pytorch", quality=None)
    assert again.cached and again.manifest["key"] == res.manifest["key"]
    hq = json.loads((out / "hf_quant_config.json").read_text())["quantization"]
    assert (hq["quant_algo"], hq["kv_cache_quant_algo"]) == ("FP8", "FP8")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quantization_config"]["quant_method"] == "modelopt"
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        assert f.get_tensor("model.layers.0.mlp.down_proj.weight").dtype == torch.float8_e4m3fn
    for k in ("weight_scale", "input_scale"):
        assert f"model.layers.0.self_attn.q_proj.{k}" in keys
    assert {"model.layers.0.self_attn.k_proj.k_scale", "model.layers.0.self_attn.v_proj.v_scale"} <= keys
    assert (out / "tokenizer.json").is_file()
    m = json.loads((out / "trtspec.json").read_text())
    assert (m["export"], m["quant_algo"], m["kv_cache_quant_algo"], m["role"]) == ("hf", "FP8", "FP8", "draft")


def test_trtllm_export_loads_back(tiny_models, tmp_path):
    _, draft = tiny_models
    out = tmp_path / "draft-int8sq"
    q = make_quantization("int8_sq", "int8", calib_size=4, calib_seq_len=64)
    quantize_model(draft, q, "trtllm", out, quality=None)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architecture"] == "LlamaForCausalLM" and cfg["mapping"]["tp_size"] == 1
    assert cfg["quantization"]["quant_algo"] == "W8A8_SQ_PER_CHANNEL"
    assert cfg["quantization"]["kv_cache_quant_algo"] == "INT8"
    with safe_open(str(out / "rank0.safetensors"), "pt") as f:
        assert f.get_tensor("transformer.layers.0.attention.qkv.weight").dtype == torch.int8
        assert "transformer.layers.0.attention.qkv.activation_scaling_factor" in set(f.keys())
    m = json.loads((out / "trtspec.json").read_text())
    assert (m["export"], m["checkpoint_dtype"], m["tensor_parallel"]) == ("trtllm", "float16", 1)


def test_cli_quantize_draft_with_pair(tiny_models, tmp_path):
    from trtspec.cli import main

    target, draft = tiny_models
    out = tmp_path / "cli-draft-int8wo"
    r = CliRunner().invoke(main, [
        "quantize", "--model", str(draft), "--format", "int8_wo", "--export", "hf", "-o", str(out),
        "--pair", str(target), "--calib-size", "4", "--calib-seq-len", "64", "--eval-windows", "2",
        "--eval-seq-len", "64", "--prompts", "2", "--max-new-tokens", "8", "--threads", "2",
    ])
    assert r.exit_code == 0, r.output
    assert "top-1 agreement" in r.output and "acceptance rate" in r.output
    q = json.loads((out / "quality.json").read_text())
    assert q["acceptance"]["quantized"] == "draft" and q["role"] == "draft"
    assert json.loads((out / "hf_quant_config.json").read_text())["quantization"]["quant_algo"] == "W8A16"


# --------------------------------------------------------------------------------------------
# bad input: clear errors, nothing half-written


def test_missing_model_folder(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(ModelError, match="model folder not found"):
        quantize_model(tmp_path / "nope", make_quantization("fp8"), "hf", out)
    _no_leftovers(out)


def test_unknown_format_library_and_cli(tiny_models, tmp_path):
    from trtspec.cli import main

    with pytest.raises(ConfigError, match=r"quantization\.format.*fp9") as e:
        make_quantization("fp9")
    assert "nvfp4" in e.value.fix
    with pytest.raises(ConfigError, match=r"quantization\.kv_cache"):
        make_quantization("fp8", "fp4")
    out = tmp_path / "out"
    r = CliRunner().invoke(main, ["quantize", "--model", str(tiny_models[0]), "--format", "fp9", "--export", "hf", "-o", str(out)])
    assert r.exit_code == 2 and "quantization.format" in r.output and "int4_awq" in r.output
    _no_leftovers(out)


def test_empty_and_short_calibration_files(tiny_models, tmp_path):
    out = tmp_path / "out"
    empty = tmp_path / "calib.jsonl"
    empty.write_text("\n")
    with pytest.raises(ConfigError, match=r"calibration\.dataset.*empty"):
        quantize_model(tiny_models[1], make_quantization("fp8", calib=str(empty)), "torch", out)
    _no_leftovers(out)
    short = tmp_path / "short.txt"
    short.write_text("x = 1\n")
    with pytest.raises(ConfigError, match=r"fewer than seq_len=64 tokens"):
        quantize_model(tiny_models[1], make_quantization("int8_wo", calib=str(short), calib_seq_len=64), "torch", out,
                       quality=None)
    _no_leftovers(out)


def test_unsupported_architecture(tiny_models, tmp_path):
    src = tmp_path / "gpt2"
    shutil.copytree(tiny_models[1], src)
    cfg = json.loads((src / "config.json").read_text())
    cfg["architectures"], cfg["model_type"] = ["GPT2LMHeadModel"], "gpt2"
    (src / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "out"
    with pytest.raises(ModelError, match=r"GPT2LMHeadModel.*LlamaForCausalLM"):
        quantize_model(src, make_quantization("fp8"), "hf", out)
    _no_leftovers(out)


def test_failure_after_export_leaves_nothing(tiny_models, tmp_path):
    """The pair only fails to load in the quality stage, after the export was written: the
    temporary folder goes, OUT never appears."""
    pair = tmp_path / "broken-target"
    shutil.copytree(tiny_models[0], pair)
    (pair / "model.safetensors").write_bytes(b"not a safetensors file")
    out = tmp_path / "out"
    with pytest.raises((ModelError, StageError), match="cannot read the weights|no output folder was written"):
        quantize_model(tiny_models[1], make_quantization("int8_wo", calib_size=4, calib_seq_len=64), "torch", out,
                       pair=pair, quality=FAST)
    _no_leftovers(out)


def test_refuses_to_replace_a_foreign_folder(tiny_models, tmp_path):
    out = tmp_path / "important"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(ConfigError, match="refusing to replace"):
        quantize_model(tiny_models[1], make_quantization("fp8"), "torch", out)
    assert (out / "notes.txt").read_text() == "keep me"
    with pytest.raises(ConfigError, match="is the --model folder"):
        quantize_model(tiny_models[1], make_quantization("fp8"), "torch", tiny_models[1])


def test_refused_combinations(tiny_models, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(Refused, match="Blackwell") as e:
        quantize_model(tiny_models[1], make_quantization("nvfp4"), "hf", out, gpu_arch="hopper")
    assert e.value.field == "quantization.format" and "--force" in e.value.fix
    with pytest.raises(Refused, match="PyTorch flow does not load INT8 SmoothQuant"):
        quantize_model(tiny_models[1], make_quantization("int8_sq"), "hf", out)
    _no_leftovers(out)
    with pytest.raises(Refused, match="TRT-LLM#3207"):
        check_combination("int8_sq", role="eagle3_head", export="torch")
    with pytest.raises(Refused, match="FP8 tensor cores"):
        check_combination("int4_awq", "fp8", gpu_arch="ampere")
    with pytest.raises(ConfigError, match="no exporter"):
        check_combination("fp8", role="eagle3_head", export="trtllm", force=True)
    warnings = check_combination("nvfp4", gpu_arch="hopper", force=True)
    assert any(w.startswith("forced:") and "Blackwell" in w for w in warnings)
    assert any("needs Blackwell" in w for w in check_combination("nvfp4"))
    assert check_combination("fp8", "fp8", gpu_arch="hopper", export="hf") == []


# --------------------------------------------------------------------------------------------
# an EAGLE-3 head, quantized on its own against its (unquantized) target


@pytest.fixture(scope="module")
def eagle3_head_dir(tiny_models, tmp_path_factory) -> pathlib.Path:
    """A small-random-weight EAGLE-3 head for the tiny target (quantization does not need a
    trained head; acceptance is then ~0, and greedy output must still equal the target's)."""
    from dataclasses import replace

    from trtspec.speculative.eagle3 import Eagle3Head, HeadConfig, default_aux_layers, save_head
    from trtspec.speculative.model import load_causal_lm

    target = load_causal_lm(tiny_models[0])
    cfg = HeadConfig(replace(target.args, num_hidden_layers=1), default_aux_layers(target.args.num_hidden_layers))
    head = Eagle3Head(cfg, target.model.embed_tokens, target.lm_head)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for _, p in head.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.02 if p.dim() == 2 else torch.ones_like(p))
    folder = tmp_path_factory.mktemp("eagle3") / "head"
    save_head(head, folder)
    return folder


def test_eagle3_head_quantizes_exports_and_drafts(eagle3_head_dir, tiny_models, tmp_path):
    from trtspec.speculative.eagle3 import Eagle3Proposer, load_eagle3_head
    from trtspec.speculative.runtime import load_model
    from trtspec.speculative.engine import Engine
    from trtspec.speculative.model import load_causal_lm
    from trtspec.sampling import Sampling

    target_dir = tiny_models[0]
    q = make_quantization("fp8", "fp8", calib_size=4, calib_seq_len=64)
    res = quantize_model(eagle3_head_dir, q, "torch", tmp_path / "head-torch", pair=target_dir, quality=FAST)
    assert res.role == "eagle3_head" and res.manifest["target"]["path"] == str(target_dir.resolve())
    rep = res.quality
    assert rep["acceptance"]["quantized"] == "eagle3_head" and rep["acceptance"]["after"]["drafted"] > 0
    assert rep["runtime_vs_modelopt_max_abs_diff"] < 1e-4 and rep["top1_agreement"] > 0.5

    target = load_causal_lm(target_dir)
    head = load_eagle3_head(res.out_dir, target)  # the runtime's loader sees the manifest: fake-quant
    assert head.fc.input_quantizer.is_enabled and head.layers[0].self_attn.k_bmm_quantizer.is_enabled
    prompts = [[5, 17, 99, 250, 31, 7], [400, 12, 3, 3, 81]]
    params = Sampling(max_tokens=12, ignore_eos=True)
    plain = Engine(target, None, max_batch_size=2, max_seq_len=64).generate(prompts, params)
    spec = Engine(target, Eagle3Proposer(head, 2, 72), max_draft_len=3, max_batch_size=2, max_seq_len=64).generate(prompts, params)
    assert [g.token_ids for g in spec] == [g.token_ids for g in plain]

    out = tmp_path / "head-hf"
    quantize_model(eagle3_head_dir, q, "hf", out, pair=target_dir, quality=None)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["quantization_config"]["quant_algo"] == "FP8"
    hq = json.loads((out / "hf_quant_config.json").read_text())["quantization"]
    assert (hq["quant_algo"], hq["kv_cache_quant_algo"], hq["exclude_modules"]) == ("FP8", "FP8", ["lm_head"])
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert f.get_tensor("fc.weight").dtype == torch.float8_e4m3fn
        assert f.get_tensor("layers.0.self_attn.q_proj.weight").dtype == torch.float8_e4m3fn
        assert f.get_tensor("lm_head.weight").dtype == torch.float32
        assert {"fc.weight_scale", "fc.input_scale", "layers.0.self_attn.k_proj.k_scale"} <= set(f.keys())
    # an hf export is for TRT-LLM/vLLM: the torch runtime refuses it with the fix, not with garbage
    with pytest.raises(ModelError, match="not a torch export"):
        load_eagle3_head(out, target)
    with pytest.raises(ModelError, match="export is for TRT-LLM"):
        load_model(str(out), torch.float32, torch.device("cpu"))


def test_eagle3_head_bad_input(eagle3_head_dir, tiny_models, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match="pass the head's target: --pair"):
        quantize_model(eagle3_head_dir, make_quantization("fp8"), "torch", out)
    with pytest.raises(Refused, match="TRT-LLM#3207"):
        quantize_model(eagle3_head_dir, make_quantization("int8_sq"), "torch", out, pair=tiny_models[0])
    with pytest.raises(ConfigError, match="no exporter"):
        quantize_model(eagle3_head_dir, make_quantization("fp8"), "trtllm", out, pair=tiny_models[0])
    _no_leftovers(out)


def test_calibration_sets(tiny_models, tmp_path):
    from transformers import AutoTokenizer

    from trtspec.quantize.calib import calibration_windows, heldout_windows

    tok = AutoTokenizer.from_pretrained(str(tiny_models[0]))
    a, b = calibration_windows("builtin", tok, 3, 32), calibration_windows("builtin", tok, 3, 32)
    assert a.ids.shape == (3, 32) and torch.equal(a.ids, b.ids)  # deterministic
    assert "train split" in a.description["text"] and a.description["sha256_16"] == b.description["sha256_16"]
    assert heldout_windows(tok, 2, 32).description["sha256_16"] != a.description["sha256_16"]

    f = tmp_path / "calib.jsonl"
    f.write_text(json.dumps({"prompt": "def add(a, b):\n    return a + b\n" * 8}) + "\n" + json.dumps("import os\n" * 20) + "\n")
    w = calibration_windows(str(f), tok, 4, 16)
    assert w.ids.shape[1] == 16 and 1 <= w.ids.shape[0] <= 4 and w.description["dataset"] == str(f.resolve())
    f.write_text('{"text": "ok"}\n{"text": 3}\n')
    with pytest.raises(ConfigError, match=r"calib\.jsonl:2"):
        calibration_windows(str(f), tok, 4, 16)
    with pytest.raises(ConfigError, match="calibration file not found"):
        calibration_windows(str(tmp_path / "missing.txt"), tok, 4, 16)


def test_bfloat16_model_matches_modelopt_exactly(tiny_models, tmp_path):
    """A bf16 checkpoint is calibrated, measured and served in bf16: our runtime's fake-quant
    equals ModelOpt's bit for bit (quantized and unquantized sides in the same dtype)."""
    from trtspec.quantize.runtime import load_quantized

    target, draft = tiny_models
    q = make_quantization("fp8", "fp8", calib_size=4, calib_seq_len=64)
    res = quantize_model(draft, q, "torch", tmp_path / "bf16", pair=target, dtype="bfloat16", quality=FAST)
    assert res.manifest["dtype"] == "bfloat16"
    assert res.quality["runtime_vs_modelopt_max_abs_diff"] == 0.0
    assert load_quantized(res.out_dir, dtype=torch.bfloat16).lm_head.weight.dtype == torch.bfloat16
