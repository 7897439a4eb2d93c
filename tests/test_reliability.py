"""Issue 39: the compression commands as trustworthy as the studies. No folder deleted by export-ct2 --force, a
refused recover leaves nothing behind, checkpoints store shared embeddings once, reruns resume, every family works
or is refused in one line, options accepted and ignored are refused."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import torch

from conftest import run


def _tree(folder: Path) -> dict:
    """Every file under `folder` by its bytes (byte-identical means this is unchanged)."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _one_line(proc, command: str) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and len(lines) == 1, proc.stderr[-2000:]
    assert lines[0].startswith(f"fairseq-headprune {command}: error:"), lines[0]
    return lines[0]


# --------------------------------------------------------------------------------------------- export-ct2 --force


def _export(data, checkpoint, out, *extra, check=True):
    return run(["fairseq-headprune", "export-ct2", data, "--path", checkpoint, "--out", out, "--gen-subset", "test",
                "--beam", "2", "--max-len-b", "40", "--max-tokens", "800", "--check-sentences", "4", *extra],
               check=check)


def test_export_force_never_replaces_a_folder_it_did_not_write(stock_checkpoint, tiny_data, tmp_path):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "notes.txt").write_text("mine")
    mixed = tmp_path / "mixed"  # a model folder with a file of the user's beside it
    mixed.mkdir()
    for name in ("config.json", "model.bin", "shared_vocabulary.json", "README"):
        (mixed / name).write_text("x")
    nested = tmp_path / "nested"
    (nested / "sub").mkdir(parents=True)
    for name in ("config.json", "model.bin"):
        (nested / name).write_text("x")
    holder = stock_checkpoint.parent  # the folder holding --path
    cases = [(notes, "notes.txt"), (mixed, "README"), (nested, "sub"), (tiny_data, "an input"),
             (holder, "an input")]
    for folder, why in cases:
        before = _tree(folder)
        line = _one_line(_export(tiny_data, stock_checkpoint, folder, "--force", check=False), "export-ct2")
        assert str(folder) in line and why in line, line
        assert _tree(folder) == before, f"{folder} changed"
    # an empty folder and a CTranslate2 model folder (what export-ct2 wrote) are replaced
    empty = tmp_path / "empty"
    empty.mkdir()
    _export(tiny_data, stock_checkpoint, empty, "--force")
    assert (empty / "model.bin").exists()
    first = _tree(empty)
    _export(tiny_data, stock_checkpoint, empty, "--force", "--quantization", "int8")
    assert _tree(empty) != first and (empty / "model.bin").exists()


# --------------------------------------------------------------------------------------------- recover refusals

REMOVED = "enc-self:1:1-7,dec-self:1:1-3"


@pytest.fixture(scope="module")
def student(stock_checkpoint, tiny_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("student") / "pruned.pt"
    run(["fairseq-headprune", "remove", tiny_data, "--path", stock_checkpoint, "--heads", REMOVED, "--out", out,
         "--gen-subset", "test"])
    return out


def _recover(data, student, teacher, out, *extra, check=True):
    return run(["fairseq-headprune", "recover", data, "--path", student, "--teacher", teacher, "--out", out,
                "--max-tokens", "1500", "--log-interval", "5", *extra], check=check)


def _other_dictionaries(tiny_data: Path, folder: Path) -> Path:
    """DATA with a target dictionary of four more words (binarised files unchanged)."""
    folder.mkdir()
    for path in tiny_data.iterdir():
        if path.is_file():
            (folder / path.name).symlink_to(path)
    for lang in ("de", "en"):
        (folder / f"dict.{lang}.txt").unlink()
        text = (tiny_data / f"dict.{lang}.txt").read_text(encoding="utf-8")
        (folder / f"dict.{lang}.txt").write_text(text + "".join(f"zzextra{i} 1\n" for i in range(4)),
                                                 encoding="utf-8")
    return folder


def test_a_refused_recover_writes_nothing_and_its_correction_runs(student, stock_checkpoint, tiny_data, tmp_path):
    out = tmp_path / "r.pt"
    work = tmp_path / "r.recover"
    before = sorted(p.name for p in tiny_data.parent.iterdir())
    other = _other_dictionaries(tiny_data, tmp_path / "other-dicts")
    cases = [
        (tiny_data, ["--distill-temperature", "0"], "--distill-temperature must be > 0"),
        (tiny_data, ["--distill-weight", "1.5"], "--distill-weight must be in [0, 1]"),
        (tiny_data, ["--task", "translation_headprune", "--mask-heads", "enc-self:1:2"], "was removed"),
        (tiny_data, ["--max-tokens", "5"], "--max-tokens 5 is below the longest sentence"),
        (tiny_data, ["--fp16"], "--fp16"),
        (tiny_data, ["--distill", "sequences", "--sequence-beam", "0"], "--sequence-beam must be at least 1"),
        (tiny_data, ["--sequence-beam", "3"], "--distill logits does not use"),
        (other, [], "dictionaries of"),
    ]
    for data, extra, message in cases:
        line = _one_line(_recover(data, student, stock_checkpoint, out, "--updates", "2", *extra, check=False),
                         "recover")
        assert message in line, (extra, line)
        assert not out.exists() and not work.exists(), (extra, "left behind")
        assert sorted(p.name for p in tiny_data.parent.iterdir()) == before, (extra, "a teacher cache beside DATA")
    _recover(tiny_data, student, stock_checkpoint, out, "--updates", "2")  # the correction runs
    assert out.exists() and json.loads((tmp_path / "r.json").read_text())["updates"] == 2


def test_a_run_folder_a_failed_run_left_without_checkpoints_is_taken_over(tmp_path):
    from fairseq_headprune.prune.recover import check_identity

    (tmp_path / "recover-run.json").write_text(json.dumps({"distill": "logits", "criterion.distill_weight": 1.5}))
    check_identity(str(tmp_path), {"distill": "logits", "criterion.distill_weight": 0.9})
    assert json.loads((tmp_path / "recover-run.json").read_text())["criterion.distill_weight"] == 0.9


def test_two_recover_runs_of_one_out_cannot_both_write_it(student, stock_checkpoint, tiny_data, tmp_path):
    import subprocess
    import sys

    out = tmp_path / "same.pt"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({str(tmp_path / '.same.pt.lock')!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(60)\n")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"  # another recover of OUT, its own work folder
        line = _one_line(_recover(tiny_data, student, stock_checkpoint, out, "--updates", "2", "--work-dir",
                                  tmp_path / "mine", check=False), "recover")
        assert "being written by another" in line and str(out) in line
        assert not (tmp_path / "mine").exists() and not out.exists()
    finally:
        holder.kill()
        holder.wait()


# --------------------------------------------------------------------------------------------- checkpoint bytes


def _half_copy(checkpoint: Path, out: Path) -> Path:
    """The checkpoint stored in fp16, its tied embeddings one tensor (as the bundled models are)."""
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    halves = {}
    state["model"] = {k: halves.setdefault(v.data_ptr(), v.half()) if v.is_floating_point() else v
                      for k, v in state["model"].items()}
    torch.save(state, out)
    return out


def test_a_shrunk_checkpoint_stores_shared_embeddings_once_and_is_smaller(stock_checkpoint, tiny_data, tmp_path):
    parent = _half_copy(stock_checkpoint, tmp_path / "half.pt")
    out = tmp_path / "small.pt"
    run(["fairseq-headprune", "shrink", tiny_data, "--path", parent, "--remove", "50%", "--out", out,
         "--calibration-sentences", "16", "--max-tokens", "1500", "--no-check"])
    weights = torch.load(out, map_location="cpu", weights_only=False)["model"]
    names = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "decoder.output_projection.weight")
    assert len({weights[n].untyped_storage().data_ptr() for n in names}) == 1, "one stored vocabulary"
    assert weights[names[0]].dtype == torch.float16
    assert out.stat().st_size < parent.stat().st_size, (out.stat().st_size, parent.stat().st_size)


def test_equal_states_write_equal_bytes_whatever_the_temporary_name(tmp_path):
    from fairseq_headprune.fairseq_io.checkpoint_io import save_state

    emb = torch.randn(10, 4)
    state = {"model": {"encoder.embed_tokens.weight": emb, "decoder.embed_tokens.weight": emb.clone(),
                       "decoder.output_projection.weight": emb.clone()}, "cfg": {"x": 1}}
    save_state(state, str(tmp_path / ".a.pt.x1y2.tmp"))
    save_state(state, str(tmp_path / ".b.pt.q9r8.tmp"))
    a, b = (tmp_path / ".a.pt.x1y2.tmp").read_bytes(), (tmp_path / ".b.pt.q9r8.tmp").read_bytes()
    assert a == b
    torch.save(state, tmp_path / "plain.pt")  # three copies of the vocabulary
    assert len(a) < (tmp_path / "plain.pt").stat().st_size
    loaded = torch.load(tmp_path / ".a.pt.x1y2.tmp", weights_only=False)["model"]
    assert all(torch.equal(loaded[k], v) for k, v in state["model"].items())


# --------------------------------------------------------------------------------------------- reruns resume


def _kill_while_recovering(argv, work: Path) -> None:
    """`fairseq-headprune ARGV` in its own process, killed with SIGKILL once its recovery has begun."""
    import signal
    import subprocess
    import time

    from conftest import BIN, ENV

    proc = subprocess.Popen([str(BIN / "fairseq-headprune"), *map(str, argv)], env=ENV, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 300
    while not (work / "recover-run.json").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert (work / "recover-run.json").exists(), "killed while it recovered"


def test_shrink_recover_epochs_resumes_after_kill_and_extends_without_rewriting_the_student(
        stock_checkpoint, tiny_data, tmp_path):
    from fairseq_headprune.records.identity import file_sha256

    out = tmp_path / "small.pt"
    argv = ["shrink", tiny_data, "--path", stock_checkpoint, "--remove", "50%", "--out", out,
            "--calibration-sentences", "32", "--max-tokens", "1500", "--no-check"]
    _kill_while_recovering([*argv, "--recover-epochs", "1"], tmp_path / "small.recover")
    shrunk = tmp_path / "small.shrunk.pt"
    assert shrunk.exists() and not out.exists()
    student = file_sha256(shrunk)
    proc = run(["fairseq-headprune", *argv, "--recover-epochs", "1"])  # the same command: resumes
    assert "reusing" in proc.stdout
    assert [e["epoch"] for e in json.loads((tmp_path / "small.json").read_text())["epochs"]] == [1]
    proc = run(["fairseq-headprune", *argv, "--recover-epochs", "2"])  # extended by one epoch
    record = json.loads((tmp_path / "small.json").read_text())
    assert [e["epoch"] for e in record["epochs"]] == [1, 2]
    assert file_sha256(shrunk) == student == record["student_sha256"], "the student a finished run points at"
    # another shrink to the same OUT would rewrite the student the recovered model points at: refused
    line = _one_line(run(["fairseq-headprune", *argv[:4], "--remove", "25%", *argv[6:], "--recover-epochs", "2"],
                         check=False), "shrink")
    assert "another remove" in line and "--work-dir" not in line and "--force" not in line, line
    assert file_sha256(shrunk) == student


# --------------------------------------------------------------------------------------------- every family


def _family_task(name):
    import families as fam

    if name == "multilingual":
        return fam.multilingual(), fam.spm_data(), fam.spm_data() / "slice", [*fam.MULTI_TASK, "-s", "de", "-t", "en"]
    return fam.mbart(), fam.spm_data() / "mbart", fam.spm_data() / "mbart-slice", fam.MBART_TASK


@pytest.mark.parametrize("name", ["multilingual", "mbart"])
def test_shrink_recover_extend_and_export_under_every_family(name, tmp_path):
    checkpoint, data, slice_, task = _family_task(name)
    out = tmp_path / "small.pt"
    shrink = ["fairseq-headprune", "shrink", data, "--path", checkpoint, *task, "--remove", "25%", "--out", out,
              "--calibration-sentences", "16", "--max-tokens", "1500", "--no-check"]
    _kill_while_recovering([*shrink[1:], "--recover-epochs", "1"], tmp_path / "small.recover")
    assert not out.exists()
    assert "reusing" in run([*shrink, "--recover-epochs", "1"]).stdout  # the rerun resumes
    assert [e["epoch"] for e in json.loads((tmp_path / "small.json").read_text())["epochs"]] == [1]
    proc = run([*shrink, "--recover-epochs", "2"])  # extended by one epoch, the student reused
    assert "reusing" in proc.stdout
    assert [e["epoch"] for e in json.loads((tmp_path / "small.json").read_text())["epochs"]] == [1, 2]
    # recover itself, on the recovered model (a Namespace task config, as fairseq saves these families')
    proc = run(["fairseq-headprune", "recover", data, "--path", out, "--teacher", checkpoint, "--out",
                tmp_path / "again.pt", "--updates", "2", "--max-tokens", "1500"])
    assert "last valid loss none" not in proc.stdout and "last valid loss" in proc.stdout
    export = ["fairseq-headprune", "export-ct2", slice_, "--path", out, "--out", tmp_path / "ct2", *task,
              "--gen-subset", "test", "--beam", "4", "--max-tokens", "800", "--check-sentences", "16"]
    speed = ["fairseq-headprune", "speed", slice_, "--path", checkpoint, *task, "--heads", "enc-self:1:1",
             "--engine", "ct2", "--results-dir", tmp_path / "speed", "--gen-subset", "test", "--num-sentences", "8",
             "--batch-sizes", "4", "--runs", "1"]
    if name == "mbart":  # CTranslate2 cannot end hypotheses on the language token as fairseq's mBART does
        assert "language token" in _one_line(run(speed, check=False), "speed")
        assert "translation_from_pretrained_bart" in _one_line(run(export, check=False), "export-ct2")
        assert not (tmp_path / "ct2").exists()
        return
    run(speed)  # the multilingual task's target language token is CTranslate2's target prefix there too
    proc = run(export)  # the language tokens passed as CTranslate2's target prefix: its hypotheses are fairseq's
    assert "16 sentences of 'test': 0 hypotheses differ" in proc.stdout, proc.stdout
    _ct2_equals_fairseq_generate(tmp_path / "ct2", out, slice_, task)


def _ct2_equals_fairseq_generate(folder, checkpoint, data, task):
    """CTranslate2 with the target language token as prefix gives fairseq-generate's H- lines, token for token."""
    import ctranslate2

    from conftest import run_fairseq

    gen = run_fairseq(["fairseq-generate", data, "--path", checkpoint, "--user-dir", "fairseq_headprune", *task,
                       "--gen-subset", "test", "--beam", "4", "--max-tokens", "800"])
    hyps, sources = {}, {}
    for line in gen.stdout.splitlines():
        kind, _, rest = line.partition("\t")
        if kind.startswith("H-"):
            hyps[int(kind[2:])] = rest.split("\t")[1].split()
        elif kind.startswith("S-"):
            sources[int(kind[2:])] = rest.split()
    assert len(hyps) == 16
    translator = ctranslate2.Translator(str(folder), device="cpu", intra_threads=1)
    ids = sorted(hyps)
    results = translator.translate_batch([sources[i] for i in ids], beam_size=4, max_input_length=0,
                                         target_prefix=[["__en__"]] * len(ids), max_decoding_length=200)
    assert [r.hypotheses[0][1:] for r in results] == [hyps[i] for i in ids]


# --------------------------------------------------------------------------------------------- misreports


def test_export_says_a_binding_length_limit_is_why_hypotheses_differ(stock_checkpoint, tiny_data, tmp_path):
    common = ["fairseq-headprune", "export-ct2", tiny_data, "--path", stock_checkpoint, "--gen-subset", "test",
              "--max-len-b", "3", "--max-tokens", "800", "--check-sentences", "100"]
    line = _one_line(run([*common, "--out", tmp_path / "a", "--beam", "3"], check=False), "export-ct2")
    assert "reach the length limit" in line and "--max-len-b 3" in line and "beam 1" in line, line
    assert not (tmp_path / "a").exists()
    run([*common, "--out", tmp_path / "b", "--beam", "1"])  # at beam 1 both engines cut alike


def test_recover_says_an_early_stop_and_the_last_validated_loss(student, stock_checkpoint, tiny_data, tmp_path):
    out = tmp_path / "e.pt"
    proc = _recover(tiny_data, student, stock_checkpoint, out, "--updates", "40", "--lr", "0.5",
                    "--validate-interval-updates", "2", "--save-interval-updates", "2", "--patience", "1",
                    "--no-epoch-checkpoints")
    record = json.loads((tmp_path / "e.json").read_text())
    assert record["early_stop"] and "--patience 1" in record["early_stop"], record
    assert record["updates"] < 40 and record["last_valid_loss"] is not None
    assert "stopped early" in proc.stdout and "last valid loss None" not in proc.stdout, proc.stdout


# --------------------------------------------------------------------------------------------- options ignored


def test_deploy_refuses_a_free_shape_candidate_before_timing(student, stock_checkpoint, tiny_data, tmp_path):
    from fairseq_headprune.studies.deploy import heads_per_layer

    proc = run(["fairseq-headprune", "deploy", tiny_data, "--path", stock_checkpoint, "--results-dir", tmp_path / "d",
                "--gen-subset", "test", "--shrink-percent", "0", "--compare", f"free={student}", "--candidate", "free"],
               check=False)
    line = _one_line(proc, "deploy")
    assert "--candidate free has a free shape" in line, line
    assert not (tmp_path / "d" / "deploy.json").exists()
    per_stack = {"encoder_layers": 2, "decoder_layers": 1, "encoder_attention_heads": 8, "decoder_attention_heads": 4,
                 "kept_heads": json.dumps({"enc-self": {"1": [1, 2], "2": [3, 4]}, "dec-self": {"1": [1]},
                                           "enc-dec": {"1": [2]}})}
    assert heads_per_layer(per_stack) == {"encoder": {2}, "decoder": {1}}


def test_the_probe_tool_replays_the_force_cases():
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
    import probe_compression

    assert probe_compression.main(["--only", "export-ct2 --force"]) == 0


def test_sequence_distillation_under_a_language_token_task_is_refused(tmp_path):
    import families as fam

    checkpoint = fam.multilingual()
    line = _one_line(run(["fairseq-headprune", "recover", fam.spm_data(), "--path", checkpoint, "--teacher",
                          checkpoint, "--out", tmp_path / "s.pt", "--distill", "sequences", "--updates", "2"],
                         check=False), "recover")
    assert "translation_multi_simple_epoch" in line and not (tmp_path / "s.recover").exists()
