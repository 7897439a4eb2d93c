"""The fairseq families people hold (tests/families.py builds a tiny model of each), under the task each was trained
with: every command once per family, the pruned model reloaded by fairseq-generate under that task, and the same
I_h for a single-pair model scored under `translation` and under `translation_multi_simple_epoch`."""
import json

import pytest

import families as fam
from conftest import run, run_fairseq
from fairseq_headprune.fairseq_io.loading import PACKAGE_DIR

SPM = ["--bpe", "sentencepiece"]


def spm_model():
    return fam.spm_data() / "spm.model"


def _translation_view(tmp_path):
    """The slice as `translation` reads it, with the dictionaries translation_multi_simple_epoch builds (its
    language tokens appended), so that one model loads under both tasks."""
    view = tmp_path / "view"
    view.mkdir()
    src = fam.spm_data() / "slice"
    for path in src.glob("*.de-en.*"):
        (view / path.name).symlink_to(path)
    for lang in ("de", "en"):
        text = (src / f"dict.{lang}.txt").read_text(encoding="utf-8")
        (view / f"dict.{lang}.txt").write_text(text + "__de__ 1\n__en__ 1\n", encoding="utf-8")
    return view


def test_single_pair_model_gives_the_same_importance_under_both_tasks(tmp_path):
    model = fam.single_pair_multi()
    common = ["--path", model, "--gen-subset", "test", "-s", "de", "-t", "en", "--max-tokens", "400"]
    run(["fairseq-headprune", "score", _translation_view(tmp_path), "--task", "translation", *common,
         "--results-dir", tmp_path / "translation"])
    run(["fairseq-headprune", "score", fam.spm_data() / "slice", "--task", "translation_multi_simple_epoch",
         "--lang-pairs", "de-en", *common, "--results-dir", tmp_path / "multi"])
    a, b = (json.loads((tmp_path / name / "importance.json").read_text()) for name in ("translation", "multi"))
    assert a["meta"]["unnormalized"] == b["meta"]["unnormalized"]  # the same computation: bit for bit
    assert a["meta"]["target_tokens"] == b["meta"]["target_tokens"] > 0
    for t in ("enc-self", "enc-dec", "dec-self"):
        assert a[t] == b[t]


# Each family's data (a 16-sentence slice), its task exactly as fairseq-generate takes it, and its text processing.
def _family(name, tiny_data, tmp_path):
    spm = ["--bpe", "sentencepiece", "--sentencepiece-model", fam.spm_data() / "spm.model"]
    if name == "multilingual":
        return fam.multilingual(), fam.spm_data() / "slice", [*fam.MULTI_TASK, "-s", "de", "-t", "en", *spm]
    if name == "mbart":  # fairseq 0.12's own translation_from_pretrained_bart cannot load data: its _headprune twin
        return fam.mbart(), fam.spm_data() / "mbart-slice", [*fam.MBART_TASK, *spm, "--tokenizer", "space"]
    return fam.wmt19(), _bpe_slice(tiny_data, tmp_path), ["--task", "translation", "--bpe", "subword_nmt",
                                                          "--bpe-codes", tiny_data / "code", "--tokenizer", "moses",
                                                          "-s", "de", "-t", "en"]


def _bpe_slice(tiny_data, tmp_path):
    out = tmp_path / "bpe-slice"
    out.mkdir()
    for split in ("valid", "test"):
        for lang in ("de", "en"):
            lines = (tiny_data / f"{split}.bpe.{lang}").read_text(encoding="utf-8").splitlines()[:fam.SLICE_SENTENCES]
            (out / f"{split}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    run_fairseq(["fairseq-preprocess", "--source-lang", "de", "--target-lang", "en", "--srcdict",
                 tiny_data / "dict.de.txt", "--tgtdict", tiny_data / "dict.en.txt", "--validpref", out / "valid",
                 "--testpref", out / "test", "--destdir", out, "--workers", "1"])
    return out


REPORT = ["--gen-subset", "test", "--importance-subset", "valid", "--beam", "1", "--max-len-a", "0",
          "--max-len-b", "20", "--max-tokens", "3000", "--workers", "1", "--masks-per-batch", "8",
          "--keep-one-select", "loss", "--prune-orders", "importance",
          "--prune-step", "0.5", "--speed-batch-sizes", "8", "--speed-runs", "1", "--speed-sentences", "8",
          "--analyze-sentences", "8", "--dynamics", "none", "--shrink-percents", "50",
          "--shrink-calibration-subset", "valid", "--shrink-calibration-sentences", "16", "--deploy-runs", "1",
          "--deploy-batch1-sentences", "2"]
SHORT = ["--gen-subset", "test", "--beam", "2", "--max-len-a", "0", "--max-len-b", "20", "--max-tokens", "3000",
         "--required-batch-size-multiple", "1"]


@pytest.mark.parametrize("name", ["multilingual", "mbart", "wmt19"])
def test_family_through_every_command(name, tiny_data, tmp_path):
    model, data, task = _family(name, tiny_data, tmp_path)
    out = tmp_path / "report"
    parts = ["score", "single", "keep-one", "prune", "prune-types", "speed", "analyze", "shrink"]
    if name == "mbart":  # deploy: CTranslate2 cannot end hypotheses on mBART's language token: refused in one line
        refused = run(["fairseq-headprune", "report", data, "--path", model, "--results-dir", tmp_path / "refused",
                       *task, *REPORT], check=False)
        last = refused.stderr.strip().splitlines()[-1]  # after fairseq's own logging of the task's set-up
        assert refused.returncode == 2 and last.startswith("fairseq-headprune report: error: part deploy: deploy")
        assert "leave deploy out of --parts" in last and "Traceback" not in refused.stderr
        assert "CTranslate2 cannot decode as translation_from_pretrained_bart" in last
    else:  # the multilingual task's target language token is CTranslate2's target prefix
        parts.append("deploy")
    run(["fairseq-headprune", "report", data, "--path", model, "--results-dir", out, *task, *REPORT,
         "--parts", ",".join(parts)])
    state = json.loads((out / "report-state.json").read_text())
    assert set(state["parts"]) == set(parts)
    baseline = json.loads((out / "ablation-single.jsonl").read_text().splitlines()[1])
    assert baseline["bleu"] > 0  # the family's text processing gives real hypotheses and references
    importance = json.loads((out / "importance.json").read_text())
    heads = 16 if name == "wmt19" else 4
    assert all(len(layer) == heads for t in ("enc-self", "enc-dec", "dec-self") for layer in importance[t])

    # an uneven-head model: removed physically, reloaded by fairseq-generate under the family's task, and
    # decoding as the masked model does
    spec = "enc-self:1:1-2,enc-dec:2:3,dec-self:1:1"
    pruned = tmp_path / "pruned.pt"
    run(["fairseq-headprune", "remove", data, "--path", model, *task, "--heads", spec, "--out", pruned])
    generate_task = task if name != "mbart" else ["--task", "translation_from_pretrained_bart_headprune",
                                                  *task[2:]]
    masked_task = [generate_task[0], generate_task[1].removesuffix("_headprune") + "_headprune", *generate_task[2:]]
    reloaded = run_fairseq(["fairseq-generate", data, "--path", pruned, "--user-dir", PACKAGE_DIR, *generate_task,
                            *SHORT]).stdout
    masked = run_fairseq(["fairseq-generate", data, "--path", model, "--user-dir", PACKAGE_DIR, *masked_task,
                          "--mask-heads", spec, *SHORT]).stdout
    hyps = _hypotheses(reloaded)
    assert len(hyps) == fam.SLICE_SENTENCES
    assert hyps == _hypotheses(masked)


def _hypotheses(stdout):
    """fairseq-generate's hypotheses by sentence id (scores left out: they may differ in the last float digits)."""
    return {fields[0]: fields[2] for fields in (line.split("\t") for line in stdout.splitlines())
            if fields[0].startswith("H-")}


def _lm_data(out):
    """A stock fairseq language model (transformer_lm, one update): a model with no encoder-decoder attention."""
    from conftest import _cached_data

    lines = (_cached_data() / "train.bpe.en").read_text(encoding="utf-8").splitlines()[:200]
    (out / "mono.en").write_text("\n".join(lines) + "\n", encoding="utf-8")
    run(["fairseq-preprocess", "--only-source", "--trainpref", out / "mono.en", "--validpref", out / "mono.en",
         "--destdir", out, "--workers", "1"])
    run(["fairseq-train", out, "--task", "language_modeling", "--arch", "transformer_lm", "--decoder-layers", "1",
         "--decoder-embed-dim", "16", "--decoder-ffn-embed-dim", "32", "--decoder-attention-heads", "2",
         "--tokens-per-sample", "64", "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "512", "--max-update",
         "1", "--save-dir", out, "--no-epoch-checkpoints", "--no-save-optimizer-state", "--disable-validation",
         "--num-workers", "0"])


def test_bad_inputs_of_the_families_are_one_line(tmp_path):
    from conftest import build_key, cached_build

    def refused(cmd, *expected):
        proc = run(cmd, check=False) if cmd[0] == "fairseq-headprune" else run_fairseq(cmd, check=False)
        last = proc.stderr.strip().splitlines()[-1]
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        assert all(e in last for e in expected), last

    multi, data = fam.multilingual(), fam.spm_data() / "slice"
    spm = ["--bpe", "sentencepiece", "--sentencepiece-model", spm_model()]
    score = ["fairseq-headprune", "score", data, "--path", multi, "--results-dir", tmp_path / "r", "--gen-subset",
             "test"]
    refused([*score, *fam.MULTI_TASK, "-s", "fr", "-t", "en", *spm],
            "--task translation_multi_simple_epoch: language pair fr-en", "not in the language dictionary")
    refused([*score, *fam.MULTI_TASK, *spm], "scores one language pair: give -s SRC -t TGT", "de-en,en-de")
    refused([*score, *fam.MULTI_TASK, "-s", "de", "-t", "en", "--bpe", "sentencepiece", "--sentencepiece-model",
             tmp_path / "missing.model"], "--sentencepiece-model: no such file", "missing.model")
    # a mixture-of-experts checkpoint (NLLB-200 MoE): its expert weights fit no model fairseq 0.12 builds
    import torch

    state = torch.load(multi, map_location="cpu", weights_only=False)
    state["model"]["encoder.layers.0.moe_layer.experts.0.fc1.weight"] = torch.zeros(2, 2)
    torch.save(state, tmp_path / "moe.pt")
    refused(["fairseq-headprune", "score", data, "--path", tmp_path / "moe.pt", "--results-dir", tmp_path / "r",
             "--gen-subset", "test", *fam.MULTI_TASK, "-s", "de", "-t", "en"], "mixture-of-experts")
    # a task whose models have no attention this package knows: a language model, in both entry points
    lm = cached_build("fam-lm", build_key(_lm_data), _lm_data)
    refused(["fairseq-headprune", "score", lm, "--path", lm / "checkpoint_last.pt", "--task", "language_modeling",
             "--results-dir", tmp_path / "r", "--gen-subset", "valid"],
            "--task language_modeling: model TransformerLanguageModel has no attention this package knows")
    refused(["fairseq-generate", lm, "--path", lm / "checkpoint_last.pt", "--user-dir", PACKAGE_DIR, "--task",
             "language_modeling_headprune", "--gen-subset", "valid", "--mask-heads", "dec-self:1:1"],
            "error: --task language_modeling: model TransformerLanguageModel has no attention this package knows")


def test_public_model_recipe_runs_on_a_tiny_model_of_its_task(tmp_path):
    """recipes/study_public_model.sh's exact M2M-100 arguments, on the tiny multilingual model (same task, language
    tokens, fixed dictionary and sentencepiece); a missing file is one line, exit code 2."""
    import os
    import subprocess

    from conftest import ENV, ROOT, SLICE

    raw = tmp_path / "raw"
    raw.mkdir()
    for split in ("valid", "test"):
        for lang in ("de", "en"):
            (raw / f"{split}.{lang}").write_text((SLICE / f"{split}.{lang}").read_text(encoding="utf-8"))
    pairs = tmp_path / "pairs.txt"
    pairs.write_text(fam.PAIRS + "\n")
    data = fam.spm_data()
    env = {**ENV, "RAW": str(raw), "SRC": "de", "TGT": "en", "N": "16", "OUT": str(tmp_path / "out"),
           "CKPT": str(fam.multilingual()), "MODEL_DICT": str(data / "dict.en.txt"),
           "DATA_DICT": str(data / "dict.en.txt"), "SPM_MODEL": str(spm_model()), "LANG_PAIRS": str(pairs)}
    recipe = [str(ROOT / "recipes" / "study_public_model.sh")]
    proc = subprocess.run(["bash", *recipe, "prepare", "score"], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    importance = json.loads((tmp_path / "out" / "importance.json").read_text())
    assert importance["meta"]["sentences"] == 16 and [len(layer) for layer in importance["enc-dec"]] == [4, 4]
    missing = subprocess.run(["bash", *recipe, "score"], env={**env, "SPM_MODEL": str(tmp_path / "spm.model")},
                             capture_output=True, text=True)
    assert missing.returncode == 2 and missing.stderr.strip().splitlines() == [
        f"study_public_model.sh: error: missing the sentencepiece model (SPM_MODEL, --sentencepiece-model): "
        f"{tmp_path / 'spm.model'}"]
    assert os.path.isfile(tmp_path / "out" / "data-bin" / "test.de-en.de.bin")


def test_l0_gates_train_and_fold_under_the_multilingual_task(tmp_path):
    """Voita's gates under translation_multi_simple_epoch's twin: fairseq-train with the L0 criterion, `gates`
    reads them and folds them out, and the folded checkpoint decodes under the family's task."""
    multi, data = fam.multilingual(), fam.spm_data()
    run_fairseq(["fairseq-train", data, "--user-dir", PACKAGE_DIR, "--task", "translation_multi_simple_epoch_headprune",
                 *fam.MULTI_TASK[2:], "--arch", "transformer", "--share-all-embeddings", *fam.SMALL,
                 "--gated-types", "enc-self,enc-dec,dec-self", "--criterion", "label_smoothed_cross_entropy_l0",
                 "--l0-lambda", "0.1", "--optimizer", "adam", "--lr", "1e-3", "--finetune-from-model", multi,
                 "--max-tokens", "1500", "--max-update", "2", "--save-dir", tmp_path / "gated",
                 "--no-epoch-checkpoints", "--no-save-optimizer-state", "--num-workers", "0", "--disable-validation"])
    gated = tmp_path / "gated" / "checkpoint_last.pt"
    run(["fairseq-headprune", "gates", gated, "--results-dir", tmp_path / "gates", "--fold-out", tmp_path / "f.pt"])
    gates = json.loads((tmp_path / "gates" / "gates.json").read_text())
    assert gates["total"] == 24 and gates["updates"] == 2
    out = run_fairseq(["fairseq-generate", data / "slice", "--path", tmp_path / "f.pt", "--user-dir", PACKAGE_DIR,
                       *fam.MULTI_TASK, "-s", "de", "-t", "en", *SHORT]).stdout
    assert len(_hypotheses(out)) == fam.SLICE_SENTENCES


def test_distillation_criterion_under_the_multilingual_task(tmp_path):
    """recover's criterion (label_smoothed_cross_entropy_distill) trains under translation_multi_simple_epoch: the
    teacher loads with that task's dictionaries and language tokens; a student identical to its teacher, without
    dropout, has a distillation loss of exactly zero."""
    multi, data = fam.multilingual(), fam.spm_data()
    out = run_fairseq(["fairseq-train", data, "--user-dir", PACKAGE_DIR, *fam.MULTI_TASK, "--arch", "transformer",
                       "--share-all-embeddings", *fam.SMALL, "--dropout", "0", "--criterion",
                       "label_smoothed_cross_entropy_distill", "--teacher-path", multi, "--distill-weight", "1",
                       "--optimizer", "adam", "--lr", "1e-9", "--finetune-from-model", multi, "--max-tokens", "1500",
                       "--max-update", "1", "--save-dir", tmp_path / "student", "--no-save", "--num-workers", "0",
                       "--disable-validation", "--log-format", "json", "--log-interval", "1"]).stdout
    epoch = [json.loads(line[line.index("{"):]) for line in out.splitlines() if '"train_loss"' in line][-1]
    assert float(epoch["train_loss"]) == 0.0
