"""`fairseq-headprune compress` on the tiny model: the whole run, its stages resumed (after a stop and after kill -9,
giving the model an uninterrupted run gives), an extended recovery, refusals in one line before any work, the stage
store's identities; the chosen shape written as chosen (tests/test_cost_table.py: the cost table's mechanism)."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import torch

from conftest import ENV, run
from helpers import assert_exported_like_fairseq

from fairseq_headprune.compress import pipeline


def compress_argv(data, checkpoint, out, cache, *extra, target=("--speedup", "1.01"), weigh_map=False):
    # the tiny model's references are BPE text: compared as they are; a few sentences and steps keep it short; the
    # vocabulary map weighed only where a test asks (weigh_map, or --vocab-map given): it doubles the finalists
    weighed = target[:1] == ("--speedup",) and not weigh_map and "--vocab-map" not in extra
    map_choice = ["--no-vocab-map"] if weighed else []
    return ["fairseq-headprune", "compress", data, "--path", checkpoint, "--out", out, *target,
            "--beam", "2", "--max-tokens", "2000", "--max-len-b", "12", "--timing-sentences", "60", "--runs", "1",
            "--calibration-sentences", "48", "--window-steps", "10", "--check-sentences", "16",
            "--budget-epochs", "1", "--cost-cache", cache, "--recover-args", "--max-tokens 4000",
            "--significance", "1", *map_choice, *extra]  # a tiny model's timings are mostly noise: every saving counts


def stage_names(printed: str, word: str):
    return [name for name in pipeline.STAGES if f"{name}: {word}" in printed]


def test_compress_end_to_end_resumes_and_extends(tiny_data, stock_checkpoint, tmp_path):
    import ctranslate2

    from fairseq_headprune.core.heads import HeadLayout, attention_modules
    from fairseq_headprune.core.shape import ffn_widths, kept_count
    from fairseq_headprune.fairseq_io.loading import trust_fairseq_checkpoints
    from helpers import load_stock
    from test_surgery import reload

    out, cache = tmp_path / "out", tmp_path / "cache"
    for path in tiny_data.glob("test.de-en.*"):  # a second reported set (the test sentences under another name)
        shutil.copyfile(path, tiny_data / path.name.replace("test.", "second.", 1))
    first = run(compress_argv(tiny_data, stock_checkpoint, out, cache, "--stop-after", "shrink")).stdout
    lines = first.splitlines()
    assert lines[0].startswith("compress (--speedup 1.01, ct2-int8): this run will cost about ")  # the first line
    assert "CPU minutes" in lines[0] and "recover" in lines[0] and "measured just now" in lines[0]
    assert stage_names(first, "done") == ["cost-table", "choice", "shrink"]
    assert not (out / "model.pt").exists() and not (out / "compress.json").exists()
    assert list(cache.glob("cost-table-*.json"))  # the table is kept beside the run for the next one

    # the same command goes on from the first stage not done
    second = run(compress_argv(tiny_data, stock_checkpoint, out, cache)).stdout
    assert stage_names(second, "cached") == ["cost-table", "choice", "shrink"]
    assert stage_names(second, "done") == ["recover", "export", "measure", "report"]
    record = json.loads((out / "compress.json").read_text())
    chosen = record["stages"]["choice"]["chosen"]
    assert chosen["predicted_speedup"] >= 1.01
    assert record["stages"]["choice"]["calibration"]["subset"] == "train"  # never the reported set
    assert record["stages"]["report"]["subset"] == "test" and 0 <= record["stages"]["report"]["p"] <= 1
    assert record["stages"]["measure"]["speedup_equal_work"] > 0 and record["verdict"]["lines"]
    # the model written is the shape chosen: one head count per stack, the heads named in the record
    trust_fairseq_checkpoints()
    model, _ = load_stock(stock_checkpoint, tiny_data)
    assert torch.load(out / "model.pt", map_location="cpu", weights_only=False)["model"].keys() == \
        torch.load(out / "stages" / "recover" / "model.pt", map_location="cpu", weights_only=False)["model"].keys()
    shrunk = json.loads((out / "stages" / "shrink" / "model.json").read_text())
    written = reload(out / "model.pt", tiny_data)  # (the choice may cut the decoder's depth too)
    counts = {t: {len(ids) for (tt, _), ids in HeadLayout.of(written).heads.items() if tt == t}
              for t in ("enc-self", "enc-dec", "dec-self")}
    assert counts == {"enc-self": {chosen["enc_heads"]}, "enc-dec": {chosen["dec_heads"]},
                      "dec-self": {chosen["dec_heads"]}}
    depth = chosen.get("dec_layers", len(model.decoder.layers))
    assert len(written.decoder.layers) == depth
    gone = (len(model.decoder.layers) - depth) * 2 * model.decoder.layers[0].self_attn.num_heads  # whole layers
    assert shrunk["heads_total"] - shrunk["heads_kept"] == chosen["heads_removed"] + gone
    share = chosen.get("ffn_percent", 100.0)  # every FFN at the share chosen (the tiny model's FFNs are one width)
    assert set(ffn_widths(written).values()) == {kept_count(w, share) for w in ffn_widths(model).values()}
    assert gone + chosen["heads_removed"] > 0 or chosen.get("ffn_percent", 100.0) < 100  # something was cut
    assert sum(a.num_heads for a in attention_modules(model).values()) == shrunk["heads_total"]
    translator = ctranslate2.Translator(str(out / "ct2"), compute_type="int8")
    assert translator.translate_batch([["ein", "Mann"]], max_decoding_length=5)[0].hypotheses[0]
    card = (out / "MODEL_CARD.md").read_text()
    for part in ("## What was removed", "## How each choice was made", "## Cost table", "## Reproduce",
                 f"{chosen['enc_heads']} / {chosen['dec_heads']}", "'train'", "p "):
        assert part in card
    command = card.split("## Reproduce")[1].split("```")[1].strip()  # as the user typed it
    assert command.startswith("fairseq-headprune compress ") and "--speedup 1.01" in command
    assert "--stop-after" not in command and "--user-dir" not in command

    # more epochs: recovery goes on from its own checkpoints (epoch 2 only); the choice is not made again
    third = run(compress_argv(tiny_data, stock_checkpoint, out, cache, "--budget-epochs", "2")).stdout
    assert stage_names(third, "cached") == ["cost-table", "choice", "shrink"]
    assert stage_names(third, "done") == ["recover", "export", "measure", "report"]
    epochs = json.loads((out / "compress.json").read_text())["stages"]["recover"]["epochs"]
    assert [e["epoch"] for e in epochs] == [1, 2]
    # a second reported set: only the report is made again; the same sentences score as --gen-subset's
    fourth = run(compress_argv(tiny_data, stock_checkpoint, out, cache, "--budget-epochs", "2",
                               "--also-report", "second")).stdout
    assert stage_names(fourth, "done") == ["report"]
    reported = json.loads((out / "compress.json").read_text())["stages"]["report"]
    (second,) = reported["also"]
    assert second["subset"] == "second" and second["sentences"] == reported["sentences"]
    assert (second["bleu_unpruned"], second["bleu_compressed"]) == (reported["bleu_unpruned"],
                                                                    reported["bleu_compressed"])
    assert set(second["overlap"]) == {"train", "valid"} and all(n >= 0 for n in second["overlap"].values())
    assert "| BLEU, second (" in (out / "MODEL_CARD.md").read_text()
    # fewer epochs than the run holds would mix two runs: refused
    fewer = run(compress_argv(tiny_data, stock_checkpoint, out, cache), check=False)
    assert fewer.returncode == 2 and "--budget-epochs 2 or more" in fewer.stderr

    # kill -9 during recovery of a copy stopped after its shrink: the rerun gives the uninterrupted run's model
    copy = tmp_path / "copy"
    (copy / "stages").mkdir(parents=True)
    for name in ("cost-table", "choice", "shrink"):
        shutil.copytree(out / "stages" / name, copy / "stages" / name)
    argv = [str(a) for a in compress_argv(tiny_data, stock_checkpoint, copy, cache, "--budget-epochs", "2")]
    proc = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "fairseq-headprune"), *argv[1:]],
                            env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first_epoch = copy / "stages" / "recover" / "run" / "checkpoint1.pt"
    deadline = time.time() + 120
    while not first_epoch.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert first_epoch.exists() and not (copy / "compress.json").exists()
    resumed = run(compress_argv(tiny_data, stock_checkpoint, copy, cache, "--budget-epochs", "2")).stdout
    assert stage_names(resumed, "cached") == ["cost-table", "choice", "shrink"]
    a = torch.load(out / "model.pt", map_location="cpu", weights_only=False)["model"]
    b = torch.load(copy / "model.pt", map_location="cpu", weights_only=False)["model"]
    # the same weights up to float summation order: MKL's kernels may sum in another order for other memory
    # alignments (its results are reproducible bit for bit only under MKL_CBWR), seen at 1e-5 on an AMD EPYC host;
    # a resume that trained an epoch twice or mixed two runs moves them by orders of magnitude more
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], rtol=0, atol=1e-4) for k in a)


def test_refusals_are_one_line_before_any_work(tiny_data, stock_checkpoint, tmp_path):
    cache = tmp_path / "cache"
    cases = [
        (("--speedup", "1.5", "--max-bleu-loss", "0.3"), "give exactly one target"),
        ((), "give exactly one target"),
        (("--speedup", "0.9"), "--speedup must be above 1"),
        (("--speedup", "1.5", "--engine", "onnx"), "--engine must be one of ct2-int8, ct2-float32, fairseq"),
        (("--speedup", "1.5", "--calibration-subset", "test"), "must take part in no choice"),
        (("--speedup", "1.5", "--budget-epochs", "-1"), "--budget-epochs must be at least 0"),
        (("--speedup", "1.5", "--significance", "0"), "--significance must be in (0, 1]"),
        (("--speedup", "1.5", "--window-steps", "0", "--window-lr", "1e-3"), "it needs --window-steps N"),
        (("--speedup", "1.5", "--also-report", "valid"), "that is the recovery's early stopping"),
        (("--speedup", "1.5", "--also-report", "train"), "that is the recovery's training set"),
        (("--speedup", "1.5", "--also-report", "a,b", "--also-references", "x"), "1 file(s) for 2"),
        (("--speedup", "1.5", "--distill-hidden-weight", "-1"), "--distill-hidden-weight must be at least 0"),
        (("--speedup", "1.5", "--distill", "kl"), "--distill must be one of logits, sequences, both, none, not kl"),
        (("--speedup", "1.5", "--budget-epochs", "0", "--distill", "both"), "--distill both: --budget-epochs 0"),
        (("--speedup", "1.5", "--distill", "sequences", "--distill-hidden-weight", "0.2"),
         "--distill-hidden-weight weighs a distance to the teacher's forward pass, which --distill sequences does "
         "not use"),
        (("--speedup", "1.5", "--recover-args", "--distill-weight 0.5"),
         "--recover-args: --distill-weight is set by compress itself"),
        (("--max-bleu-loss", "0.3", "--shape", "2/2"), "--shape gives the shape --max-bleu-loss would choose"),
        (("--speedup", "1.5", "--shape", "2/2:vocab=50%"), "not by a share"),
        (("--speedup", "1.5", "--shape", "8/3x4:ffn=100%"), "--shape 8/3x4:ffn=100% is the unpruned model's"),
        (("--speedup", "1.5", "--shape", "2/x"), "--shape: '2/x' is not [L x]ENC/[L x]DEC"),
        (("--speedup", "1.5", "--shape", "5x4/2"), "--shape 5x4/2: the encoder keeps 1 to 4 layers, not 5"),
        (("--speedup", "1.5", "--shape", "4/9"), "--shape 4/9: the decoder keeps 1 to 4 heads per layer"),
        (("--speedup", "1.5", "--shape", "8/3x4"), "--shape 8/3x4 is the unpruned model's"),
    ]
    for target, message in cases:
        out = tmp_path / f"out{len(message)}"
        proc = run(compress_argv(tiny_data, stock_checkpoint, out, cache, *target[2:], target=target[:2]),
                   check=False)
        assert proc.returncode == 2, (target, proc.stderr[-500:])
        assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert not out.exists()  # refused before anything was made
    out = tmp_path / "a:b"  # fairseq's --path would read it as an ensemble of two checkpoints, at the export
    proc = run(compress_argv(tiny_data, stock_checkpoint, out, cache), check=False)
    assert proc.returncode == 2 and "splits a checkpoint path on ':'" in proc.stderr and not out.exists()
    assert len(proc.stderr.strip().splitlines()) == 1
    # a target no shape reaches: refused after the cost table, before the choice (the long work), with the best
    out = tmp_path / "far"
    proc = run(compress_argv(tiny_data, stock_checkpoint, out, cache, target=("--speedup", "1000")), check=False)
    assert proc.returncode == 2
    error = proc.stderr.strip().splitlines()[-1]
    assert "--speedup 1000: no shape reaches it in ct2-int8" in error and "the fastest" in error
    assert "x the unpruned model" in error and "output layer at 50%" in error  # what the one not yet removable adds
    assert re.search(r"the fastest, encoder heads \d+, decoder heads \d+(, decoder layers \d+)?(, FFN units \d+%)?"
                     r"(, the vocabulary map)?, is ",
                     error), error
    assert (out / "stages" / "cost-table" / "stage.json").exists() and not (out / "stages" / "choice").exists()


def test_stage_store_reruns_a_changed_stage_and_those_after_it(tmp_path):
    """Run.run_stage: a finished stage is reused when its identity (its inputs, and everything before it) is the
    same; a changed identity reruns it and every later stage; a stage killed before its stage.json is run again from
    nothing, except a resumable stage's own work."""
    from fairseq_headprune.compress.stages.contract import Inputs, Stage
    from fairseq_headprune.compress.stages.results import StageResult

    calls = []

    @dataclasses.dataclass(frozen=True)
    class Value(Inputs):
        value: int

    def build(name):
        def inner(folder, inputs, context, results):
            calls.append(name)
            with open(os.path.join(folder, "work.txt"), "a") as f:
                f.write(str(inputs.value))
            return StageResult.of({"value": inputs.value})
        return inner

    def once(a, b, resume=None):
        r = pipeline.Run(loaded=None, options=pipeline.CompressOptions(out=str(tmp_path)), log=lambda _: None,
                         progress=False)
        r.todo = {"first": 0.0, "second": 0.0}
        r.run_stage(Stage("first", lambda context, results: Value(a), build("first"), StageResult))
        return r.run_stage(Stage("second", lambda context, results: Value(b), build("second"), StageResult,
                                 resume_key=lambda inputs: resume))

    once(1, 1)
    assert calls == ["first", "second"]
    once(1, 1)
    assert calls == ["first", "second"]  # both cached
    once(2, 1)
    assert calls == ["first", "second", "first", "second"]  # the first changed: the second reruns too
    assert (tmp_path / "stages" / "second" / "work.txt").read_text() == "1"  # from nothing
    once(2, 3)
    assert calls[-1] == "second" and calls.count("first") == 2
    # a stage killed before its record: its folder is emptied and the stage run again
    os.remove(tmp_path / "stages" / "second" / "stage.json")
    once(2, 3)
    assert calls.count("second") == 4 and (tmp_path / "stages" / "second" / "work.txt").read_text() == "3"
    # a resumable stage keeps its own work when only its budget changed
    once(2, 4, resume={"run": "x"})
    once(2, 5, resume={"run": "x"})
    assert (tmp_path / "stages" / "second" / "work.txt").read_text() == "45"
    once(2, 6, resume={"run": "y"})
    assert (tmp_path / "stages" / "second" / "work.txt").read_text() == "6"


def test_max_bleu_loss_chooses_on_a_held_out_split_of_valid(tiny_data, stock_checkpoint, tmp_path):
    """--max-bleu-loss: valid split by id into the choice's subset and the recovery's early-stopping subset; a bound
    every shape meets takes the fastest shape of the frontier, found by bisection (not every shape shrunk)."""
    from fairseq.data import data_utils

    out = tmp_path / "out"
    for path in tiny_data.glob("test.de-en.*"):  # a user's own subset of the split's name is left as it is
        shutil.copyfile(path, tiny_data / path.name.replace("test.", "heldout.", 1))
    users = {p.name: p.read_bytes() for p in tiny_data.glob("heldout.*")}
    printed = run(compress_argv(tiny_data, stock_checkpoint, out, tmp_path / "cache", "--heldout-sentences", "50",
                                "--stop-after", "choice", target=("--max-bleu-loss", "100"))).stdout
    assert "--max-bleu-loss 100" in printed.splitlines()[0]
    choice = json.loads((out / "stages" / "choice" / "stage.json").read_text())["result"]
    frontier = choice["frontier"]
    assert choice["levers"] == ["encoder heads", "decoder heads"]  # this mode leaves the depth whole, and says so
    assert not any("dec_layers" in p for p in choice["candidates"])
    assert choice["chosen"]["enc_heads"] == frontier[0]["enc_heads"] and \
        choice["chosen"]["dec_heads"] == frontier[0]["dec_heads"]  # the fastest: every shape is within 100
    speeds = [p["predicted_speedup"] for p in frontier]
    estimates = [p["fisher_estimate"] for p in frontier]
    assert speeds == sorted(speeds, reverse=True) and estimates == sorted(estimates, reverse=True)
    # the mildest shape first (is any within the bound?), then a bisection: not every shape is shrunk
    assert 1 <= len(choice["probes"]) <= 1 + math.ceil(math.log2(len(frontier)))
    assert choice["split"] == {"heldout": [0, 50], "valid": [50, 200]}
    data = out / "stages" / "choice" / "data"
    original = data_utils.load_indexed_dataset(str(tiny_data / "valid.de-en.de"), None)
    held = data_utils.load_indexed_dataset(str(data / "heldout.de-en.de"), None)
    rest = data_utils.load_indexed_dataset(str(data / "valid.de-en.de"), None)
    assert [held[i].tolist() for i in range(len(held))] + [rest[i].tolist() for i in range(len(rest))] == \
        [original[i].tolist() for i in range(len(original))]
    assert (data / "train.de-en.en.bin").resolve() == (tiny_data / "train.de-en.en.bin").resolve()
    assert {p.name: p.read_bytes() for p in tiny_data.glob("heldout.*")} == users


def test_a_target_only_depth_and_heads_reach_cuts_the_decoder_in_the_written_model(tiny_data, stock_checkpoint,
                                                                                   tmp_path):
    """Decoder layers are a lever of the choice: with a cost table (edited here, so that the answer is known) where
    no heads-only shape reaches the target and every decoder depth needs two decoder heads at most, the shape chosen
    cuts the depth and the heads, its layers are those shrink's importance selection keeps, and the model shrink
    writes has exactly that depth and those head counts."""
    from fairseq_headprune.core.heads import HeadLayout, parse_head_spec
    from fairseq_headprune.fairseq_io.loading import trust_fairseq_checkpoints
    from test_surgery import reload

    out, cache = tmp_path / "out", tmp_path / "cache"
    # a tiny decoder cut this deep often runs to the length limit, where CTranslate2's and fairseq's beams differ
    # (the export's parity check): one beam
    beam = ("--beam", "1")
    run(compress_argv(tiny_data, stock_checkpoint, out, cache, *beam, "--stop-after", "cost-table"))
    path = out / "stages" / "cost-table" / "stage.json"
    record = json.loads(path.read_text())
    saved = {("dec_layers", 2): 0.25, ("dec_layers", 1): 0.3, ("dec_heads", 3): 0.1, ("dec_heads", 2): 0.2,
             ("dec_heads", 1): 0.3}  # heads alone 1.43x at most; a depth with 3 decoder heads 1.59x at most
    rows = record["result"]["rows"]
    assert {r["value"] for r in rows if r["field"] == "dec_layers"} == {1, 2}  # the tiny decoder has 3 layers
    for r in rows:
        r["time_saved"] = saved.get((r["field"], r["value"]), 0.0)
        r["speedup"] = round(1 / (1 - r["time_saved"]), 4)
        r["sign_test"] = {"faster_batches": 10, "batches": 10, "p": 0.001}
    path.write_text(json.dumps(record))

    printed = run(compress_argv(tiny_data, stock_checkpoint, out, cache, *beam, "--stop-after", "shrink",
                                target=("--speedup", "1.6"))).stdout
    assert "layer search: remove dec:" in printed
    choice = json.loads((out / "stages" / "choice" / "stage.json").read_text())["result"]
    chosen = choice["chosen"]
    assert choice["levers"][:3] == ["encoder heads", "decoder heads", "decoder layers"]  # FFN units: when timed
    assert all(p["dec_layers"] in (1, 2) and p["dec_heads"] <= 2 for p in choice["candidates"])
    assert {p["dec_layers"] for p in choice["candidates"]} == {1, 2} and "kind_nll" in chosen
    removed = [int(s["removed"].split(":")[1]) for s in choice["layer_order"]["steps"]]
    assert chosen["layers_kept"] == {"dec": sorted(set(range(1, 4)) - set(removed[:3 - chosen["dec_layers"]]))}
    # the model written: the chosen depth, its layers, and one head count per stack in the kept layers
    shrunk = json.loads((out / "stages" / "shrink" / "model.json").read_text())
    assert shrunk["layers"]["kept"] == chosen["layers_kept"] and shrunk["layers"]["rule"] == "importance"
    assert set(parse_head_spec(shrunk["selection"]["removed_spec"])) == set(parse_head_spec(chosen["heads"]))
    trust_fairseq_checkpoints()
    model = reload(out / "stages" / "shrink" / "model.pt", tiny_data)
    assert len(model.decoder.layers) == chosen["dec_layers"] and len(model.encoder.layers) == 4
    layout = HeadLayout.of(model)
    counts = {t: {len(ids) for (tt, _), ids in layout.heads.items() if tt == t}
              for t in ("enc-self", "enc-dec", "dec-self")}
    assert counts == {"enc-self": {chosen["enc_heads"]}, "enc-dec": {chosen["dec_heads"]},
                      "dec-self": {chosen["dec_heads"]}}
    # the verdict and the card say the depth (the rest of the run: a shallower decoder recovered and exported)
    words = f"decoder {chosen['dec_layers']} layers x {chosen['dec_heads']} heads"
    assert words in printed
    rest = run(compress_argv(tiny_data, stock_checkpoint, out, cache, *beam, target=("--speedup", "1.6"))).stdout
    assert f"compressed model: encoder {chosen['enc_heads']} heads per layer, {words}, " in rest
    card = (out / "MODEL_CARD.md").read_text()
    assert f"| decoder layers | 3 | {chosen['dec_layers']} |" in card
    assert f"The decoder keeps {chosen['dec_layers']} of its 3 layers" in card and "- The layers: " in card


def test_a_target_only_the_ffn_reaches_narrows_every_ffn_by_its_mask_fisher_units(tiny_data, stock_checkpoint,
                                                                                   tmp_path):
    """FFN units are a lever of the joint choice: with a cost table (edited, so that the answer is known) where only
    the FFN rows save time, every candidate narrows its FFNs (75, 50 or 25% of their units), the finalists are the
    first of each share (with and without the map, whose row saves nothing here) and the fastest, each timed as a
    slice, every one recorded with its interval and verdict, and the card's why in two sentences; the model shrink
    writes has every FFN at the chosen share."""
    from fairseq_headprune.core.shape import ffn_widths
    from fairseq_headprune.fairseq_io.loading import trust_fairseq_checkpoints
    from test_surgery import reload

    out, cache = tmp_path / "out", tmp_path / "cache"
    beam = ("--beam", "1")  # a cut decoder may run to the length limit, where the engines' beams differ
    run(compress_argv(tiny_data, stock_checkpoint, out, cache, *beam, "--stop-after", "cost-table", weigh_map=True))
    path = out / "stages" / "cost-table" / "stage.json"
    record = json.loads(path.read_text())
    assert {r["value"] for r in record["result"]["rows"] if r["field"] == "ffn_percent"} == {75.0, 50.0, 25.0}
    assert any(r["field"] == "vocab_map" for r in record["result"]["rows"])  # weighed: its row measured
    # a BLEU bound does not weigh the map: the table this run cached serves it, the map's row dropped
    printed = run(compress_argv(tiny_data, stock_checkpoint, tmp_path / "bound", cache, *beam, "--stop-after",
                                "cost-table", target=("--max-bleu-loss", "0.5"))).stdout
    assert "measured before on this machine with the vocabulary map's row; the other rows reused" in printed
    bound = json.loads((tmp_path / "bound" / "stages" / "cost-table" / "stage.json").read_text())["result"]
    assert bound["rows"] == [r for r in record["result"]["rows"] if r["field"] != "vocab_map"]
    for r in record["result"]["rows"]:
        r["time_saved"] = 0.4 if r["field"] == "ffn_percent" else 0.0
        r["speedup"] = round(1 / (1 - r["time_saved"]), 4)
        r["sign_test"] = {"faster_batches": 10, "batches": 10, "p": 0.001}
    path.write_text(json.dumps(record))

    printed = run(compress_argv(tiny_data, stock_checkpoint, out, cache, *beam, "--stop-after", "shrink",
                                target=("--speedup", "1.5"), weigh_map=True)).stdout
    choice = json.loads((out / "stages" / "choice" / "stage.json").read_text())["result"]
    chosen, candidates, timed = choice["chosen"], choice["candidates"], choice["timed"]
    assert candidates and all(p["ffn_percent"] in (75.0, 50.0, 25.0) for p in candidates)
    assert {"enc_heads": 8, "dec_heads": 4, "ffn_percent": 75.0} in [
        {k: p[k] for k in ("enc_heads", "dec_heads", "ffn_percent")} for p in candidates
        if "dec_layers" not in p and p["heads_removed"] == 0 and "vocab_map" not in p]  # the FFNs alone
    assert "heads" not in candidates[0] and timed[0]["heads"] is not None  # the record: specs of the timed only
    shares = {(p["ffn_percent"], bool(p.get("vocab_map"))) for p in timed}
    assert {(v, m) for v in (75.0, 50.0, 25.0) for m in (False, True)} <= shares
    assert all(p["verdict"] in ("met", "met at the median, not at the lower bound", "missed")
               and p["measured_interval"]["low"] <= p["measured_speedup"] for p in timed)
    assert chosen["ffn_percent"] in (75.0, 50.0, 25.0) and "FFN units" in choice["levers"]
    assert f"every FFN at {chosen['ffn_percent']:g}% of its units" in printed
    assert choice["why"].count(". ") == 1 and "finalists timed as they ship" in choice["why"]
    trust_fairseq_checkpoints()
    model = reload(out / "stages" / "shrink" / "model.pt", tiny_data)
    assert set(ffn_widths(model).values()) == {round(64 * chosen["ffn_percent"] / 100)}  # tiny FFNs: 64 units
    assert len(model.decoder.layers) == chosen.get("dec_layers", 3)
    shrink_record = json.loads((out / "stages" / "shrink" / "model.json").read_text())
    assert shrink_record["options"]["ffn_keep"] == chosen["ffn_percent"]


def test_a_given_shape_is_built_in_place_of_the_choice(tiny_data, stock_checkpoint, tmp_path):
    """--shape skips the search, not the method: the shape given (here the decoder at 2 of its 3 layers, 1 head in
    each attention layer), its layers chosen by the calibration loss and its heads by the Fisher estimate in them,
    as the choice's own; the choice record says it was given; the model written has that shape."""
    from fairseq_headprune.core.heads import HeadLayout
    from fairseq_headprune.fairseq_io.loading import trust_fairseq_checkpoints
    from test_surgery import reload

    out, cache = tmp_path / "out", tmp_path / "cache"
    printed = run(compress_argv(tiny_data, stock_checkpoint, out, cache, "--beam", "1", "--shape", "3/2x1",
                                "--stop-after", "shrink", target=("--speedup", "1.2"))).stdout
    assert "--shape 3/2x1: encoder 3 heads per layer, decoder 2 layers x 1 heads, predicted " in printed
    assert "layer search: remove dec:" in printed
    choice = json.loads((out / "stages" / "choice" / "stage.json").read_text())["result"]
    chosen = choice["chosen"]
    assert (chosen["enc_heads"], chosen["dec_heads"], chosen["dec_layers"]) == (3, 1, 2)
    assert [(p["enc_heads"], p["dec_heads"], p["dec_layers"]) for p in choice["candidates"]] == [(3, 1, 2)]
    assert choice["chosen_by"].startswith("given by --shape 3/2x1")
    trust_fairseq_checkpoints()
    model = reload(out / "stages" / "shrink" / "model.pt", tiny_data)
    assert len(model.decoder.layers) == 2 and len(model.encoder.layers) == 4
    counts = {t: {len(ids) for (tt, _), ids in HeadLayout.of(model).heads.items() if tt == t}
              for t in ("enc-self", "enc-dec", "dec-self")}
    assert counts == {"enc-self": {3}, "enc-dec": {1}, "dec-self": {1}}


def test_the_recovery_distills_on_the_teachers_translations_with_distill_both(tiny_data, stock_checkpoint,
                                                                                 tmp_path):
    """compress --distill both: the recovery trains on the teacher's beam translations of train (decoded once,
    cached beside the data), with the KL term; the stage's identity holds the signal, so --distill logits on the
    same folder recovers again (the shrink kept); the card names the signal."""
    out, cache = tmp_path / "out", tmp_path / "cache"
    args = ("--beam", "1", "--shape", "3/2x1", "--distill", "both")
    printed = run(compress_argv(tiny_data, stock_checkpoint, out, cache, *args, target=("--speedup", "1.2"))).stdout
    recovered = json.loads((out / "compress.json").read_text())["stages"]["recover"]
    assert recovered["distill"] == "both" and "translations" in printed
    run_record = json.loads((out / "stages" / "recover" / "model.json").read_text())
    assert run_record["distill"] == "both" and run_record["criterion"] == "label_smoothed_cross_entropy_distill"
    teacher_data = [p for p in tiny_data.parent.glob(tiny_data.name + ".teacher-*") if p.is_dir()]
    assert teacher_data and os.path.realpath(run_record["data"]) == os.path.realpath(tiny_data)
    assert "on its own beam translations of it (`--distill both`)" in (out / "MODEL_CARD.md").read_text()
    again = run(compress_argv(tiny_data, stock_checkpoint, out, cache, "--beam", "1", "--shape", "3/2x1",
                              "--stop-after", "recover", target=("--speedup", "1.2"))).stdout
    assert stage_names(again, "cached") == ["cost-table", "choice", "shrink"] and "recover: done" in again
    assert json.loads((out / "stages" / "recover" / "model.json").read_text())["distill"] == "logits"


def test_a_distillation_set_and_a_vocabulary_map_reach_the_recovery_and_the_exported_model(tiny_data,
                                                                                            stock_checkpoint,
                                                                                            tmp_path):
    """compress --distill-source translates raw text with the model's own tokenizer and BPE (fairseq-generate's
    options of the run) and trains on it beside train; --vocab-map ships vmap.txt in ct2/, and the measure and the
    report decode with it (the exported folder's map is what EngineModel applies)."""
    from conftest import SLICE

    from fairseq_headprune.engines.ct2 import translate_options

    raw = tmp_path / "mono.de"
    raw.write_text("\n".join((SLICE / "test.de").read_text(encoding="utf-8").splitlines()[:40]) + "\n")
    out, cache = tmp_path / "out", tmp_path / "cache"
    encoders = ("-s", "de", "-t", "en", "--tokenizer", "moses", "--bpe", "subword_nmt", "--bpe-codes",
                str(tiny_data / "code"))
    run(compress_argv(tiny_data, stock_checkpoint, out, cache, "--beam", "1", "--shape", "3/2x1", *encoders,
                      "--distill-source", raw, "--distill-nbest", "2", "--vocab-map", "--vocab-map-frequent", "50",
                      target=("--speedup", "1.2")))
    record = json.loads((out / "stages" / "recover" / "model.json").read_text())
    assert record["options"]["distillation"]["source"] == [str(raw)] and record["options"]["distillation"]["nbest"] == 2
    sets = [json.loads((f / "distillation-set.json").read_text()) for f in
            tiny_data.parent.glob(f"{tiny_data.name}.distill-*")]  # (other tests' sets beside the shared data)
    assert {"sources": 40, "pairs": 80} in [{k: s[k] for k in ("sources", "pairs")} for s in sets]
    assert (out / "ct2" / "vmap.txt").exists() and translate_options(str(out / "ct2")) == {"use_vmap": True}
    exported = json.loads((out / "compress.json").read_text())["stages"]["export"]
    assert exported["check"]["vocab_map"]["always"] == 50
    assert "**Vocabulary map** (`ct2/vmap.txt`" in (out / "MODEL_CARD.md").read_text()
    mixed = record["distillation_set"]  # the card says what it trained on, and in which proportion
    train_pairs = mixed["train_pairs"]
    assert mixed == {"sources": 40, "pairs": 80, "nbest": 2, "upsample_primary": 1, "train_pairs": train_pairs,
                     "share": round(80 / (80 + train_pairs), 4)} and train_pairs > 80
    assert (" sentences and 80 pairs of the unpruned model's translations (2 best each) of 40 --distill-source "
            "sentences (train's pairs counted 1x an epoch, --upsample-primary: the translations "
            f"{100 * mixed['share']:.0f}% of an epoch's pairs), 1 process on CPU"
            ) in (out / "MODEL_CARD.md").read_text()
    assert json.loads((out / "stages" / "export" / "stage.json").read_text())["identity"]["vocab_map"] == {
        "vocab_map_per_source": 100, "vocab_map_frequent": 50}
    # the map is a lever: the cost table times it (its own row, over the pairs every row sees) and the choice's
    # slices decode with it
    table = json.loads((out / "stages" / "cost-table" / "stage.json").read_text())
    rows = [r for r in table["result"]["rows"] if r["field"] == "vocab_map"]
    assert len(rows) == 1 and rows[0]["sign_test"]["batches"] >= 10 and rows[0]["translations"]["sentences"] > 0
    assert table["identity"]["vocab_map"]["vocab_map_frequent"] == 50
    chosen_by = json.loads((out / "stages" / "choice" / "stage.json").read_text())["result"]["chosen_by"]
    assert chosen_by.endswith("every slice timed with the vocabulary map the model ships (--vocab-map)")


def test_a_given_shape_narrows_the_ffns_and_the_exported_model_keeps_their_width(tiny_data, stock_checkpoint,
                                                                                tmp_path):
    """--shape ...:ffn=P% builds the FFN share with shrink's mask-Fisher units (heads whole here: no window fit,
    which would have nothing to fit); the shrunk checkpoint and the CTranslate2 model have every FFN at that width
    (CTranslate2 translates as fairseq does: the export stage's check); the choice and the card say the share."""
    from fairseq_headprune.core.shape import ffn_widths
    from fairseq_headprune.fairseq_io.loading import trust_fairseq_checkpoints
    from test_surgery import reload

    out, cache = tmp_path / "out", tmp_path / "cache"
    printed = run(compress_argv(tiny_data, stock_checkpoint, out, cache, "--beam", "1", "--shape", "8/3x4:ffn=50%",
                                target=("--speedup", "1.01"))).stdout
    assert "--shape 8/3x4:ffn=50%: 8/4 heads per stack (encoder/decoder), every FFN at 50% of its units" in printed
    chosen = json.loads((out / "stages" / "choice" / "stage.json").read_text())["result"]["chosen"]
    assert (chosen["ffn_percent"], chosen["heads"]) == (50.0, "")
    trust_fairseq_checkpoints()
    unpruned = ffn_widths(reload(stock_checkpoint, tiny_data))
    model = reload(out / "stages" / "shrink" / "model.pt", tiny_data)
    assert {k: 2 * w for k, w in ffn_widths(model).items()} == unpruned
    shrink_record = json.loads((out / "stages" / "shrink" / "model.json").read_text())
    assert shrink_record["options"]["ffn_keep"] == 50.0 and not shrink_record["options"].get("window_steps")
    export = json.loads((out / "stages" / "export" / "stage.json").read_text())["result"]
    assert_exported_like_fairseq(export["check"])  # int8: within a tolerance (its kernels differ between CPUs)
    card = (out / "MODEL_CARD.md").read_text()
    assert "| FFN units kept | 100% | 50% |" in card and "Every FFN keeps 50% of its hidden units" in card
    assert re.search(r"1-minute load average: this measurement [\d.]+, the choice's timing [\d.]+;", card)


def test_a_given_shape_cuts_the_encoder_and_the_exported_model_keeps_its_depth(tiny_data, stock_checkpoint,
                                                                              tmp_path):
    """--shape 2x8/...: the encoder's depth cut as the decoder's is (the layers by the calibration loss, shrink
    checked to keep the same ones, every sublayer from the first changed one refit); the checkpoint and the
    CTranslate2 model have that depth (CTranslate2 translates as fairseq does: the export's check); the card says it."""
    from fairseq_headprune.fairseq_io.loading import trust_fairseq_checkpoints
    from test_surgery import reload

    out, cache = tmp_path / "out", tmp_path / "cache"
    printed = run(compress_argv(tiny_data, stock_checkpoint, out, cache, "--beam", "1", "--shape", "2x8/3x4",
                                target=("--speedup", "1.01"))).stdout
    assert ("--shape 2x8/3x4: encoder 2 layers x 8 heads, decoder 4 heads per layer, predicted 1.00x, the encoder's "
            "depth not counted (the cost table has no row for it)") in printed
    choice = json.loads((out / "stages" / "choice" / "stage.json").read_text())["result"]
    chosen = choice["chosen"]
    assert chosen["enc_layers"] == 2 and len(chosen["layers_kept"]["enc"]) == 2 and "dec" not in chosen["layers_kept"]
    trust_fairseq_checkpoints()
    model = reload(out / "stages" / "shrink" / "model.pt", tiny_data)
    assert len(model.encoder.layers) == 2 and len(model.decoder.layers) == 3
    shrunk = json.loads((out / "stages" / "shrink" / "model.json").read_text())
    assert shrunk["layers"]["kept"] == {"enc": chosen["layers_kept"]["enc"]}
    export = json.loads((out / "stages" / "export" / "stage.json").read_text())["result"]
    assert_exported_like_fairseq(export["check"])  # int8: within a tolerance (its kernels differ between CPUs)
    card = (out / "MODEL_CARD.md").read_text()
    assert "| encoder layers | 4 | 2 |" in card and "The encoder keeps 2 of its 4 layers (layers " in card


def test_the_hidden_state_term_takes_the_teacher_layers_the_shrink_reconstructed_towards(tiny_data,
                                                                                        stock_checkpoint):
    """compress --distill-hidden-weight: a cut decoder's recovery compares each kept layer with the teacher layer
    shrink's record names (layers.teacher_outputs), an uncut one layer by layer; off, no hidden-state term."""
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from fairseq_headprune.compress.stages.recovery import recover_options
    from fairseq_headprune.prune.recovery_config import DistillationOptions
    from fairseq_headprune.prune import recovery_config

    loaded = SimpleNamespace(checkpoint=str(stock_checkpoint),
                             cfg=SimpleNamespace(task=OmegaConf.create({"source_lang": "de", "target_lang": "en"})))
    compress = pipeline.CompressOptions(out="x", speedup=1.5, distillation=DistillationOptions(hidden_weight=0.2))
    cut = {"kept": {"dec": [1, 3]}, "teacher_outputs": {"dec": [2, 3]}}
    options = recover_options(loaded, compress, "m.pt", None, cut)
    assert (options.distillation.hidden_weight, options.distill_hidden_layers) == (0.2, "2,3")
    argv = recovery_config.training_argv(str(tiny_data), stock_checkpoint, options, "translation", "transformer")
    assert argv[argv.index("--distill-hidden-weight") + 1] == "0.2"
    assert argv[argv.index("--distill-hidden-layers") + 1] == "2,3"
    assert recover_options(loaded, compress, "m.pt", None, None).distill_hidden_layers == ""  # one to one
    compress.distillation.hidden_weight = 0.0
    assert recover_options(loaded, compress, "m.pt", None, cut).distill_hidden_layers == ""
