"""Calibration sources (issue 22): datasets saved to disk in the test, the loader, the sizes, the
held-out split, the TRT-LLM plan's arguments, `trtspec check`'s lines, and every bad input as an
error naming the field. No hub here: the one named-dataset case runs offline against an empty cache.
"""

from __future__ import annotations

import copy
import re
import json
import os
import pathlib
import subprocess
import sys

import pytest

from trtspec import calib_sources as S
from trtspec.config import Calibration, load_recipe, parse_recipe
from trtspec.errors import ConfigError, ConfigErrors
from trtspec.trtllm.plan import make_plan

datasets = pytest.importorskip("datasets")

REPO = pathlib.Path(__file__).resolve().parents[2]


def _rows(n: int) -> list[str]:
    # a marker per row so a test can tell which rows ended up where
    return [f"row{i:03d} " + f"the quick brown fox number {i} jumps over the lazy dog. " * 6 for i in range(n)]


@pytest.fixture
def saved_dataset(tmp_path) -> pathlib.Path:
    """A DatasetDict written with save_to_disk: train + validation, a 'body' column and a number column."""
    d = datasets.DatasetDict({
        "train": datasets.Dataset.from_dict({"body": _rows(40), "n": list(range(40))}),
        "validation": datasets.Dataset.from_dict({"body": _rows(12), "n": list(range(12))}),
    })
    out = tmp_path / "saved"
    d.save_to_disk(str(out))
    return out


@pytest.fixture
def tokenizer():
    from trtspec.checkpoints.tiny import train_tokenizer

    return train_tokenizer(_rows(50), 300)


# --------------------------------------------------------------------------------------------
# sizes and names


def test_sizes_default_to_modelopt_for_real_sources_and_stay_small_for_builtin():
    assert (Calibration().size, Calibration().seq_len) == (64, 128)
    for name in ("cnn_dailymail", "pileval", "org/chat-logs", "/data/calib.jsonl"):
        c = Calibration(dataset=name)
        assert (c.size, c.seq_len) == (512, 512), name
    assert Calibration(dataset="cnn_dailymail", size=8).seq_len == 512  # only what is unset defaults


def test_an_unknown_dataset_is_a_schema_error_naming_the_field():
    d = {"name": "t", "target": {"model": "/m", "quantization": {"format": "fp8",
                                                                  "calibration": {"dataset": "cnn_daily"}}},
         "speculation": {"method": "none"}}
    with pytest.raises(ConfigErrors, match=r"target\.quantization\.calibration\.dataset.*cnn_daily.*cnn_dailymail"):
        parse_recipe(d)


def test_resolve_kinds(tmp_path, saved_dataset):
    f = tmp_path / "c.jsonl"
    f.write_text('{"text": "x"}\n')
    assert S.resolve("builtin").kind == "builtin"
    n = S.resolve("cnn_dailymail")
    assert (n.kind, n.hf_id, n.config, n.split, n.column) == ("named", "abisee/cnn_dailymail", "3.0.0", "train", "article")
    assert S.resolve("pileval").split == "validation"
    h = S.resolve("hf://org/chat", "test", "prompt")
    assert (h.kind, h.hf_id, h.split, h.column) == ("hub", "org/chat", "test", "prompt")
    assert S.resolve(str(saved_dataset)).kind == "folder" and S.resolve(str(f)).kind == "file"
    with pytest.raises(ConfigError, match=r"calibration file not found") as e:
        S.resolve(str(tmp_path / "nothing" / "here.jsonl"))
    assert e.value.field == S.FIELD
    with pytest.raises(ConfigError, match=r"no file or folder at") as e:
        S.resolve(str(tmp_path / "no-such-folder"))
    with pytest.raises(ConfigError, match=r"calibration file not found"):
        S.resolve("data/missing.jsonl")  # relative, org/name-shaped, but a file name: not a hub id
    with pytest.raises(ConfigError, match="no splits or columns") as e:
        S.resolve(str(f), column="body")
    assert e.value.field == S.COLUMN_FIELD


def test_relative_paths_resolve_against_the_recipe_but_names_and_ids_stay(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "calib.jsonl").write_text('{"text": "hello"}\n')
    r = tmp_path / "r.yaml"
    for value, want in (("data/calib.jsonl", str(tmp_path / "data" / "calib.jsonl")),
                        ("cnn_dailymail", "cnn_dailymail"), ("org/chat-logs", "org/chat-logs")):
        r.write_text(json.dumps({"name": "t", "target": {"model": "m", "quantization": {
            "format": "fp8", "calibration": {"dataset": value}}}, "speculation": {"method": "none"}}))
        assert load_recipe(r).target.quantization.calibration.dataset == want


# --------------------------------------------------------------------------------------------
# reading: save_to_disk folders, train-split folders, columns, splits, held-out rows


def test_save_to_disk_folder_with_split_and_column(saved_dataset):
    src = S.resolve(str(saved_dataset), None, "body")
    calib, held = S.split_texts(src, calib_tokens=10**6, heldout_tokens=10**6)  # everything
    assert len(calib) == 36 and len(held) == 4
    assert {t[:6] for t in held} == {"row009", "row019", "row029", "row039"}
    assert not {t[:6] for t in held} & {t[:6] for t in calib}
    val = S.resolve(str(saved_dataset), "validation", "body")
    assert len(list(S.iter_texts(val))) == 12


def test_a_column_or_split_that_does_not_exist_names_the_field_value_and_fix(saved_dataset):
    with pytest.raises(ConfigError) as e:
        list(S.iter_texts(S.resolve(str(saved_dataset))))  # default column 'text' is not there
    assert e.value.field == S.COLUMN_FIELD and e.value.value == "text"
    assert "columns: body, n" in str(e.value) and "set column: one of body, n" in str(e.value)
    with pytest.raises(ConfigError, match="holds int values") as e:
        list(S.iter_texts(S.resolve(str(saved_dataset), None, "n")))
    with pytest.raises(ConfigError, match="splits: train, validation") as e:
        list(S.iter_texts(S.resolve(str(saved_dataset), "test", "body")))
    assert e.value.field == S.SPLIT_FIELD


def test_a_plain_dataset_saved_with_save_to_disk_and_a_train_split_folder(tmp_path):
    plain = tmp_path / "plain"
    datasets.Dataset.from_dict({"text": _rows(5)}).save_to_disk(str(plain))
    assert len(list(S.iter_texts(S.resolve(str(plain))))) == 5
    # a folder with a train split in data files: what TRT-LLM's quantize.py reads as load_dataset(DIR, split="train")
    folder = tmp_path / "jsonl-folder"
    folder.mkdir()
    (folder / "train.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in _rows(3)))
    assert [t[:6] for t in S.iter_texts(S.resolve(str(folder)))] == ["row000", "row001", "row002"]


def test_chat_messages_are_joined_into_text(tmp_path):
    chat = tmp_path / "chat"
    msgs = [[{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": f"answer {i}"}]
            for i in range(3)]
    datasets.Dataset.from_dict({"messages": msgs}).save_to_disk(str(chat))
    texts = list(S.iter_texts(S.resolve(str(chat), None, "messages")))
    assert texts[1] == "question 1\nanswer 1"


def test_calibration_and_heldout_windows_come_from_disjoint_rows(saved_dataset, tokenizer):
    from trtspec.quantize.calib import calibration_windows, heldout_prompts, heldout_windows

    cal = calibration_windows(str(saved_dataset), tokenizer, 4, 32, column="body")
    assert tuple(cal.ids.shape) == (4, 32)
    assert cal.description["kind"] == "folder" and cal.description["column"] == "body"
    assert cal.description["split"] == "train" and cal.description["tokens"] == 4 * 32
    held = heldout_windows(tokenizer, 2, 32, dataset=str(saved_dataset), column="body")
    assert "held-out text of local dataset folder" in held.description["text"]
    text = tokenizer.decode(held.ids.flatten().tolist())
    markers = {m for m in text.split() if m.startswith("row")}
    assert markers and all(int(m[3:6]) % 10 == 9 for m in markers)  # only held-out rows
    cal_markers = {m for m in tokenizer.decode(cal.ids.flatten().tolist()).split() if m.startswith("row")}
    assert cal_markers and not any(int(m[3:6]) % 10 == 9 for m in cal_markers)
    prompts, what = heldout_prompts(3, dataset=str(saved_dataset), column="body")
    assert len(prompts) == 3 and all(int(p[3:6]) % 10 == 9 for p in prompts) and "held-out rows" in what


def test_a_named_dataset_offline_without_cache_names_what_to_download(tmp_path):
    # a fresh interpreter: datasets reads HF_HUB_OFFLINE when it is imported
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    code = ("from trtspec import calib_sources as S\nfrom trtspec.errors import ConfigError\n"
            "try:\n    next(S.iter_texts(S.resolve('cnn_dailymail')))\n"
            "except ConfigError as e:\n    print('FIELD', e.field); print('ERR', e)\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert "FIELD quantization.calibration.dataset" in out.stdout, out.stderr[-2000:]
    assert "abisee/cnn_dailymail 3.0.0" in out.stdout and "HF_HUB_OFFLINE=1" in out.stdout
    assert "load_dataset('abisee/cnn_dailymail', '3.0.0', split='train')" in out.stdout  # what to download
    assert "save_to_disk" in out.stdout


# --------------------------------------------------------------------------------------------
# the TRT-LLM plan's arguments

ENGINE = {
    "name": "t",
    "target": {"model": "/m/target", "quantization": {"format": "fp8", "kv_cache": "fp8"}},
    "speculation": {"method": "none"},
    "runtime": {"backend": "trtllm-engine", "device": "cuda", "trtllm": {"model_family": "llama"}},
    "limits": {"max_batch_size": 4, "max_input_len": 512, "max_seq_len": 1024},
}


def _plan(calibration: dict, backend: str = "trtllm-engine"):
    d = copy.deepcopy(ENGINE)
    d["target"]["quantization"]["calibration"] = calibration
    d["runtime"]["backend"] = backend
    return make_plan(parse_recipe(d), "/out")


def _argv(plan, sid):
    (stage,) = [s for s in plan.stages if s.id == sid]
    return list(stage.commands[0])


def _flag(argv, name):
    return argv[argv.index(name) + 1]


def test_cnn_dailymail_goes_to_quantize_py_by_name_with_modelopt_sizes():
    p = _plan({"dataset": "cnn_dailymail"})
    assert [s.id for s in p.stages] == ["target-ckpt", "target-engine"]  # no calib stage
    q = _argv(p, "target-ckpt")
    assert (_flag(q, "--calib_dataset"), _flag(q, "--calib_size"), _flag(q, "--calib_max_seq_length")) == \
        ("cnn_dailymail", "512", "512")


def test_other_sources_become_a_train_split_folder_for_quantize_py(saved_dataset, tmp_path):
    p = _plan({"dataset": str(saved_dataset), "split": "validation", "column": "body", "size": 32, "seq_len": 256})
    calib = _argv(p, "calib")
    assert calib[:3] == ["python3", "-m", "trtspec.trtllm.calibration"]
    assert (_flag(calib, "--source"), _flag(calib, "--split"), _flag(calib, "--column")) == \
        (str(saved_dataset), "validation", "body")
    assert _flag(_argv(p, "target-ckpt"), "--calib_dataset") == "/out/calib"
    assert [s.inputs for s in p.stages if s.id == "calib"] == [(str(saved_dataset),)]
    # pileval and a hub id are read by trtspec (TRT-LLM's own pileval URL is gone), never a local input
    for name in ("pileval", "org/chat-logs"):
        pp = _plan({"dataset": name})
        assert _flag(_argv(pp, "calib"), "--source") == name and _flag(_argv(pp, "target-ckpt"), "--calib_dataset") == "/out/calib"
        assert [s.inputs for s in pp.stages if s.id == "calib"] == [()]
    # and the stage itself writes what quantize.py reads: load_dataset(DIR, split="train")["text"]
    from trtspec.trtllm.calibration import main

    out = tmp_path / "calib"
    assert main(["--source", str(saved_dataset), "--column", "body", "--size", "6", "--seq-len", "16",
                 "--output", str(out)]) == 0
    rows = datasets.load_dataset(str(out), split="train")["text"]
    markers = [int(m) for r in rows for m in re.findall(r"row(\d{3})", r)]
    assert len(rows) == 6 and markers and not any(m % 10 == 9 for m in markers)
    assert main(["--source", str(saved_dataset), "--column", "nope", "--size", "6", "--seq-len", "16",
                 "--output", str(tmp_path / "o2")]) == 2


def test_pytorch_flow_passes_the_source_to_trtspec_quantize(saved_dataset):
    p = _plan({"dataset": str(saved_dataset), "split": "validation", "column": "body"}, backend="trtllm-pytorch")
    argv = _argv(p, "target-quant")
    assert argv[:2] == ["trtspec", "quantize"]
    assert (_flag(argv, "--calib"), _flag(argv, "--calib-split"), _flag(argv, "--calib-column"),
            _flag(argv, "--calib-size")) == (str(saved_dataset), "validation", "body", "512")
    import click

    from trtspec.cli import main

    opts = {o for prm in main.get_command(click.Context(main), "quantize").params for o in getattr(prm, "opts", [])}
    assert {a for a in argv[2:] if a.startswith("-")} <= opts


# --------------------------------------------------------------------------------------------
# trtspec check


def _lines(recipe):
    from trtspec.recipe_checks import calibration_lines

    return {ln.name: ln for ln in calibration_lines(recipe)}


@pytest.mark.parametrize("path", sorted(p for p in (REPO / "build_configs").glob("*-trtllm.yaml")), ids=lambda p: p.stem)
def test_check_prints_source_sizes_and_what_the_quality_report_measures_for_every_gpu_recipe(path):
    recipe = load_recipe(path)
    lines = _lines(recipe)
    quantized = recipe.target.quantization.format != "none"
    assert ("calibration:target" in lines) == quantized
    for ln in lines.values():
        assert ln.status == "ok", ln
        assert "cnn_dailymail" in ln.detail and "512 x 512 tokens" in ln.detail
        assert "held-out rows of the same source" in ln.detail and "perplexity" in ln.detail


def test_a_recipe_serving_chat_but_calibrating_on_builtin_is_warned_with_the_fix():
    """Decided by what the recipe says it serves (validation.prompts), never by the model's name."""
    d = copy.deepcopy(ENGINE)
    d["target"]["model"] = "/m/codegen-base"  # no "chat" in the name: the recipe's prompts decide
    d["target"]["quantization"]["calibration"] = {"dataset": "builtin", "size": 512, "seq_len": 512}
    d.setdefault("validation", {})["prompts"] = "builtin:chat"
    ln = _lines(parse_recipe(d))["calibration:target"]
    assert ln.status == "warn" and "serves chat (validation.prompts: builtin:chat)" in ln.detail
    assert "Python source code" in ln.detail
    assert "target.quantization.calibration.dataset: cnn_dailymail" in ln.fix
    d["target"]["model"] = "/m/Qwen2.5-Coder-1.5B-Instruct"  # an instruct model serving code: builtin is right
    d["validation"]["prompts"] = "builtin:code"
    ln = _lines(parse_recipe(d))["calibration:target"]
    assert ln.status == "ok" and "as the recipe's traffic is (validation.prompts: builtin:code)" in ln.detail


def test_check_fails_a_local_source_with_a_missing_column(saved_dataset):
    d = copy.deepcopy(ENGINE)
    d["runtime"] = {"backend": "torch", "device": "cpu"}
    d["target"]["quantization"] = {"format": "int8_wo", "calibration": {"dataset": str(saved_dataset),
                                                                         "column": "article"}}
    ln = _lines(parse_recipe(d))["calibration:target"]
    assert ln.status == "fail" and ln.detail.startswith("target.quantization.calibration.column='article'")
    assert "columns: body, n" in ln.detail and ln.fix == "set column: one of body, n"


# --------------------------------------------------------------------------------------------
# end to end: ModelOpt calibrates a small random Llama (made here, not trained) on a saved dataset


@pytest.fixture
def small_llama(tmp_path, tokenizer) -> pathlib.Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.eos_token_id)
    out = tmp_path / "small-llama"
    LlamaForCausalLM(cfg).save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    return out


def test_quantize_calibrates_and_reports_on_a_saved_dataset(saved_dataset, small_llama, tmp_path):
    from trtspec.quantize import QualitySettings, make_quantization, quantize_model

    q = make_quantization("int8_wo", calib=str(saved_dataset), calib_column="body", calib_size=2, calib_seq_len=32)
    res = quantize_model(small_llama, q, "torch", tmp_path / "out", device="cpu", pair=small_llama, role="target",
                         quality=QualitySettings(eval_windows=2, eval_seq_len=32, prompts=2, max_new_tokens=4))
    # the acceptance measurement's prompts are held-out rows of the same source too
    assert res.quality["acceptance"]["prompts"].startswith("held-out rows of local dataset folder")
    cal = res.manifest["calibration"]
    assert (cal["kind"], cal["split"], cal["column"], cal["size"], cal["seq_len"]) == ("folder", "train", "body", 2, 32)
    assert "held-out text of local dataset folder" in res.quality["heldout"]["text"]
    assert res.quality["heldout"]["sha256_16"] != cal["sha256_16"]
    with pytest.raises(ConfigError) as e:  # the default column 'text' is not in this dataset
        quantize_model(small_llama, make_quantization("int8_wo", calib=str(saved_dataset)), "torch", tmp_path / "o2")
    assert e.value.field == S.COLUMN_FIELD and not (tmp_path / "o2").exists()
