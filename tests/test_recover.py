"""`recover`: the distillation loss, a recovered checkpoint of the student's shape, resume after kill -9, bad input."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import pytest
import torch

from conftest import BIN, ENV, run, run_fairseq
from fairseq_headprune.criterions.label_smoothed_cross_entropy_distill import distillation_kl
from fairseq_headprune.records.identity import file_sha256

REMOVED = "enc-self:1:1-7,enc-self:2:2+3,dec-self:1:1-3,enc-dec:3:2"  # one layer left with a single head


def test_distillation_kl_is_zero_for_the_teacher_and_has_the_right_gradient():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 7, dtype=torch.float64)
    keep = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]], dtype=torch.float64)
    for t in (1.0, 2.0):
        assert distillation_kl(logits, logits, keep, t).abs().item() < 1e-12
    teacher = torch.randn(2, 3, 7, dtype=torch.float64)
    student = logits.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda s: distillation_kl(s, teacher, keep, 2.0), (student,))
    # a padded position contributes nothing, whatever its logits
    moved = teacher.clone()
    moved[0, 2] += 5
    torch.testing.assert_close(distillation_kl(logits, teacher, keep, 1.0), distillation_kl(logits, moved, keep, 1.0))


def test_hidden_distance_is_zero_for_the_teacher_ignores_padding_and_refuses_other_depths():
    from fairseq_headprune.criterions.label_smoothed_cross_entropy_distill import hidden_distance
    from fairseq_headprune.errors import UserError

    torch.manual_seed(0)
    teacher = [torch.randn(3, 2, 4, dtype=torch.float64) for _ in range(3)]  # embeddings + 2 layers, (T, B, C)
    keep = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]], dtype=torch.float64)  # (B, T)
    assert hidden_distance(teacher, teacher, keep).item() == 0
    student = [h + 1.0 for h in teacher]  # every channel of every layer off by 1: the mean over both is 1
    student[0] = teacher[0] + 7.0  # the embeddings are no layer's output: not compared
    assert hidden_distance(student, teacher, keep).item() == pytest.approx(5.0)  # five kept positions
    student[1][2, 0] += 100.0  # position 2 of sentence 0 is padding
    assert hidden_distance(student, teacher, keep).item() == pytest.approx(5.0)
    with pytest.raises(UserError, match="the student has 1, the teacher 2"):
        hidden_distance(student[:2], teacher, keep)


def _criterion(task, teacher_path, weight, temperature, hidden=0.0):
    from fairseq_headprune.criterions.label_smoothed_cross_entropy_distill import (
        LabelSmoothedCrossEntropyDistillCriterion,
    )

    return LabelSmoothedCrossEntropyDistillCriterion(task, False, 0.1, teacher_path=str(teacher_path),
                                                     distill_weight=weight, distill_temperature=temperature,
                                                     distill_hidden_weight=hidden)


@pytest.mark.parametrize("hidden", [0.0, 2.0])
def test_distillation_criterion_on_a_tiny_model(stock_checkpoint, tiny_data, hidden):
    """Weight 1, T 1, a student identical to its teacher: loss 0. Its gradient equals a finite difference (with
    and without the decoder layers' distance)."""
    from helpers import load_stock, sample_batch

    model, task = load_stock(stock_checkpoint, tiny_data)
    batch = sample_batch(task, 4)
    criterion = _criterion(task, stock_checkpoint, 1.0, 1.0, hidden)
    loss, sample_size, log = criterion(model, batch)
    assert abs(loss.item()) < 1e-3 * sample_size and sample_size == batch["ntokens"]
    assert ("hidden" in log) == (hidden > 0)
    assert not any(p.requires_grad for p in criterion.teacher.parameters())
    assert not list(criterion.parameters()), "the teacher is no part of the criterion's module tree"
    # move one weight of the student and compare d loss / d w with a central finite difference (float64)
    model = model.double()
    criterion.teacher.double()
    w = model.decoder.layers[-1].final_layer_norm.bias  # no ReLU kink between it and the loss
    model.zero_grad()
    with torch.random.fork_rng():
        torch.manual_seed(1)
        with torch.no_grad():
            w.add_(torch.randn_like(w) * 0.1)
    loss, _, _ = criterion(model, batch)
    loss.backward()
    grad = w.grad[3].item()
    eps = 1e-5
    values = []
    for sign in (1, -1):
        with torch.no_grad():
            w[3] += sign * eps
            values.append(criterion(model, batch)[0].item())
            w[3] -= sign * eps
    assert grad == pytest.approx((values[0] - values[1]) / (2 * eps), rel=1e-4, abs=1e-7)


@pytest.fixture(scope="module")
def student(stock_checkpoint, tiny_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("student") / "pruned.pt"
    run(["fairseq-headprune", "remove", tiny_data, "--path", stock_checkpoint, "--heads", REMOVED, "--out", out,
         "--gen-subset", "test"])
    return out


def _recover(tiny_data, student, teacher, out, *extra, check=True):
    return run(["fairseq-headprune", "recover", tiny_data, "--path", student, "--teacher", teacher, "--out", out,
                "--max-tokens", "1500", "--log-interval", "5", *extra], check=check)


def test_recovered_checkpoint_keeps_the_students_heads_and_decodes_with_fairseq_generate(
        student, stock_checkpoint, tiny_data, tmp_path):
    from fairseq_headprune.core.heads import HeadLayout
    from helpers import load_stock

    teacher_hash = file_sha256(stock_checkpoint)
    out = tmp_path / "recovered.pt"
    proc = _recover(tiny_data, student, stock_checkpoint, out, "--updates", "6")
    assert "wrote" in proc.stdout
    assert file_sha256(stock_checkpoint) == teacher_hash, "the teacher never changes"
    record = json.loads((tmp_path / "recovered.json").read_text())
    assert record["updates"] == 6 and record["teacher_sha256"] == teacher_hash
    assert record["checkpoint_sha256"] == file_sha256(out)
    assert record["criterion"] == "label_smoothed_cross_entropy_distill" and record["distill_weight"] == 0.9
    assert record["distill_temperature"] == 2.0
    saved = torch.load(out, map_location="cpu", weights_only=False)["cfg"]["model"]
    assert saved.dropout == 0.1 and saved.kept_heads, "recover's default dropout, the student's own shape"
    before, _ = load_stock(student, tiny_data)
    after, task = load_stock(out, tiny_data)
    assert HeadLayout.of(after).heads == HeadLayout.of(before).heads
    changed = [n for n, p in after.state_dict().items() if not torch.equal(p, before.state_dict()[n])]
    assert changed, "fine-tuning moved the weights"
    gen = run_fairseq(["fairseq-generate", tiny_data, "--path", out, "--user-dir", "fairseq_headprune",
                       "--gen-subset", "test", "--beam", "2", "--max-tokens", "2000", "--max-len-b", "20"])
    assert sum(line.startswith("H-") for line in gen.stdout.splitlines()) == len(task.dataset("test"))


def test_kill_during_recover_then_rerun_finishes_and_counts_each_update_once(student, stock_checkpoint, tiny_data,
                                                                            tmp_path):
    out = tmp_path / "r.pt"
    argv = [str(BIN / "fairseq-headprune"), "recover", str(tiny_data), "--path", str(student), "--teacher",
            str(stock_checkpoint), "--out", str(out), "--max-tokens", "600", "--updates", "40",
            "--save-interval-updates", "8", "--no-epoch-checkpoints"]
    proc = subprocess.Popen(argv, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    last = tmp_path / "r.recover" / "checkpoint_last.pt"
    deadline = time.time() + 120
    while not last.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert last.exists() and not out.exists(), "killed between its first checkpoint and its end"
    assert list((tmp_path / "r.recover").glob("checkpoint_1_*.pt")), "fairseq's atomically written checkpoint"
    # fairseq *copies* that file to checkpoint_last.pt: a kill during the copy leaves it truncated
    last.write_bytes(last.read_bytes()[:1000])
    _recover(tiny_data, student, stock_checkpoint, out, "--updates", "40", "--save-interval-updates", "8",
             "--no-epoch-checkpoints", "--max-tokens", "600")
    record = json.loads((tmp_path / "r.json").read_text())
    assert record["updates"] == 40


def _bad(tiny_data, student, teacher, out, *extra):
    proc = _recover(tiny_data, student, teacher, out, *extra, check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert lines[0].startswith("fairseq-headprune recover: error:")
    assert not os.path.exists(out)
    return lines[0]


def test_bad_input_is_one_line(student, stock_checkpoint, tiny_data, tmp_path):
    out = tmp_path / "x.pt"
    assert "--updates must be at least 1" in _bad(tiny_data, student, stock_checkpoint, out, "--updates", "0")
    assert "no 'nosuch' subset" in _bad(tiny_data, student, stock_checkpoint, out, "--train-subset", "nosuch")
    assert "--arch is set by recover" in _bad(tiny_data, student, stock_checkpoint, out, "--arch", "transformer")
    assert "cannot change" in _bad(tiny_data, student, stock_checkpoint, out, "--encoder-layers", "2")
    assert "does not use" in _bad(tiny_data, student, stock_checkpoint, out, "--distill", "none",
                                  "--distill-temperature", "3")
    assert "does not use" in _bad(tiny_data, student, stock_checkpoint, out, "--distill", "sequences",
                                  "--distill-hidden-weight", "1")
    assert "--distill-hidden-weight must be at least 0" in _bad(tiny_data, student, stock_checkpoint, out,
                                                                "--distill-hidden-weight", "-1")
    assert "unknown option --bogus" in _bad(tiny_data, student, stock_checkpoint, out, "--bogus", "3")
    assert "--lr" in _bad(tiny_data, student, stock_checkpoint, out, "--lr", "abc")
    # a teacher of another network: its config says so before anything is built
    state = torch.load(stock_checkpoint, map_location="cpu", weights_only=False)
    state["cfg"]["model"].decoder_ffn_embed_dim = 128
    other = tmp_path / "other.pt"
    torch.save(state, other)
    assert "not a pruned model of the teacher" in _bad(tiny_data, student, other, out)
    # a teacher with other dictionaries
    state = torch.load(stock_checkpoint, map_location="cpu", weights_only=False)
    emb = state["model"]["encoder.embed_tokens.weight"]
    for key in [k for k, v in state["model"].items() if v.shape[:1] == emb.shape[:1] and v.dim() == 2]:
        state["model"][key] = torch.cat([state["model"][key], state["model"][key][:4]])
    torch.save(state, other)
    assert "dictionar" in _bad(tiny_data, student, other, out)


def test_hidden_weight_reaches_fairseq_train_and_the_record(student, stock_checkpoint, tiny_data, tmp_path):
    out = tmp_path / "h.pt"
    proc = _recover(tiny_data, student, stock_checkpoint, out, "--updates", "2", "--distill-hidden-weight", "0.5")
    assert re.search(r"\| hidden \d", proc.stdout + proc.stderr), "the criterion logs the layers' distance"
    record = json.loads((tmp_path / "h.json").read_text())
    assert record["distill_hidden_weight"] == 0.5
    run_json = json.loads((tmp_path / "h.recover" / "recover-run.json").read_text())
    assert run_json["criterion.distill_hidden_weight"] == 0.5, "a rerun with another β is another run"


def test_a_run_folder_written_before_a_setting_existed_matches_its_old_value(tmp_path):
    from fairseq_headprune.prune.recover import check_identity
    from fairseq_headprune.errors import UserError

    old = {"distill": "logits", "criterion.distill_weight": 0.9}  # written before --distill-hidden-weight existed
    (tmp_path / "recover-run.json").write_text(json.dumps(old))
    (tmp_path / "checkpoint_last.pt").write_bytes(b"")  # a run with checkpoints (one without any is taken over)
    check_identity(str(tmp_path), {**old, "criterion.distill_hidden_weight": 0.0})  # what every old run trained with
    with pytest.raises(UserError, match="another criterion.distill_hidden_weight"):
        check_identity(str(tmp_path), {**old, "criterion.distill_hidden_weight": 0.1})


def test_a_run_folder_of_another_setting_is_refused(student, stock_checkpoint, tiny_data, tmp_path):
    out = tmp_path / "a.pt"
    _recover(tiny_data, student, stock_checkpoint, out, "--updates", "2", "--work-dir", tmp_path / "w")
    line = _bad(tiny_data, student, stock_checkpoint, tmp_path / "b.pt", "--updates", "2", "--work-dir",
                tmp_path / "w", "--distill-weight", "0.5")
    assert "another" in line and "--work-dir" in line


def test_shrink_then_recover_in_one_call(stock_checkpoint, tiny_data, tmp_path):
    out = tmp_path / "small.pt"
    proc = run(["fairseq-headprune", "shrink", tiny_data, "--path", stock_checkpoint, "--remove", "50%", "--out", out,
                "--calibration-sentences", "32", "--max-tokens", "1500", "--recover-epochs", "1"])
    assert (tmp_path / "small.shrunk.pt").exists() and (tmp_path / "small.json").exists(), proc.stdout
    shrunk = json.loads((tmp_path / "small.shrunk.json").read_text())
    record = json.loads((tmp_path / "small.json").read_text())
    assert record["student_sha256"] == file_sha256(tmp_path / "small.shrunk.pt")
    assert record["teacher_sha256"] == shrunk["source_sha256"] == file_sha256(stock_checkpoint)
    assert [e["epoch"] for e in record["epochs"]] == [1]


def test_the_epoch_of_a_checkpoint_saved_at_an_epoch_end_is_that_epoch():
    """fairseq's iterator state saved at the end of epoch 1 names epoch 2 with no iterations in it (found in the
    En-Fr control's record: best at 520 updates, "epoch 2", of 520 updates an epoch); a mid-epoch save names its own."""
    from fairseq_headprune.prune.recover import checkpoint_epoch

    def state(epoch, iterations):
        return {"extra_state": {"train_iterator": {"version": 2, "epoch": epoch, "iterations_in_epoch": iterations}}}

    assert checkpoint_epoch(state(2, 0)) == 1 and checkpoint_epoch(state(3, 0)) == 2
    assert checkpoint_epoch(state(2, 17)) == 2 and checkpoint_epoch(state(1, 0)) == 1
    assert checkpoint_epoch({"extra_state": {}}) is None and checkpoint_epoch({}) is None


def test_a_distillation_set_is_translated_by_the_teacher_and_trained_on_beside_train(student, stock_checkpoint,
                                                                                     tiny_data, tmp_path):
    from fairseq.data import indexed_dataset

    from conftest import SLICE

    raw = tmp_path / "mono.de"
    raw.write_text((SLICE / "test.de").read_text(encoding="utf-8"), encoding="utf-8")  # German the model never saw
    encoders = ["-s", "de", "-t", "en", "--tokenizer", "moses", "--bpe", "subword_nmt", "--bpe-codes",
                str(tiny_data / "code")]
    out = tmp_path / "r.pt"
    # the raw text without the model's tokenizer and BPE: mostly unknown words, refused before any decoding
    assert "unknown to the model's dictionary" in _bad(tiny_data, student, stock_checkpoint, out, "--distill-source",
                                                       raw, "--updates", "2")
    assert "--distill-nbest must be between 1 and --sequence-beam" in _bad(
        tiny_data, student, stock_checkpoint, out, "--distill-source", raw, "--distill-nbest", "3",
        "--sequence-beam", "2", *encoders)
    proc = _recover(tiny_data, student, stock_checkpoint, out, "--distill-source", raw, "--distill-nbest", "2",
                    "--sequence-beam", "2", "--updates", "3", *encoders)
    assert "distillation set: 200 source sentences, 400 pairs" in proc.stdout + proc.stderr
    folder, = [p for p in tiny_data.parent.glob(f"{tiny_data.name}.distill-*")  # (beside other tests' sets)
               if json.loads((p / "distillation-set.json").read_text())["sources"] == 200]
    src = indexed_dataset.make_dataset(str(folder / "train1.de-en.de"), impl="mmap")
    tgt = indexed_dataset.make_dataset(str(folder / "train1.de-en.en"), impl="mmap")
    assert len(src) == len(tgt) == 400
    assert src[0].tolist() == src[1].tolist() and tgt[0].tolist() != tgt[1].tolist(), "two translations a sentence"
    assert "train1" in proc.stderr, "fairseq-train loaded the shard beside train"
    record = json.loads((tmp_path / "r.json").read_text())
    assert record["updates"] == 3 and record["options"]["distillation"]["source"] == [str(raw)]
    # the same run with another distillation set is another run: its folder is refused
    other = tmp_path / "other.de"
    other.write_text("\n".join((SLICE / "valid.de").read_text(encoding="utf-8").splitlines()[:20]) + "\n")
    proc = _recover(tiny_data, student, stock_checkpoint, tmp_path / "r2.pt", "--work-dir", tmp_path / "r.recover",
                    "--distill-source", other, "--distill-nbest", "2", "--sequence-beam", "2", "--updates", "3",
                    *encoders, check=False)
    assert proc.returncode == 2 and "distill_source" in proc.stderr, proc.stderr[-2000:]
