"""The run identity of results files, one writer per folder, and cheap checks before expensive work: a rerun
with anything that changes a result is refused naming the field, a second writer is refused, and bad input is
one line with exit code 2 (never a traceback, never a partial computation first)."""
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from conftest import ENV, ROOT, run, run_fairseq
from fairseq_headprune.errors import UserError
from fairseq_headprune.records.identity import NEUTRAL, decoding_identity, describe_differences
from fairseq_headprune.records.log import FolderLock, ResultsLog

FAST = ["--gen-subset", "test", "--beam", "1", "--max-tokens", "3000"]


# Another process taking a folder's lock: this package's results/log.py alone (the copy under test), without the
# package's __init__, which imports fairseq and torch (4 CPU s per process) for nothing a lock needs.
LOCKER = ("import sys, types; package = types.ModuleType('fairseq_headprune'); package.__path__ = [sys.argv[1]]; "
          "sys.modules['fairseq_headprune'] = package; from fairseq_headprune.records.log import FolderLock; ")


def locker(code: str):
    import fairseq_headprune

    return [sys.executable, "-c", LOCKER + code, os.path.dirname(fairseq_headprune.__file__)]


def one_line_error(proc, *fragments):
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    for fragment in fragments:
        assert fragment in last, last
    return last


@pytest.fixture(scope="module")
def slice_data(tiny_data, tmp_path_factory):
    """The first 24 test sentences of the tiny data (and an empty subset), with its dictionaries."""
    out = tmp_path_factory.mktemp("identity-slice")
    for lang in ("de", "en"):
        lines = (tiny_data / f"test.bpe.{lang}").read_text(encoding="utf-8").splitlines()[:24]
        (out / f"slice.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
        (out / f"empty.{lang}").write_text("", encoding="utf-8")
    run_fairseq(["fairseq-preprocess", "--source-lang", "de", "--target-lang", "en",
                 "--srcdict", tiny_data / "dict.de.txt", "--tgtdict", tiny_data / "dict.en.txt",
                 "--testpref", f"{out / 'slice'},{out / 'empty'}", "--destdir", out, "--workers", "1"])
    return out


# ---------------------------------------------------------------- the identity itself (no model)

def test_every_generation_and_task_field_is_in_the_identity_or_declared_neutral(tiny_data):
    """A new fairseq generation or task option joins the identity by default; this fails when one is neither
    in it nor on the documented NEUTRAL list (or when NEUTRAL names a field that does not exist)."""
    from fairseq.dataclass.configs import GenerationConfig

    from fairseq_headprune import cli
    from fairseq_headprune.cli import score
    from fairseq_headprune.tasks.translation_headprune import TranslationHeadpruneConfig

    cfg, _ = cli.parse("score", score, [str(tiny_data), "--path", "unused.pt", "--results-dir", "unused"])
    identity = decoding_identity(cfg)
    for section, config in (("generation", GenerationConfig), ("task", TranslationHeadpruneConfig)):
        names = {f.name for f in dataclasses.fields(config)}
        assert NEUTRAL[section] <= names, f"NEUTRAL[{section}] names fields fairseq does not have"
        missing = [n for n in names if n not in identity[section] and n not in NEUTRAL[section]]
        assert not missing, f"{section} fields neither in the run identity nor declared neutral: {missing}"
    for field in ("min_len", "no_repeat_ngram_size", "unkpen", "sampling", "temperature", "match_source_len",
                  "prefix_size", "beam", "lenpen", "max_len_a", "max_len_b"):
        assert field in identity["generation"]
    assert {"source_lang", "target_lang", "mask_heads"} <= set(identity["task"])
    assert {"post_process", "bpe", "tokenizer", "model_overrides"} <= set(identity)


def test_differences_name_every_field_and_resume_compares_only_the_callers_fields(tmp_path):
    theirs = {"decoding": {"generation": {"min_len": 1, "beam": 5}}, "subset": "test"}
    ours = {"decoding": {"generation": {"min_len": 3, "beam": 5}}, "subset": "valid"}
    assert describe_differences(theirs, ours) == ["decoding.generation.min_len: 1 there, 3 now",
                                                  "subset: 'test' there, 'valid' now"]
    log = ResultsLog(str(tmp_path / "a.jsonl"), theirs)
    log.append({"key": "x"})
    with pytest.raises(UserError, match="decoding.generation.min_len: 1 there, 3 now"):
        ResultsLog(str(tmp_path / "a.jsonl"), ours)
    # confirm(): a field known later joins the header once, then must match
    log.confirm({"inputs.importance_sha256": "abc"})
    assert ResultsLog(str(tmp_path / "a.jsonl"), theirs).rows == [{"key": "x"}]
    with pytest.raises(UserError, match="inputs.importance_sha256: 'abc' there, 'def' now"):
        ResultsLog(str(tmp_path / "a.jsonl"), theirs).confirm({"inputs.importance_sha256": "def"})


def test_folder_lock_is_reentrant_in_a_process_and_released(tmp_path):
    with FolderLock(str(tmp_path)):
        with FolderLock(str(tmp_path)):  # the report holds it while its studies take it again
            pass
        code = locker("FolderLock(sys.argv[2]).acquire(); print('acquired')")
        proc = subprocess.run(code + [str(tmp_path)], capture_output=True, text=True, env=ENV)
        assert proc.returncode != 0 and "being written by another fairseq-headprune process" in proc.stderr
        assert "acquired" not in proc.stdout
    proc = subprocess.run(code + [str(tmp_path)], capture_output=True, text=True, env=ENV)
    assert proc.returncode == 0 and proc.stdout.strip() == "acquired", proc.stderr  # released with the last holder


# ---------------------------------------------------------------- reruns into the same folder

@pytest.mark.parametrize("change, field", [
    (["--min-len", "3"], "decoding.generation.min_len"),
    (["--beam", "2"], "decoding.generation.beam"),
    (["--lenpen", "2"], "decoding.generation.lenpen"),
    (["--tokenizer", "moses", "-s", "de", "-t", "en"], "decoding.tokenizer"),
    (["--remove-bpe"], "decoding.post_process"),
    (["--references", "REFS"], "references_sha256"),
    (["DATA2"], "data_fingerprint"),
])
def test_ablate_rerun_with_another_setup_is_refused_naming_the_field(slice_data, tiny_data, stock_checkpoint,
                                                                    tmp_path, change, field):
    out = tmp_path / "out"
    base = ["fairseq-headprune", "ablate", slice_data, "--path", stock_checkpoint, "--results-dir", out, *FAST,
            "--gen-subset", "test", "--types", "enc-dec", "--bootstrap-samples", "50"]
    run(base)
    rows = (out / "ablation-single.jsonl").read_text().splitlines()
    if change == ["DATA2"]:
        other = tmp_path / "data2"
        shutil.copytree(slice_data, other)
        shutil.copy(tiny_data / "test.de-en.de.bin", other / "test.de-en.de.bin")
        shutil.copy(tiny_data / "test.de-en.de.idx", other / "test.de-en.de.idx")
        shutil.copy(tiny_data / "test.de-en.en.bin", other / "test.de-en.en.bin")
        shutil.copy(tiny_data / "test.de-en.en.idx", other / "test.de-en.en.idx")
        argv = [other if a == slice_data else a for a in base]
    elif change[0] == "--references":
        refs = tmp_path / "refs.txt"
        refs.write_text("".join(f"reference {i}\n" for i in range(24)))
        argv = base + ["--references", refs]
    else:
        argv = base + change
    proc = run(argv, check=False)
    one_line_error(proc, "holds results of another run", field)
    assert (out / "ablation-single.jsonl").read_text().splitlines() == rows, "nothing may be appended"


def test_prune_and_analyze_reruns_are_refused_and_foreign_importance_files_too(slice_data, stock_checkpoint,
                                                                               tmp_path):
    out = tmp_path / "out"
    run(["fairseq-headprune", "score", slice_data, "--path", stock_checkpoint, "--results-dir", out,
         "--gen-subset", "test"])
    importance = out / "importance.json"
    prune = ["fairseq-headprune", "prune", slice_data, "--path", stock_checkpoint, "--results-dir", out, *FAST,
             "--types", "dec-self", "--step", "0.5", "--importance", importance]
    run(prune)
    one_line_error(run(prune + ["--min-len", "3"], check=False), "decoding.generation.min_len")
    changed = tmp_path / "importance-changed.json"
    data = json.loads(importance.read_text())
    data["dec-self"][0][0] += 1.0
    changed.write_text(json.dumps(data))
    one_line_error(run(prune[:-1] + [changed], check=False), "inputs.importance_sha256")
    # an importance file of another checkpoint is refused by prune and analyze, before any work
    data["meta"]["checkpoint_sha256"] = "0" * 64
    foreign = tmp_path / "foreign.json"
    foreign.write_text(json.dumps(data))
    one_line_error(run(prune[:-1] + [foreign] + ["--results-dir", tmp_path / "p2"], check=False),
                   "computed on another checkpoint")
    analyze = ["fairseq-headprune", "analyze", slice_data, "--path", stock_checkpoint, *FAST,
               "--num-sentences", "4"]
    proc = run(analyze + ["--results-dir", tmp_path / "a2", "--importance", foreign], check=False)
    one_line_error(proc, "computed on another checkpoint")
    assert not (tmp_path / "a2" / "heads_analysis.partial.jsonl").exists(), "refused before the analysis"
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    one_line_error(run(analyze + ["--results-dir", tmp_path / "a3", "--importance", garbage], check=False),
                   "cannot read")
    run(analyze + ["--results-dir", tmp_path / "a"])
    # a killed analysis leaves its partial file: a rerun with another decoding setup must not resume it
    (tmp_path / "a" / "heads_analysis.partial.jsonl").write_text(
        json.dumps({"header": {"command": "analyze", "decoding": {"generation": {"min_len": 1}}}}) + "\n")
    one_line_error(run(analyze + ["--results-dir", tmp_path / "a", "--min-len", "3"], check=False),
                   "holds results of another run")


def test_a_second_writer_into_one_folder_is_refused(slice_data, stock_checkpoint, tmp_path):
    code = locker("import time; FolderLock(sys.argv[2]).acquire(); print('locked', flush=True); time.sleep(60)")
    holder = subprocess.Popen(code + [str(tmp_path)], stdout=subprocess.PIPE, text=True, env=ENV)
    try:
        assert holder.stdout.readline().strip() == "locked"
        proc = run(["fairseq-headprune", "score", slice_data, "--path", stock_checkpoint, "--results-dir", tmp_path,
                    "--gen-subset", "test"], check=False)
        one_line_error(proc, str(tmp_path), "being written by another fairseq-headprune process")
        assert not (tmp_path / "importance.json").exists()
    finally:
        holder.kill()
        holder.wait()


# ---------------------------------------------------------------- bad input: one line, exit code 2

def test_unreadable_checkpoints_are_one_line(slice_data, stock_checkpoint, tmp_path):
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(stock_checkpoint.read_bytes()[: stock_checkpoint.stat().st_size // 2])
    text = tmp_path / "notes.pt"
    text.write_text("not a checkpoint\n")
    for path in (truncated, text):
        for command in (["score"], ["ablate", "--metric", "loss", "--types", "dec-self"]):
            proc = run(["fairseq-headprune", command[0], slice_data, "--path", path, "--results-dir", tmp_path / "r",
                        "--gen-subset", "test", *command[1:]], check=False)
            one_line_error(proc, f"cannot load checkpoint {path}")


def test_unusable_results_folders_are_refused_before_any_work(slice_data, stock_checkpoint, tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    for folder, message in ((a_file, "is a file, not a folder"), (a_file / "sub", "cannot create --results-dir")):
        started = time.time()
        proc = run(["fairseq-headprune", "score", slice_data, "--path", stock_checkpoint, "--results-dir", folder,
                    "--gen-subset", "test"], check=False)
        one_line_error(proc, message)
        assert time.time() - started < 5, "refused before loading and scoring"


def test_empty_and_missing_subsets_are_one_line(slice_data, stock_checkpoint, tmp_path):
    for command in (["score"], ["ablate", "--types", "dec-self"], ["speed", "--heads", "dec-self:1:1"]):
        proc = run(["fairseq-headprune", command[0], slice_data, "--path", stock_checkpoint, "--results-dir", tmp_path,
                    "--gen-subset", "test1", *command[1:]], check=False)
        one_line_error(proc, "'test1'", "empty")
    proc = run(["fairseq-headprune", "speed", slice_data, "--path", stock_checkpoint, "--results-dir", tmp_path,
                "--gen-subset", "nosuch", "--heads", "dec-self:1:1"], check=False)
    one_line_error(proc, "no 'nosuch' subset")


@pytest.mark.parametrize("option, value", [("--runs", "0"), ("--batch-sizes", "0"), ("--num-sentences", "0"),
                                           ("--batch-sizes", "4,x")])
def test_speed_bad_numbers_are_one_line(slice_data, stock_checkpoint, tmp_path, option, value):
    proc = run(["fairseq-headprune", "speed", slice_data, "--path", stock_checkpoint, "--results-dir", tmp_path,
                "--gen-subset", "test", "--heads", "dec-self:1:1", option, value], check=False)
    one_line_error(proc, option)


def test_remove_out_a_folder_or_the_input_through_a_link_is_refused(slice_data, stock_checkpoint, tmp_path):
    source = tmp_path / "model.pt"
    shutil.copy(stock_checkpoint, source)
    link = tmp_path / "link.pt"
    os.symlink(source, link)
    before = source.read_bytes()
    for out, message in ((tmp_path, "is a folder"), (link, "is the checkpoint being read")):
        proc = run(["fairseq-headprune", "remove", slice_data, "--path", source, "--gen-subset", "test",
                    "--heads", "dec-self:1:1", "--out", out], check=False)
        one_line_error(proc, message)
    assert source.read_bytes() == before


@pytest.fixture(scope="module")
def gated_checkpoint(tiny_data, stock_checkpoint, tmp_path_factory):
    """The stock model after one update of L0 fine-tuning with gates on enc-self."""
    from conftest import TINY_ARCH

    out = tmp_path_factory.mktemp("gated")
    run_fairseq(["fairseq-train", tiny_data, *TINY_ARCH, "--user-dir", ROOT / "fairseq_headprune",
                 "--task", "translation_headprune", "--gated-types", "enc-self",
                 "--finetune-from-model", stock_checkpoint, "--optimizer", "adam", "--lr", "1e-4",
                 "--max-update", "1", "--max-tokens", "1500", "--criterion", "label_smoothed_cross_entropy_l0",
                 "--l0-lambda", "0.01", "--save-dir", out, "--no-epoch-checkpoints", "--disable-validation",
                 "--num-workers", "0"])
    return out / "checkpoint_last.pt"


def test_compare_rerun_with_another_setup_is_refused_and_mixes_no_rows(slice_data, stock_checkpoint,
                                                                       gated_checkpoint, tmp_path):
    """compare shares the run identity: a rerun into its folder with another decoding option or importance file is
    refused in one line naming the field, and compare.jsonl keeps exactly the rows of the first run."""
    run(["fairseq-headprune", "score", slice_data, "--path", stock_checkpoint, "--results-dir", tmp_path / "imp",
         "--gen-subset", "test"])
    importance = tmp_path / "imp" / "importance.json"
    out = tmp_path / "out"
    base = ["fairseq-headprune", "compare", slice_data, "--path", stock_checkpoint, "--results-dir", out, *FAST,
            "--importance", importance, "--gated", gated_checkpoint, "--workers", "1"]
    run(base)
    before = (out / "compare.jsonl").read_text()
    lines = before.splitlines()
    assert json.loads(lines[0])["header"]["command"] == "compare"
    keys = [json.loads(x)["key"] for x in lines[1:]]
    assert keys[0] == "baseline" and any(k.startswith("l0:") for k in keys)
    assert any(k.startswith("michel:") for k in keys)
    changed = tmp_path / "importance-changed.json"
    data = json.loads(importance.read_text())
    data["enc-self"][0][0] += 1.0
    changed.write_text(json.dumps(data))
    for argv, field in ((base + ["--min-len", "3"], "decoding.generation.min_len"),
                        (base + ["--beam", "2"], "decoding.generation.beam"),
                        ([changed if a == importance else a for a in base], "inputs.importance_sha256")):
        proc = run(argv, check=False)
        one_line_error(proc, "holds results of another run", field)
        assert len([line for line in proc.stderr.splitlines() if "error" in line.lower()]) == 1, proc.stderr
        assert (out / "compare.jsonl").read_text() == before, "nothing may be appended"
    # the same setup resumes: nothing decoded again, no row twice
    again = run(base).stdout
    assert "BLEU" not in again.split("wrote")[0]
    assert (out / "compare.jsonl").read_text() == before


def test_speed_and_remove_on_a_gated_checkpoint_are_one_line(slice_data, gated_checkpoint, tmp_path):
    gated = gated_checkpoint
    proc = run(["fairseq-headprune", "speed", slice_data, "--path", gated, "--results-dir", tmp_path / "s",
                "--gen-subset", "test", "--heads", "enc-self:1:1", "--runs", "1"], check=False)
    one_line_error(proc, "L0 head gates", "--fold-out")
    proc = run(["fairseq-headprune", "remove", slice_data, "--path", gated, "--gen-subset", "test",
                "--heads", "enc-self:1:1", "--out", tmp_path / "r.pt"], check=False)
    one_line_error(proc, "L0 head gates")
    assert not (tmp_path / "r.pt").exists()


def test_correlate_a_field_that_is_not_a_number_is_one_line(slice_data, stock_checkpoint, tmp_path):
    run(["fairseq-headprune", "ablate", slice_data, "--path", stock_checkpoint, "--results-dir", tmp_path,
         "--gen-subset", "test", "--metric", "loss", "--types", "dec-self"])
    path = tmp_path / "ablation-single-loss.jsonl"
    proc = run(["fairseq-headprune", "correlate", path, path, "--results-dir", tmp_path, "--field", "type"],
               check=False)
    one_line_error(proc, "--field type", "not a number")


def test_a_shared_embedding_model_with_separate_dictionaries_is_one_line(tiny_data, stock_checkpoint, tmp_path):
    """--share-all-embeddings needs one joined dictionary; data binarised with two different ones is refused."""
    lines = (tiny_data / "test.bpe.en").read_text(encoding="utf-8").splitlines()[:8]
    for lang in ("de", "en"):
        (tmp_path / f"t.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    run_fairseq(["fairseq-preprocess", "--source-lang", "de", "--target-lang", "en", "--trainpref", tmp_path / "t",
                 "--testpref", tmp_path / "t", "--destdir", tmp_path / "bin", "--workers", "1", "--tgtdict",
                 tiny_data / "dict.en.txt"])
    proc = run(["fairseq-headprune", "score", tmp_path / "bin", "--path", stock_checkpoint, "--results-dir",
                tmp_path / "r", "--gen-subset", "test"], check=False)
    one_line_error(proc, "cannot load checkpoint")


# ---------------------------------------------------------------- the report

def test_report_loads_the_model_once(slice_data, stock_checkpoint, tmp_path, monkeypatch):
    from fairseq_headprune.fairseq_io import loading

    calls = []
    real = loading.load
    monkeypatch.setattr(loading, "load", lambda cfg: calls.append(cfg.common_eval.path) or real(cfg))
    run(["fairseq-headprune", "report", slice_data, "--path", stock_checkpoint, "--results-dir", tmp_path, *FAST,
         "--parts", "score,prune,prune-types,speed", "--prune-orders", "importance,random", "--prune-step", "0.5",
         "--speed-batch-sizes", "4", "--speed-runs", "1", "--speed-sentences", "8", "--dynamics", "none"])
    assert calls == [str(stock_checkpoint)]
    state = json.loads((tmp_path / "report-state.json").read_text())
    assert set(state["parts"]) == {"score", "prune", "prune-types", "speed"}
    assert all(p["data_fingerprints"] for p in state["parts"].values())


def test_dynamics_reruns_with_another_decoding_or_data_are_refused(tiny_data, slice_data, epoch_checkpoints,
                                                                   tmp_path):
    past = time.time() - 3600
    folder = tmp_path / "ckpts"
    folder.mkdir()
    shutil.copy2(epoch_checkpoints / "checkpoint1.pt", folder / "checkpoint1.pt")
    os.utime(folder / "checkpoint1.pt", (past, past))
    base = ["fairseq-headprune", "dynamics", slice_data, "--checkpoint-dir", folder, "--results-dir", tmp_path / "o",
            "--gen-subset", "test", "--importance-subset", "test", "--beam", "1", "--max-tokens", "3000",
            "--step", "1"]
    run(base)
    one_line_error(run(base + ["--min-len", "3"], check=False), "decoding.generation.min_len")
    # the same subset name in another data folder: refused when its first epoch is read
    shutil.copy2(epoch_checkpoints / "checkpoint1.pt", folder / "checkpoint2.pt")
    os.utime(folder / "checkpoint2.pt", (past, past))
    other = [tiny_data if a == slice_data else a for a in base]
    one_line_error(run(other, check=False), "data_fingerprint")
