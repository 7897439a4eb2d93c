"""FFN hidden units as units of pruning (prune.ffn, core.surgery): exact removal, per-sentence mask gradients,
checkpoints that fairseq and CTranslate2 run, and `shrink --ffn-keep` end to end."""
import copy
import json

import pytest
import torch

from conftest import run, run_fairseq
from fairseq_headprune.prune import ffn
from fairseq_headprune.core import shape, surgery
from fairseq_headprune.fairseq_io.pruned_checkpoint import save_pruned_checkpoint
from fairseq_headprune.core.heads import Head
from fairseq_headprune.errors import UserError
from fairseq_headprune.fairseq_io.loading import PACKAGE_DIR
from helpers import beam_hypotheses, incremental_logits, load_stock, sample_batch, teacher_forced_logits

REMOVED = {("enc", 2): [0, 5, 17, 40], ("dec", 3): list(range(0, 64, 3))}  # the tiny FFNs have 64 units


@pytest.fixture(scope="module")
def stock(stock_checkpoint, tiny_data):
    return load_stock(stock_checkpoint, tiny_data)


def zeroing(model, removed):
    """A copy of the model whose FFN units in `removed` have their activation set to zero (nothing removed)."""
    ref = copy.deepcopy(model)
    layers = shape.ffn_layers(ref)
    for key, units in removed.items():
        def hook(_m, args, units=units):
            x = args[0].clone()
            x[..., units] = 0
            return (x,)
        layers[key].fc2.register_forward_pre_hook(hook)
    return ref


def test_removing_units_computes_what_zeroing_their_activations_computes(stock):
    model, task = stock
    batch = sample_batch(task)
    width = shape.ffn_widths(model)
    kept = {key: [u for u in range(width[key]) if u not in units] for key, units in REMOVED.items()}
    pruned = surgery.prune_ffn(copy.deepcopy(model), kept)
    assert shape.ffn_widths(pruned)[("enc", 2)] == 60 and shape.ffn_widths(pruned)[("dec", 3)] == 64 - 22
    assert shape.ffn_widths(pruned)[("dec", 1)] == 64
    reference = zeroing(model, REMOVED)
    assert not torch.allclose(teacher_forced_logits(pruned, batch), teacher_forced_logits(model, batch), atol=1e-3)
    torch.testing.assert_close(teacher_forced_logits(pruned, batch), teacher_forced_logits(reference, batch),
                               atol=1e-5, rtol=0)
    torch.testing.assert_close(incremental_logits(pruned, batch), incremental_logits(reference, batch),
                               atol=1e-5, rtol=0)
    assert [t for t, _ in beam_hypotheses(pruned, task, batch)] == [t for t, _ in beam_hypotheses(reference, task,
                                                                                                    batch)]


@pytest.mark.parametrize("kept,message", [
    ({("dec", 4): [1]}, "no dec layer 4"),
    ({("dec", 1): []}, "at least one"),
    ({("enc", 1): [3, 3]}, "distinct"),
    ({("enc", 1): [64]}, "in 0..63"),
])
def test_prune_ffn_refuses_before_changing_anything(stock, kept, message):
    model = copy.deepcopy(stock[0])
    with pytest.raises(UserError, match=message):
        surgery.prune_ffn(model, {("enc", 2): [0, 1], **kept})
    assert shape.ffn_widths(model)[("enc", 2)] == 64  # checked first: nothing cut


def test_unit_gradients_are_each_sentences_own(stock):
    """One backward pass over a padded batch gives every sentence the mask gradient it has alone."""
    from fairseq_headprune.prune.select import sentence_nll

    model, task = stock
    model = copy.deepcopy(model)
    pad = task.target_dictionary.pad()
    batch = sample_batch(task, n=5)
    together = ffn.unit_gradients(model, [batch], pad)
    dataset = task.dataset("test")
    for row, sid in enumerate(batch["id"].tolist()):
        alone = dataset.collater([dataset[sid]])
        grads = ffn.unit_gradients(model, [alone], pad)
        for key in (("enc", 1), ("dec", 3)):
            torch.testing.assert_close(together[key][row], grads[key][0], atol=1e-6, rtol=1e-4)
    # and the gradient is the loss's derivative in a unit mask: a finite difference on one unit
    key, unit = ("dec", 2), int(together[("dec", 2)][0].abs().argmax())
    alone = dataset.collater([dataset[batch["id"][0].item()]])
    scale = {}

    def hook(_m, args):
        x = args[0].clone()
        x[..., unit] = x[..., unit] * scale["m"]
        return (x,)

    shape.ffn_layers(model)[key].fc2.register_forward_pre_hook(hook)
    losses = []
    with torch.no_grad():
        for m in (1 + 1e-3, 1 - 1e-3):
            scale["m"] = m
            losses.append(float(sentence_nll(model, alone, pad)))
    assert (losses[0] - losses[1]) / 2e-3 == pytest.approx(float(together[key][0, unit]), rel=2e-2, abs=1e-4)


def test_fisher_kept_keeps_each_layers_highest_units():
    grads = {("dec", 1): torch.tensor([[1.0, -3.0, 0.5, 2.0], [1.0, 0.0, 0.1, -2.0]]),
             ("enc", 1): torch.tensor([[0.0, 0.0, 0.0, 0.0]])}
    kept = ffn.fisher_kept(grads, 50)
    assert kept == {("dec", 1): [1, 3], ("enc", 1): [0, 1]}  # Fisher 2, 9, 0.26, 8; ties by index
    assert ffn.fisher_kept(grads, 1)[("dec", 1)] == [1]  # at least one unit


def candidate(**point):
    """A choice candidate with these fields of its record (its head counts unread: the fits take its heads' spec,
    its kept layers and the share in the options)."""
    from fairseq_headprune.compress.choice import Candidate

    return Candidate.of({"enc_heads": 8, "dec_heads": 4, **point})


def test_the_choice_compares_an_ffn_narrowed_shape_after_the_fits_shrink_applies(stock):
    """reconstructed_nll: a shape that narrows the FFNs is judged as shrink leaves it (the units with the lowest mask
    Fisher gone, every fc2 refit), not as the bare removal leaves it; with nothing removed, the model's own NLL."""
    from types import SimpleNamespace

    from fairseq_headprune.prune import layers
    from fairseq_headprune.compress.choice import reconstructed_nll
    from fairseq_headprune.prune.shrink_options import ShrinkOptions, with_fit
    from fairseq_headprune.prune.window_fit import WindowOptions
    from fairseq_headprune.core.masking import install_head_masks

    model, task = stock
    install_head_masks(model := copy.deepcopy(model))
    pad = task.target_dictionary.pad()
    calibration = SimpleNamespace(samples=[sample_batch(task, n=16)])
    whole = layers.calibration_loss(model, calibration.samples, pad)
    options = with_fit(ShrinkOptions(ffn_keep=25.0), window=WindowOptions(steps=0))
    fitted = reconstructed_nll(model, candidate(heads="", ffn_percent=25.0), calibration, options, pad)
    bare = copy.deepcopy(model)
    surgery.prune_ffn(bare, ffn.fisher_kept(ffn.unit_gradients(bare, calibration.samples, pad), 25.0))
    assert whole < fitted < layers.calibration_loss(bare, calibration.samples, pad)
    assert set(shape.ffn_widths(model).values()) == {64}  # the model given is left whole
    plain = with_fit(ShrinkOptions(), window=WindowOptions(steps=0))
    assert reconstructed_nll(model, candidate(heads=""), calibration, plain, pad) == pytest.approx(whole, abs=1e-6)


def test_shapes_fitted_towards_one_teacher_share_its_targets_and_fit_the_same(stock, monkeypatch):
    """reconstruct.TeacherTargets: the choice's shapes (heads, FFN shares, a cut decoder) fitted with the unpruned
    model's targets held give bit for bit the NLLs they give each computing its own, with fewer teacher runs."""
    from types import SimpleNamespace

    from fairseq_headprune.compress.choice import reconstructed_nll
    from fairseq_headprune.core.masking import install_head_masks
    from fairseq_headprune.prune import reconstruct
    from fairseq_headprune.prune.shrink_options import ShrinkOptions, with_fit
    from fairseq_headprune.prune.window_fit import WindowOptions

    model, task = stock
    install_head_masks(model := copy.deepcopy(model))
    pad = task.target_dictionary.pad()
    dataset = task.dataset("test")
    calibration = SimpleNamespace(samples=[dataset.collater([dataset[i] for i in range(a, a + 8)]) for a in (0, 8)])
    shapes = [(candidate(heads="enc-self:2:1-3", ffn_percent=50.0), 50.0), (candidate(heads="dec-self:2:1+4"), 100.0),
              (candidate(heads="", layers_kept={"dec": [1, 3]}), 100.0), (candidate(heads="enc-dec:3:2"), 75.0)]
    runs = []
    real = reconstruct.teacher_targets
    monkeypatch.setattr(reconstruct, "teacher_targets", lambda *a: runs.append(a[0]) or real(*a))

    def nlls(held):
        runs.clear()
        out = [reconstructed_nll(model, point, calibration, with_fit(ShrinkOptions(ffn_keep=share),
                                                                     window=WindowOptions(steps=0)), pad, held)
               for point, share in shapes]
        return out, len(runs)

    own, own_runs = nlls(None)
    shared, shared_runs = nlls(reconstruct.TeacherTargets(model, calibration.samples, pad))
    assert shared == own and (own_runs, shared_runs) == (len(shapes), 1)
    other = reconstruct.TeacherTargets(copy.deepcopy(model), calibration.samples, pad)  # another teacher's
    assert nlls(other) == (own, len(shapes))  # not used: each shape runs its own teacher


def test_a_narrowed_checkpoint_reloads_and_fairseq_generate_decodes_it(stock, stock_checkpoint, tiny_data, tmp_path):
    from test_surgery import reload

    model, task = stock
    narrowed = surgery.prune_ffn(copy.deepcopy(model), {("enc", 1): list(range(0, 64, 2)), ("dec", 2): list(range(10))})
    path = save_pruned_checkpoint(narrowed, stock_checkpoint, tmp_path / "narrow.pt")
    state = torch.load(path, map_location="cpu", weights_only=False)
    assert json.loads(state["cfg"]["model"].kept_ffn) == {"enc": {"1": 32}, "dec": {"2": 10}}
    reloaded = reload(path, tiny_data)
    assert shape.ffn_widths(reloaded) == shape.ffn_widths(narrowed)
    batch = sample_batch(task, n=8)
    torch.testing.assert_close(teacher_forced_logits(reloaded, batch), teacher_forced_logits(narrowed, batch),
                               atol=1e-5, rtol=0)
    out = run_fairseq(["fairseq-generate", tiny_data, "--path", path, "--user-dir", PACKAGE_DIR,
                       "--task", "translation_headprune", "--gen-subset", "test", "--beam", "4", "--max-len-b", "60",
                       "--max-tokens", "3000"]).stdout
    generated = {int(line.split("\t")[0][2:]): line.split("\t")[2] for line in out.splitlines()
                 if line.startswith("H-")}
    for sid, (tokens, _) in zip(batch["id"].tolist(), beam_hypotheses(narrowed, task, batch)):
        assert generated[sid] == task.target_dictionary.string(torch.tensor(tokens))
    with pytest.raises(UserError, match="--kept-ffn"):
        surgery.apply_kept_ffn(copy.deepcopy(model), '{"dec": {"2": 9999}}')
    with pytest.raises(UserError, match="--kept-ffn must be"):
        shape.parse_kept_ffn('{"mid": {"2": 3}}')


def test_the_shape_of_a_cut_model_is_what_its_checkpoint_records(stock):
    """core.shape.ModelShape read from a model with heads removed, FFNs narrowed and a layer cut: the counts its
    FLOPs read, and the kept_heads / kept_ffn its checkpoint config records; a shape priced without heads
    (ModelShape.without) no longer claims to know which heads it holds."""
    model, _ = stock
    cut = surgery.remove_layers(copy.deepcopy(model), {"dec": [1, 3]})
    surgery.prune_model(cut, [Head("enc-self", 2, 3), Head("enc-self", 2, 5), Head("enc-dec", 2, 1)])
    surgery.prune_ffn(cut, {("dec", 1): list(range(16))})
    read = shape.ModelShape.of(cut)
    assert len(read.enc_ffn) == 4 and read.dec_ffn == (16, 64) and read.ffn[("dec", 1)] == 16
    assert read.heads[("enc-self", 2)] == 6 and read.heads[("enc-dec", 2)] == 3 and ("dec-self", 3) not in read.heads
    assert read.kept_heads() == shape.kept_heads(cut) == {"enc-self": {"2": [1, 2, 4, 6, 7, 8]},
                                                           "enc-dec": {"2": [2, 3, 4]}}
    assert read.kept_heads_json() == shape.kept_heads_json(cut)
    assert read.kept_ffn_json({"enc": 64, "dec": 64}) == '{"dec":{"1":16}}'
    assert read.vocab == model.decoder.output_projection.out_features
    priced = read.without([Head("enc-self", 1, 1)])
    assert priced.heads[("enc-self", 1)] == 7 and priced == shape.ModelShape.of(
        surgery.prune_model(copy.deepcopy(cut), [Head("enc-self", 1, 1)]))
    with pytest.raises(ValueError, match="does not know which heads"):
        priced.kept_heads()


def _shrink(data, ckpt, *extra):
    return ["fairseq-headprune", "shrink", data, "--path", ckpt, "--beam", "2", "--max-tokens", "500",
            "--calibration-sentences", "30", *extra]


def test_shrink_ffn_keep_narrows_every_ffn_refits_it_and_exports(stock_checkpoint, tiny_data, tmp_path):
    from test_export_ct2 import _ct2_tokens, _load_pruned
    from test_surgery import reload

    out = tmp_path / "f.pt"
    proc = run(_shrink(tiny_data, stock_checkpoint, "--ffn-keep", "25%", "--remove", "25%", "--out", out))
    assert "FFN units: every FFN keeps 25% of its units by mask Fisher" in proc.stdout
    record = json.loads((tmp_path / "f.json").read_text())
    assert record["ffn_kept"] == {"enc": {str(i): 16 for i in range(1, 5)}, "dec": {str(i): 16 for i in (1, 2, 3)}}
    assert record["check"]["identical_hypotheses"] and record["options"]["ffn_keep"] == 25
    fitted = {f["key"]: f for f in record["reconstruction"]["sublayers"]}
    cut = [f"enc-ffn:{i}" for i in range(1, 5)] + [f"dec-ffn:{i}" for i in (1, 2, 3)]
    assert all(fitted[k]["method"] == "fc2" and fitted[k]["kept"] == 16 for k in cut)  # every cut FFN refit
    assert set(shape.ffn_widths(reload(out, tiny_data)).values()) == {16}
    # FFN units alone, and CTranslate2 runs the narrowed model as fairseq does
    run(_shrink(tiny_data, stock_checkpoint, "--ffn-keep", "50%", "--out", tmp_path / "g.pt"))
    record = json.loads((tmp_path / "g.json").read_text())
    assert record["selection"]["removed"] == 0 and record["heads_kept"] == record["heads_total"]
    ct2 = tmp_path / "ct2"
    proc = run(["fairseq-headprune", "export-ct2", tiny_data, "--path", tmp_path / "g.pt", "--out", ct2,
                "--gen-subset", "test", "--beam", "4", "--max-len-b", "60", "--max-tokens", "800",
                "--check-sentences", "24"])
    assert ": 0 hypotheses differ" in proc.stdout, proc.stdout
    reloaded, task = _load_pruned(tmp_path / "g.pt", tiny_data)
    batch = sample_batch(task, n=12)
    assert _ct2_tokens(ct2, task, batch) == [t for t, _ in beam_hypotheses(reloaded, task, batch)]


def test_recover_trains_a_narrowed_student(stock, stock_checkpoint, tiny_data, tmp_path):
    from test_surgery import reload

    narrowed = surgery.prune_ffn(copy.deepcopy(stock[0]), {("dec", 1): list(range(16)), ("enc", 3): list(range(40))})
    path = save_pruned_checkpoint(narrowed, stock_checkpoint, tmp_path / "narrow.pt")
    out = tmp_path / "r.pt"
    run(["fairseq-headprune", "recover", tiny_data, "--path", path, "--teacher", stock_checkpoint, "--max-tokens",
         "1500", "--out", out, "--updates", "4"])
    recovered = reload(out, tiny_data)
    assert shape.ffn_widths(recovered) == shape.ffn_widths(narrowed)
    assert any(not torch.equal(a, b) for a, b in zip(recovered.state_dict().values(), narrowed.state_dict().values()))


@pytest.mark.parametrize("extra,message", [
    (("--ffn-keep", "0%"), "--ffn-keep is the share"),
    (("--ffn-keep", "120"), "--ffn-keep is the share"),
    (("--ffn-keep", "50%", "--remove", "10%", "--search-steps", "2"), "it works with one search step"),
    (("--ffn-keep", "50%", "--search", "fisher"), "--search chooses heads: give a head budget"),
    (("--ffn-keep", "50%", "--window-steps", "5"), "--ffn-keep alone removes none"),
    (("--ffn-keep", "50%", "--sweep", "10,20", "--gen-subset", "test"), "the sweep compares head selections"),
])
def test_shrink_ffn_keep_bad_input_is_one_line(stock_checkpoint, tiny_data, tmp_path, extra, message):
    proc = run(_shrink(tiny_data, stock_checkpoint, *extra, "--out", tmp_path / "x.pt"), check=False)
    assert proc.returncode == 2 and message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "x.pt").exists()
