"""`pyllama bench`'s outputs and list flags as llama-bench's (tools/llama-bench/llama-bench.cpp):
the md / csv / json / jsonl / sql printers over test::get_fields(), -d (a KV cache already
holding d tokens, untimed), -fa / -ctk / -ngl lists, and the default thread count (the
physical cores). Tiny runs (-r 1, a few tokens) on SmolLM2; no timing is asserted."""

from __future__ import annotations

import csv
import io
import json
import sqlite3

import pytest
from typer.testing import CliRunner

from pyllama.cli import app
from pyllama.cli.bench import FIELDS, physical_cores

runner = CliRunner()
SMALL = ["-p", "4", "-n", "2", "-r", "1", "-t", "1"]


def bench(model, *args):
    r = runner.invoke(app, ["bench", "-m", str(model), *args])
    assert r.exit_code == 0, r.output
    return r


def test_jsonl_is_llama_benchs(smollm2_path):
    r = bench(smollm2_path, *SMALL, "-d", "0,8", "-o", "jsonl")
    lines = r.stdout.splitlines()
    assert len(lines) == 4  # (pp4, tg2) x (d0, d8), one JSON object per line
    rows = [json.loads(x) for x in lines]
    assert all(list(row) == [*FIELDS, "samples_ns", "samples_ts"] for row in rows)
    assert [(x["n_prompt"], x["n_gen"], x["n_depth"]) for x in rows] == [(4, 0, 0), (0, 2, 0), (4, 0, 8), (0, 2, 8)]
    row = rows[0]
    assert row["backends"] == "CPU" and row["n_threads"] == 1 and row["flash_attn"] == -1
    assert row["no_kv_offload"] is False and row["repack"] is True  # llama-bench's bool fields
    assert len(row["samples_ns"]) == 1 and row["avg_ns"] == row["samples_ns"][0]
    assert row["avg_ts"] == pytest.approx(4e9 / row["avg_ns"], rel=1e-5)
    assert lines[0].startswith('{"build_commit": ') and '"samples_ns": [ ' in lines[0] and lines[0].endswith(" ]}")


def test_json_csv_sql(smollm2_path):
    rows = json.loads(bench(smollm2_path, *SMALL, "-o", "json").stdout)
    assert [x["n_gen"] for x in rows] == [0, 2] and list(rows[0]) == [*FIELDS, "samples_ns", "samples_ts"]

    out = bench(smollm2_path, *SMALL, "-o", "csv").stdout
    recs = list(csv.reader(io.StringIO(out)))
    assert recs[0] == list(FIELDS) and len(recs) == 3
    assert out.splitlines()[1].startswith('"pyllama ')  # every value quoted, as llama-bench

    sql = bench(smollm2_path, *SMALL, "-o", "sql").stdout
    assert sql.startswith("CREATE TABLE IF NOT EXISTS llama_bench (\n  build_commit TEXT,\n  build_number INTEGER,")
    db = sqlite3.connect(":memory:")
    db.executescript(sql)
    got = db.execute("SELECT n_prompt, n_gen, typeof(avg_ts), avg_ts > 0 FROM llama_bench").fetchall()
    assert got == [(4, 0, "real", 1), (0, 2, "real", 1)]


def test_md_columns_follow_the_flags(smollm2_path):
    out = bench(smollm2_path, *SMALL, "-d", "8", "-fa", "on", "-ctk", "q8_0").stdout
    head = [c.strip() for c in out.splitlines()[0].strip("|").split("|")]
    assert head == ["model", "size", "params", "backend", "threads", "type_k", "fa", "test", "t/s"]
    body = out.splitlines()[2:4]
    assert "pp4 @ d8" in body[0] and "tg2 @ d8" in body[1] and "q8_0" in body[0]
    assert out.splitlines()[-1].startswith("build: pyllama ")
    plain = bench(smollm2_path, *SMALL).stdout
    assert [c.strip() for c in plain.splitlines()[0].strip("|").split("|")] == [
        "model", "size", "params", "backend", "threads", "test", "t/s"]


def test_lists_make_one_test_each(smollm2_path):
    r = bench(smollm2_path, "-p", "4", "-n", "0", "-r", "1", "-t", "1", "-ctk", "f16,q8_0", "-fa", "auto,on",
              "-ngl", "0,99", "-o", "jsonl")
    rows = [json.loads(x) for x in r.stdout.splitlines()]
    assert [(x["n_gpu_layers"], x["type_k"], x["flash_attn"]) for x in rows] == [
        (0, "f16", -1), (0, "f16", 1), (0, "q8_0", -1), (0, "q8_0", 1),
        (99, "f16", -1), (99, "f16", 1), (99, "q8_0", -1), (99, "q8_0", 1)]
    # warned once where no GPU adapter is usable (no backend built, no driver, or only a
    # software adapter that was not asked for); silent where -ngl 99 offloads
    from pyllama import gpu

    if gpu.available():
        assert "-ngl" not in r.stderr
    else:
        assert r.stderr.count("-ngl") == 1 and gpu.why_not() in r.stderr, r.stderr


def test_gpu_placement_lists_and_columns(smollm2_path):
    # -sm / -mg / -ts / -nkvo as llama-bench: one test per combination, the fields as it
    # prints them (tensor_split "%.2f" up to the last non-zero share, '/'-joined), and the
    # md columns sm / nkvo / ts shown when not the defaults. -ngl 0: nothing to place, so
    # every combination loads here with or without a GPU.
    r = bench(smollm2_path, "-p", "4", "-n", "0", "-r", "1", "-t", "1", "-ngl", "0", "-sm", "none,layer",
              "-ts", "3/1,0", "-nkvo", "0,1", "-o", "jsonl")
    rows = [json.loads(x) for x in r.stdout.splitlines()]
    assert [(x["split_mode"], x["tensor_split"], x["no_kv_offload"], x["main_gpu"]) for x in rows] == [
        ("none", "3.00/1.00", False, 0), ("none", "3.00/1.00", True, 0), ("none", "0.00", False, 0),
        ("none", "0.00", True, 0), ("layer", "3.00/1.00", False, 0), ("layer", "3.00/1.00", True, 0),
        ("layer", "0.00", False, 0), ("layer", "0.00", True, 0)]
    out = bench(smollm2_path, *SMALL, "-ngl", "0", "-sm", "none", "-ts", "0/1", "-nkvo", "1").stdout
    head = [c.strip() for c in out.splitlines()[0].strip("|").split("|")]
    assert head == ["model", "size", "params", "backend", "threads", "sm", "nkvo", "ts", "test", "t/s"], head
    assert "|   none |             1 | 0.00/1.00    |" in out.splitlines()[2], out


def test_default_threads_are_the_physical_cores(smollm2_path):
    r = bench(smollm2_path, "-p", "4", "-n", "0", "-r", "1", "-o", "jsonl")
    assert json.loads(r.stdout)["n_threads"] == physical_cores() >= 1
    helptext = "".join(c for c in runner.invoke(app, ["bench", "--help"]).stdout if not c.isspace() and c not in "│")
    assert "physicalcores" in helptext


def test_depth_is_filled_before_each_repetition(smollm2_path):
    r = bench(smollm2_path, "-p", "0", "-n", "1", "-r", "2", "-t", "1", "-d", "8", "--progress", "-o", "jsonl")
    assert r.stderr.count("depth run") == 2
    assert json.loads(r.stdout)["n_depth"] == 8
