"""`compress` under the families' tasks, on their tiny models (tests/families.py). The multilingual model (its
target language token as CTranslate2's target prefix, recovery on the run's --lang-pairs) ends in a card and a
deployable ct2/ whose `translate` of the raw test sentences, from a copy of the output folder elsewhere, is the
CTranslate2 model's own decoding in the run's report (so its BLEU is the card's). mBART's task is refused in one line
for the CTranslate2 engines, naming compress and the reason, and compressed in fairseq."""
import json
import os
import re
import shutil
import subprocess

import families as fam
from conftest import BIN, ENV, ROOT, SLICE, run

SPM = ["--bpe", "sentencepiece", "--sentencepiece-model"]
SMALL_RUN = ["--shape", "4/2", "--speedup", "1.01", "--beam", "1", "--max-tokens", "2000", "--max-len-b", "20",
             "--timing-sentences", "40", "--runs", "1", "--calibration-sentences", "32", "--window-steps", "5",
             "--check-sentences", "16", "--budget-epochs", "1", "--recover-args", "--max-tokens 4000",
             "--significance", "1", "--latency-sentences", "8"]


def compress(data, model, out, cache, task, *extra, check=True):
    return run(["fairseq-headprune", "compress", data, "--path", model, "--out", out, "--cost-cache", cache, *task,
                *SMALL_RUN, *extra], check=check)


def test_multilingual_model_compresses_to_a_folder_that_translates_raw_text(tmp_path):
    data = fam.spm_data()
    task = [*fam.MULTI_TASK, "-s", "de", "-t", "en", *SPM, data / "spm.model"]
    out = tmp_path / "small"
    compress(data, fam.multilingual(), out, tmp_path / "cache", task, "--engine", "ct2-float32")
    record = json.loads((out / "compress.json").read_text())
    card = (out / "MODEL_CARD.md").read_text()
    assert record["stages"]["choice"]["chosen"]["dec_heads"] == 2 and record["stages"]["report"]["sentences"] > 0
    assert record["stages"]["measure"]["latency_batch1"]["sentences"] == 8
    assert "latency at batch 1 (one sentence at a time)" in card.split("## Result")[0]
    assert str(tmp_path) not in card and str(tmp_path) not in (out / "compress.json").read_text()
    settings = json.loads((out / "ct2" / "translate.json").read_text())
    assert settings["source_prefix"] == ["__de__"] and settings["target_prefix"] == ["__en__"]
    assert (out / "ct2" / "MODEL_CARD.md").read_text() == card  # the card travels with the model

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.move(str(out), elsewhere / "small")
    source = (SLICE / "test.de").read_text(encoding="utf-8")
    (elsewhere / "raw.de").write_text(source, encoding="utf-8")
    # the README's command, as written, in the folder holding small/
    readme = (ROOT / "README.md").read_text(encoding="utf-8").split("### Using the result")[1]
    (command,) = [line.split("#")[0].strip() for line in readme.splitlines()
                  if line.startswith("fairseq-headprune translate")]
    assert re.fullmatch(r"fairseq-headprune translate small/ < raw\.de > out\.en", command)
    subprocess.run(["bash", "-c", command], cwd=elsewhere, check=True,
                   env={**ENV, "PATH": f"{BIN}{os.pathsep}{ENV.get('PATH', '')}"})
    got = (elsewhere / "out.en").read_text(encoding="utf-8")
    reported = (elsewhere / "small" / "stages" / "report" / "compressed.test.txt").read_text(encoding="utf-8")
    assert got.splitlines() == reported.splitlines() and len(got.splitlines()) == len(source.splitlines())
    also = run(["fairseq-headprune", "translate", elsewhere / "small" / "ct2"], input=source)
    assert also.stdout == got  # the folder's ct2/ itself, as the compress folder


def test_mbart_model_is_refused_for_ctranslate2_in_one_line_and_compressed_in_fairseq(tmp_path):
    data = fam.spm_data() / "mbart"
    task = [*fam.MBART_TASK, *SPM, fam.spm_data() / "spm.model", "--tokenizer", "space"]
    refused = compress(data, fam.mbart(), tmp_path / "refused", tmp_path / "cache", task, "--engine", "ct2-int8",
                       check=False)
    last = refused.stderr.strip().splitlines()[-1]
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert last.startswith("fairseq-headprune compress: error: compress --engine ct2-int8: CTranslate2 cannot "
                           "decode as translation_from_pretrained_bart (mBART)") and "--engine fairseq" in last
    assert not (tmp_path / "refused").exists()
    out = tmp_path / "small"
    compress(data, fam.mbart(), out, tmp_path / "cache", task, "--engine", "fairseq")
    record = json.loads((out / "compress.json").read_text())
    assert record["engine"] == "fairseq" and (out / "model.pt").is_file() and not (out / "ct2").exists()
    card = (out / "MODEL_CARD.md").read_text()
    assert "4 / 2" in card and "latency at batch 1" in card and "`ct2/`" not in card


def test_speed_in_ctranslate2_under_the_multilingual_task(tmp_path):
    """speed --engine ct2 under translation_multi_simple_epoch (refused before CTranslate2 was given the target
    language token as target prefix): measured, and the pruned and masked models translate alike."""
    data = fam.spm_data() / "slice"
    run(["fairseq-headprune", "speed", data, "--path", fam.multilingual(), *fam.MULTI_TASK, "-s", "de", "-t", "en",
         "--gen-subset", "test", "--heads", "enc-dec:1:1-2,dec-self:2:3", "--results-dir", tmp_path, "--engine",
         "ct2", "--compute-type", "float32", "--batch-sizes", "4", "--runs", "1", "--num-sentences", "8",
         "--beam", "1", "--max-len-b", "20"])
    result = json.loads(next(tmp_path.glob("speed-ct2-*.json")).read_text())
    row = result["threads"]["1"]["batch_sizes"]["4"]
    assert result["num_sentences"] == 8 and row["pruned"]["differing_from_masked"] == 0
