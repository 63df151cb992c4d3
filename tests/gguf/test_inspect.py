"""`pyllama inspect`: the numbers llama.cpp's print_info shows for both real models
(derived by hand from the tensor tables: see test_model_load.test_real_model_numbers)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from pyllama.cli import app

runner = CliRunner()

EXPECTED = {
    # arch, n_layer, n_embd, n_head, n_head_kv, n_vocab, n_ctx_train, tensors, type guess, n_params
    "smollm2": ("llama", 30, 576, 9, 3, 49152, 8192, 272, "Q4_1", 134_515_008),
    "gemma3": ("gemma3", 18, 640, 4, 1, 262144, 32768, 236, "Q4_K - Medium", 268_098_176),
}


@pytest.mark.parametrize("which", ["smollm2", "gemma3"])
def test_inspect_json_matches_llama_cpp(which, smollm2_path, gemma3_path):
    path = {"smollm2": smollm2_path, "gemma3": gemma3_path}[which]
    r = runner.invoke(app, ["inspect", str(path), "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    hp = d["hparams"]
    got = (d["architecture"], hp["n_layer"], hp["n_embd"], hp["n_head"], hp["n_head_kv"], hp["n_vocab"],
           hp["n_ctx_train"], d["n_tensors"], d["type_guess"], d["n_params"])
    assert got == EXPECTED[which]
    assert d["gguf_version"] == 3
    assert d["size_mib"] == round(d["size"] / 2**20, 2)
    assert d["bpw"] == round(d["size"] * 8 / d["n_params"], 2)
    assert d["tokenizer"]["n_tokens"] == hp["n_vocab"]
    assert d["tokenizer"]["model"] == {"smollm2": "gpt2", "gemma3": "llama"}[which]
    assert d["chat_template"] is (which == "smollm2")


def test_inspect_text_and_tables(smollm2_path):
    r = runner.invoke(app, ["inspect", str(smollm2_path), "--tensors", "--metadata"])
    assert r.exit_code == 0, r.output
    out = r.output
    assert "file type              Q4_1" in out
    assert "file size              92.10 MiB (5.74 BPW)" in out
    assert "model params           134.52 M" in out
    assert "blk.29.ffn_down.weight" in out and "tokenizer.ggml.pre" in out
    r = runner.invoke(app, ["inspect", str(smollm2_path), "--json", "--tensors", "--metadata"])
    d = json.loads(r.output)
    assert len(d["tensors"]) == 272 and d["metadata"]["general.architecture"] == "llama"
    assert d["metadata_types"]["llama.block_count"] == "u32"


def test_inspect_bad_file(tmp_path):
    p = tmp_path / "bad.gguf"
    p.write_bytes(b"GGUF\x04\x00\x00\x00" + b"\0" * 16)
    r = runner.invoke(app, ["inspect", str(p)])
    assert r.exit_code == 1
    assert "unsupported GGUF version 4" in r.output and str(p) in r.output


def test_inspect_unknown_architecture_still_shows_the_file(tmp_path):
    from gguf_build import STR, Spec, Tensor, build, f32_data

    p = tmp_path / "u.gguf"
    p.write_bytes(build(Spec(kvs=[("general.architecture", STR, "mamba9")], tensors=[Tensor("w", [4], 0, f32_data([1, 2, 3, 4]))]))[0])
    r = runner.invoke(app, ["inspect", str(p), "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert "mamba9" in d["unsupported"] and d["n_params"] == 4 and d["bpw"] == 32.0


def test_inspect_split_model(tmp_path, smollm2_path):
    """The first part of a split model shows the whole model."""
    gguf = pytest.importorskip("gguf")
    r = gguf.GGUFReader(str(smollm2_path))
    out = tmp_path / "s.gguf"
    w = gguf.GGUFWriter(str(out), "llama", split_max_tensors=150)
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        vt = f.types[0]
        w.add_key_value(f.name, f.contents(), vt, f.types[-1] if vt == gguf.GGUFValueType.ARRAY else None)
    for t in r.tensors:
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    first = tmp_path / "s-00001-of-00002.gguf"
    res = runner.invoke(app, ["inspect", str(first), "--json", "--tensors"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d["n_files"] == 2 and d["n_tensors"] == 272 and len(d["tensors"]) == 272
    assert d["n_params"] == EXPECTED["smollm2"][-1] and d["tensor_types"] == {"F32": 61, "Q4_1": 210, "Q8_0": 1}
