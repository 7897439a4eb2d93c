"""Whole layers as units of pruning (prune.layers; their removal in core.surgery): exact removal, checkpoints,
selection, the teacher map."""
import copy
import json
import math
import re

import pytest
import torch

from conftest import run_fairseq
from fairseq_headprune.prune import layers as L
from fairseq_headprune.core import shape, surgery
from fairseq_headprune.errors import UserError
from fairseq_headprune.core.heads import Head, HeadLayout, parse_head_spec
from fairseq_headprune.fairseq_io.loading import PACKAGE_DIR
from fairseq_headprune.core.surgery import prune_model
from fairseq_headprune.fairseq_io.pruned_checkpoint import save_pruned_checkpoint
from helpers import beam_hypotheses, incremental_logits, load_stock, sample_batch, teacher_forced_logits

KEPT = {"enc": [2, 4], "dec": [1, 3]}  # the tiny model has 4 encoder and 3 decoder layers


@pytest.fixture(scope="module")
def stock(stock_checkpoint, tiny_data):
    return load_stock(stock_checkpoint, tiny_data)


def skipping(model, kept):
    """A copy of the model whose layers not in `kept` return their input (the layer skipped, nothing removed)."""
    ref = copy.deepcopy(model)
    for s, keep in kept.items():
        for i, layer in enumerate(shape.stack_module(ref, s).layers, start=1):
            if i not in keep:
                def skip(_m, args, kwargs, output):
                    x = kwargs["x"] if "x" in kwargs else args[0]
                    return (x, *output[1:]) if isinstance(output, tuple) else x
                layer.register_forward_hook(skip, with_kwargs=True)
    return ref


def same_outputs(a, b, task, batch):
    torch.testing.assert_close(teacher_forced_logits(a, batch), teacher_forced_logits(b, batch), atol=1e-5, rtol=0)
    torch.testing.assert_close(incremental_logits(a, batch), incremental_logits(b, batch), atol=1e-5, rtol=0)
    got, want = beam_hypotheses(a, task, batch), beam_hypotheses(b, task, batch)
    assert [t for t, _ in got] == [t for t, _ in want]
    assert [s for _, s in got] == pytest.approx([s for _, s in want], abs=1e-5)


def test_removed_layers_compute_what_skipping_them_computes(stock):
    model, task = stock
    batch = sample_batch(task)
    pruned = surgery.remove_layers(copy.deepcopy(model), KEPT)
    assert shape.depths(pruned) == {"enc": 2, "dec": 2}
    assert pruned.decoder.num_layers == 2 and pruned.encoder.num_layers == 2
    assert not torch.allclose(teacher_forced_logits(pruned, batch), teacher_forced_logits(model, batch), atol=1e-2)
    same_outputs(pruned, skipping(model, KEPT), task, batch)
    # the kept layers are the original modules' weights, renumbered
    torch.testing.assert_close(pruned.decoder.layers[1].fc2.weight, model.decoder.layers[2].fc2.weight)


def test_pre_norm_layer_with_zero_residual_branches_is_removed(stock):
    """In a pre-norm layer, zero attention and FFN outputs (out_proj, fc2 weights and biases) make the layer the
    identity: the removed model computes exactly that."""
    model, task = stock
    batch = sample_batch(task)
    pre = copy.deepcopy(model)
    for layer in list(pre.encoder.layers) + list(pre.decoder.layers):
        layer.normalize_before = True
    zeroed = copy.deepcopy(pre)
    with torch.no_grad():
        for s, keep in KEPT.items():
            for i, layer in enumerate(shape.stack_module(zeroed, s).layers, start=1):
                if i in keep:
                    continue
                for lin in [layer.self_attn.out_proj, layer.fc2] + (
                        [layer.encoder_attn.out_proj] if getattr(layer, "encoder_attn", None) is not None else []):
                    lin.weight.zero_()
                    lin.bias.zero_()
    same_outputs(surgery.remove_layers(copy.deepcopy(pre), KEPT), zeroed, task, batch)


@pytest.mark.parametrize("kept, message", [
    ({"dec": []}, "must keep at least one layer"),
    ({"dec": [1, 4]}, "dec layer 4 does not exist: layers are 1..3"),
    ({"enc": [0, 2]}, "enc layer 0 does not exist"),
    ({"enc": [3, 2]}, "increasing and distinct"),
    ({"enc": [2, 2]}, "increasing and distinct"),
    ({"mid": [1]}, "unknown stack"),
])
def test_remove_layers_refuses_what_cannot_be_built(stock, kept, message):
    model = copy.deepcopy(stock[0])
    with pytest.raises(UserError, match=message):
        surgery.remove_layers(model, kept)
    assert shape.depths(model) == {"enc": 4, "dec": 3}


def test_parse_and_check_counts(stock):
    assert L.parse_keep_layers("dec:3") == {"dec": 3}
    assert L.parse_keep_layers("dec:2, enc:5") == {"dec": 2, "enc": 5}
    for bad in ("dec", "dec:x", "mid:2", "dec:2,dec:3", ""):
        with pytest.raises(UserError, match="--keep-layers"):
            L.parse_keep_layers(bad)
    with pytest.raises(UserError, match="at least one layer"):
        L.check_counts(stock[0], {"dec": 0})
    with pytest.raises(UserError, match="has 3 layers"):
        L.check_counts(stock[0], {"dec": 4})


def test_even_layers_are_shleifer_and_rush():
    assert shape.even_layers(6, 3) == (1, 3, 6)
    assert shape.even_layers(6, 2) == (1, 6)
    assert shape.even_layers(6, 4) == (1, 2, 4, 6)
    assert shape.even_layers(6, 1) == (1,)
    assert shape.even_layers(6, 6) == (1, 2, 3, 4, 5, 6)
    assert shape.even_layers(12, 3) == (1, 6, 12)  # floor of the even spacing (their 12 -> 3 table says 1, 7, 12)


def test_teacher_key_maps_a_layers_last_sublayer_below_the_next_kept_one():
    kept, depth = {"dec": (1, 3, 6)}, {"enc": 6, "dec": 6}
    assert L.teacher_key(("dec-self", 2), kept, depth) == ("dec-self", 3)
    assert L.teacher_key(("enc-dec", 3), kept, depth) == ("enc-dec", 6)
    assert L.teacher_key(("dec-ffn", 1), kept, depth) == ("dec-ffn", 2)  # layer 2 removed: its output is the target
    assert L.teacher_key(("dec-ffn", 2), kept, depth) == ("dec-ffn", 5)
    assert L.teacher_key(("dec-ffn", 3), kept, depth) == ("dec-ffn", 6)
    assert L.teacher_key(("enc-ffn", 2), kept, depth) == ("enc-ffn", 2)  # the encoder is whole
    assert L.teacher_key(("dec-ffn", 2), {"dec": (1, 2)}, depth) == ("dec-ffn", 6)


def test_the_cut_loss_is_the_calibration_loss_of_the_cut_copy(stock):
    """CutLoss (the encoder output reused, a decoder cut run from its first changed layer's input in the parent)
    gives bit for bit what calibration_loss gives on remove_layers' copy: removing the first, a middle and the last
    layer, a second step under a new parent, and an encoder cut."""
    model, task = stock
    pad = task.target_dictionary.pad()
    dataset = task.dataset("test")
    samples = [dataset.collater([dataset[i] for i in range(a, a + 5)]) for a in (0, 5, 10)]

    def copied(kept):
        return L.calibration_loss(surgery.remove_layers(copy.deepcopy(model), kept), samples, pad)

    cut = L.CutLoss(model, samples, pad)
    assert cut({"dec": [1, 2, 3]}) == copied({"dec": [1, 2, 3]})
    for kept in ([2, 3], [1, 3], [1, 2]):
        assert cut({"dec": kept}, {"dec": [1, 2, 3]}) == copied({"dec": kept})
    for kept in ([3], [1]):
        assert cut({"dec": kept}, {"dec": [1, 3]}) == copied({"dec": kept})
    both = {"enc": [1, 2, 4], "dec": [1, 3]}
    assert cut(both, {"enc": [1, 2, 3, 4], "dec": [1, 3]}) == copied(both)
    assert len(model.decoder.layers) == 3  # the model itself as it was


def test_greedy_selection_removes_the_cheapest_layer_each_step(stock):
    model = stock[0]
    # a loss that only the kept decoder layers' original identity decides: removing layer 2 costs least, then 3
    cost = {1: 5.0, 2: 1.0, 3: 2.0}

    def loss(kept, parent):
        assert parent is None or len(kept["dec"]) == len(parent["dec"]) - 1
        return sum(c for i, c in cost.items() if i not in kept["dec"])

    selection = L.select_by_loss(model, {"dec": 1}, loss)
    assert selection.kept == {"dec": (1,)}
    assert [s["removed"] for s in selection.steps] == ["dec:2", "dec:3"]
    assert selection.steps[0]["candidates"] == {"dec:1": 5.0, "dec:2": 1.0, "dec:3": 2.0}
    assert L.select_even(model, {"dec": 2, "enc": 2}).kept == {"dec": (1, 3), "enc": (1, 4)}


# ------------------------------------------------------------------------------------------- a checkpoint

HEADS = [Head("enc-self", 1, 2), Head("enc-self", 2, 5), Head("dec-self", 2, 1), Head("enc-dec", 1, 3)]


@pytest.fixture(scope="module")
def shallow(stock, stock_checkpoint, tmp_path_factory):
    """Fewer layers and uneven heads (head ids and layer numbers of the layer-removed model)."""
    model = prune_model(surgery.remove_layers(copy.deepcopy(stock[0]), KEPT), HEADS)
    path = save_pruned_checkpoint(model, stock_checkpoint, tmp_path_factory.mktemp("shallow") / "shallow.pt")
    return model, path


def test_fewer_layers_and_uneven_heads_round_trip(shallow, stock, tiny_data):
    from test_surgery import reload

    model, path = shallow
    state = torch.load(path, map_location="cpu", weights_only=False)
    assert (state["cfg"]["model"].encoder_layers, state["cfg"]["model"].decoder_layers) == (2, 2)
    gone = ("decoder.layers.2.", "encoder.layers.2.", "encoder.layers.3.")
    assert not any(k.startswith(gone) for k in state["model"])
    reloaded = reload(path, tiny_data)
    assert shape.depths(reloaded) == {"enc": 2, "dec": 2}
    assert HeadLayout.of(reloaded) == HeadLayout.of(model)
    task = stock[1]
    same_outputs(reloaded, model, task, sample_batch(task))


def test_fairseq_generate_decodes_the_shallower_model(shallow, stock, tiny_data):
    model, path = shallow
    task = stock[1]
    out = run_fairseq(["fairseq-generate", tiny_data, "--path", path, "--user-dir", PACKAGE_DIR,
                       "--task", "translation_headprune", "--gen-subset", "test", "--beam", "4", "--max-len-b", "60",
                       "--max-tokens", "3000"]).stdout
    generated = {}
    for line in out.splitlines():
        if line.startswith("H-"):
            sid, score, text = line.split("\t")
            generated[int(sid[2:])] = (float(score), text)
    assert len(generated) == len(task.dataset("test"))
    batch = sample_batch(task, n=8)
    for sid, (tokens, score) in zip(batch["id"].tolist(), beam_hypotheses(model, task, batch)):
        assert generated[sid][1] == task.target_dictionary.string(torch.tensor(tokens))
        assert generated[sid][0] == pytest.approx(score / math.log(2), abs=1e-4)


# ------------------------------------------------------------------------------------------- shrink --keep-layers


def _shrink_cmd(data, ckpt, *extra):
    return ["fairseq-headprune", "shrink", data, "--path", ckpt, "--beam", "2", "--max-tokens", "500",
            "--calibration-sentences", "30", *extra]


@torch.no_grad()
def _feature_error(teacher, student, samples):
    err = 0.0
    for s in samples:
        a = teacher(**s["net_input"], features_only=True)[0]
        b = student(**s["net_input"], features_only=True)[0]
        keep = s["target"].ne(1)
        err += float((a - b)[keep].pow(2).sum())
    return err


def test_reconstruction_brings_a_shallower_model_towards_the_teacher(stock, tiny_data):
    from fairseq_headprune.prune.reconstruct import ReconstructionOptions, reconstruct
    from fairseq_headprune.core.masking import install_head_masks
    from test_shrink import _samples

    model, task = stock
    model = copy.deepcopy(model)
    install_head_masks(model)
    task.load_dataset("valid")
    samples = _samples(model, task, n=24, max_tokens=300)
    kept = {"dec": (1, 3)}
    student = surgery.remove_layers(copy.deepcopy(model), kept)
    before = _feature_error(model, student, samples)
    fits = reconstruct(model, student, samples, task.target_dictionary.pad(),
                       ReconstructionOptions(method="out-proj"), kept_layers=kept)
    # decoder layer 1's FFN is the first sublayer whose target moved (to teacher layer 2's output): it and all
    # above it are fitted; the encoder and decoder layer 1's attention are untouched
    assert [f.key for f in fits] == [("dec-ffn", 1), ("dec-self", 2), ("enc-dec", 2), ("dec-ffn", 2)]
    assert all(f.error_after <= f.error_before for f in fits)
    assert _feature_error(model, student, samples) < 0.9 * before


def test_shrink_keep_layers_with_a_head_budget_writes_a_shallower_model(stock, stock_checkpoint, tiny_data, tmp_path):
    from conftest import run
    from test_surgery import reload

    out = tmp_path / "d2.pt"
    proc = run(_shrink_cmd(tiny_data, stock_checkpoint, "--keep-layers", "dec:2", "--remove", "50%", "--types",
                           "enc-dec,dec-self", "--shape", "per-stack", "--window-steps", "3", "--out", out))
    assert "layers kept" in proc.stdout
    record = json.loads((tmp_path / "d2.json").read_text())
    assert record["check"]["identical_hypotheses"]
    assert len(record["layers"]["kept"]["dec"]) == 2 and record["layers"]["rule"] == "importance"
    assert len(record["layers"]["steps"]) == 1 and len(record["layers"]["steps"][0]["candidates"]) == 3
    reloaded = reload(out, tiny_data)
    assert shape.depths(reloaded) == {"enc": 4, "dec": 2}
    layout = HeadLayout.of(reloaded)
    assert [len(layout.heads[("dec-self", i)]) for i in (1, 2)] == [2, 2]  # 50% of the kept layers' 4 heads
    assert [len(layout.heads[("enc-dec", i)]) for i in (1, 2)] == [2, 2]
    assert record["heads_kept"] == 32 + 8
    # layers alone, evenly spaced
    proc = run(_shrink_cmd(tiny_data, stock_checkpoint, "--keep-layers", "dec:2,enc:3", "--layer-selection", "even",
                           "--out", tmp_path / "e.pt"))
    record = json.loads((tmp_path / "e.json").read_text())
    assert record["layers"]["kept"] == {"dec": [1, 3], "enc": [1, 2, 4]} and record["selection"]["removed"] == 0
    assert shape.depths(reload(tmp_path / "e.pt", tiny_data)) == {"enc": 3, "dec": 2}
    # the heads given (compress's choice), named in the cut model's numbering: the kept layers renumbered 1..N
    run(_shrink_cmd(tiny_data, stock_checkpoint, "--keep-layers", "dec:2", "--heads", "dec-self:2:1+2,enc-dec:2:3",
                    "--window-steps", "3", "--out", tmp_path / "h.pt"))
    record = json.loads((tmp_path / "h.json").read_text())
    assert set(parse_head_spec(record["selection"]["removed_spec"])) == set(parse_head_spec(
        "dec-self:2:1+2,enc-dec:2:3")) and record["check"]["identical_hypotheses"]
    layout = HeadLayout.of(reload(tmp_path / "h.pt", tiny_data))
    assert shape.depths(reload(tmp_path / "h.pt", tiny_data)) == {"enc": 4, "dec": 2}
    assert [len(layout.heads[(t, i)]) for t in ("dec-self", "enc-dec") for i in (1, 2)] == [4, 2, 4, 3]


def test_shrink_keep_layers_bad_input_is_one_line(stock_checkpoint, tiny_data, tmp_path):
    from conftest import run

    out = tmp_path / "x.pt"
    for extra, message in [
        (["--keep-layers", "dec:0"], "at least one layer"),
        (["--keep-layers", "dec:4"], "has 3 layers"),
        (["--keep-layers", "top:2"], "--keep-layers takes STACK:N"),
        (["--keep-layers", "dec:2", "--flops", "50%"], "not --flops"),
        (["--keep-layers", "dec:2", "--heads", "dec-self:3:1"], "dec-self layer 3 does not exist"),  # renumbered
        (["--keep-layers", "dec:2", "--remove", "90%", "--types", "dec-self"], "cannot remove"),
    ]:
        proc = run(_shrink_cmd(tiny_data, stock_checkpoint, *extra, "--out", out), check=False)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and message in lines[0], (extra, proc.stderr)
    assert not out.exists()


# ------------------------------------------------------------------------------------------- recover, export


def test_recover_trains_a_shallower_student_by_logits_distillation(shallow, stock_checkpoint, tiny_data, tmp_path):
    from conftest import run
    from test_surgery import reload

    model, path = shallow
    out = tmp_path / "r.pt"
    recover = ["fairseq-headprune", "recover", tiny_data, "--path", path, "--teacher", stock_checkpoint,
               "--max-tokens", "1500"]
    run([*recover, "--out", out, "--updates", "4"])
    record = json.loads((tmp_path / "r.json").read_text())
    assert record["updates"] == 4 and record["distill"] == "logits"
    recovered = reload(out, tiny_data)
    assert shape.depths(recovered) == {"enc": 2, "dec": 2} and HeadLayout.of(recovered) == HeadLayout.of(model)
    assert any(not torch.equal(a, b) for a, b in zip(recovered.state_dict().values(), model.state_dict().values()))
    for argv, message in [
        ([*recover, "--out", tmp_path / "h.pt", "--distill-hidden-weight", "0.1"], "one to one: the student has 2"),
        (["fairseq-headprune", "recover", tiny_data, "--path", stock_checkpoint, "--teacher", path, "--out",
          tmp_path / "deep.pt"], "encoder-layers is 4 in the student and 2 in the teacher"),
    ]:
        proc = run(argv, check=False)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and message in lines[0], proc.stderr[-2000:]


def test_export_ct2_of_a_shallower_decoder_translates_as_fairseq(stock_checkpoint, tiny_data, tmp_path):
    from conftest import run
    from fairseq_headprune.core.masking import install_head_masks
    from test_export_ct2 import _ct2_tokens, _load_pruned

    model, _ = load_stock(stock_checkpoint, tiny_data)
    install_head_masks(model)
    heads = [Head(t, i, h) for t in ("dec-self", "enc-dec") for i in (1, 2) for h in (2, 4)]
    shallow = prune_model(surgery.remove_layers(model, {"dec": [1, 3]}), heads)  # decoder: 2 layers x 2 heads
    ckpt = save_pruned_checkpoint(shallow, stock_checkpoint, tmp_path / "shallow-pruned.pt")
    out = tmp_path / "ct2"
    proc = run(["fairseq-headprune", "export-ct2", tiny_data, "--path", ckpt, "--out", out, "--gen-subset", "test",
                "--beam", "4", "--max-len-b", "60", "--max-tokens", "800", "--check-sentences", "24"])
    assert "encoder 8, decoder 2" in proc.stdout and ": 0 hypotheses differ" in proc.stdout, proc.stdout
    reloaded, task = _load_pruned(ckpt, tiny_data)
    assert shape.depths(reloaded) == {"enc": 4, "dec": 2}
    batch = sample_batch(task, n=12)
    assert _ct2_tokens(out, task, batch) == [t for t, _ in beam_hypotheses(reloaded, task, batch)]


def test_hidden_distance_through_a_layer_map():
    from fairseq_headprune.criterions.label_smoothed_cross_entropy_distill import hidden_distance, parse_hidden_layers

    torch.manual_seed(0)
    teacher = [torch.randn(5, 2, 4) for _ in range(4)]  # embeddings + 3 layers
    keep = torch.ones(2, 5)
    student = [teacher[0], teacher[3] + 1.0]  # one layer: the teacher's last plus 1 everywhere
    assert float(hidden_distance(student, teacher, keep, [3])) == pytest.approx(10.0)  # 1 per position, 10 kept
    assert float(hidden_distance([teacher[0], teacher[2]], teacher, keep, [2])) == 0.0
    with pytest.raises(UserError, match="one to one"):
        hidden_distance(student, teacher, keep)
    with pytest.raises(UserError, match="one teacher layer"):
        hidden_distance(student, teacher, keep, [1, 2])
    with pytest.raises(UserError, match="one teacher layer"):
        hidden_distance(student, teacher, keep, [4])
    assert parse_hidden_layers("") is None and parse_hidden_layers("3,4,6") == [3, 4, 6]
    for bad in ("a", "0,1"):
        with pytest.raises(UserError, match="--distill-hidden-layers"):
            parse_hidden_layers(bad)
    assert L.teacher_outputs({"dec": (1, 4, 5)}, {"enc": 6, "dec": 6}) == {"dec": [3, 4, 6]}


def test_recover_with_the_hidden_term_through_the_layer_map(shallow, stock_checkpoint, tiny_data, tmp_path):
    from conftest import run

    _model, path = shallow  # decoder layers 1 and 3 of 3 kept: their outputs stand for the teacher's 2 and 3
    recover = ["fairseq-headprune", "recover", tiny_data, "--path", path, "--teacher", stock_checkpoint,
               "--max-tokens", "1500", "--updates", "2"]
    proc = run([*recover, "--out", tmp_path / "h.pt", "--distill-hidden-weight", "0.1",
                "--distill-hidden-layers", "2,3", "--log-interval", "1"])
    assert re.search(r"\| train_inner \|.* hidden=[0-9.]+", proc.stdout + proc.stderr), "the term was computed"
    record = json.loads((tmp_path / "h.json").read_text())
    assert record["options"]["distill_hidden_layers"] == "2,3" and record["updates"] == 2
    for extra, message in [(["--distill-hidden-weight", "0.1", "--distill-hidden-layers", "2"], "one teacher layer"),
                           (["--distill-hidden-weight", "0.1", "--distill-hidden-layers", "2,4"], "(1..3)"),
                           (["--distill-hidden-layers", "2,3"], "--distill-hidden-weight 0 turns off")]:
        proc = run([*recover, "--out", tmp_path / "x.pt", *extra], check=False)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and message in lines[0], proc.stderr[-2000:]


def test_deploy_times_a_shallower_model_and_a_ceiling_of_its_depth(stock_checkpoint, tiny_data, tmp_path):
    from conftest import run
    from fairseq_headprune.core.masking import install_head_masks
    from test_deploy import deploy_argv

    model, _ = load_stock(stock_checkpoint, tiny_data)
    install_head_masks(model)
    heads = [Head(t, i, h) for t in ("dec-self", "enc-dec") for i in (1, 2) for h in (3, 4)]
    shallow = prune_model(surgery.remove_layers(model, {"dec": [1, 3]}), heads)  # decoder: 2 layers x 2 heads
    ckpt = save_pruned_checkpoint(shallow, stock_checkpoint, tmp_path / "d2.pt")
    out = tmp_path / "table"
    argv = deploy_argv(tiny_data, stock_checkpoint, out, "--compare", f"d2={ckpt}", "--candidate", "d2",
                       "--ceilings", "4x8/2x2", "8/2")
    i = argv.index("--calibration-sentences")  # deploy's own shrink is off: its options are refused
    run(argv[:i] + argv[i + 2:] + ["--shrink-percent", "0"])
    table = json.loads((out / "deploy.json").read_text())
    rows = {(r["model"], r["engine"]): r for r in table["rows"]}
    assert rows[("d2", "ct2-int8")]["ct2_heads_per_stack"] == [8, 2]
    assert rows[("d2", "ct2-float32")]["differing_from_fairseq"] == 0
    ceilings = {c["shape"]: c for c in table["ceilings"]}
    assert ceilings["4x8/2x2"]["flop_ratio"] == pytest.approx(rows[("d2", "ct2-int8")]["flop_ratio"])
    assert ceilings["4x8/2x2"]["flop_ratio"] > ceilings["8/2"]["flop_ratio"] > 1.0  # depth and heads multiply
