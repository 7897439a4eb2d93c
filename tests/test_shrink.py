"""Retraining-free pruning to a budget (`shrink`): Fisher scores, rearrangement, reconstruction, export, errors."""
import copy
import json

import pytest
import torch

from conftest import run, run_fairseq
from fairseq_headprune.prune import select
from fairseq_headprune.core.heads import Head, HeadLayout
from fairseq_headprune.core.masking import install_head_masks, row_head_masks, set_head_masks
from fairseq_headprune.prune.reconstruct import ReconstructionOptions, reconstruct, ridge_condition
from fairseq_headprune.prune.window_fit import WindowOptions
from fairseq_headprune.prune.sublayers import capture, token_mask
from fairseq_headprune.records.identity import file_sha256
from fairseq_headprune.prune.shrink import calibration_samples, select_heads
from fairseq_headprune.prune.shrink_options import Budget, ShrinkOptions, heads_to_remove, parse_budget
from helpers import beam_hypotheses, load_stock, sample_batch


@pytest.fixture(scope="module")
def tiny(stock_checkpoint, tiny_data):
    model, task = load_stock(stock_checkpoint, tiny_data)
    install_head_masks(model)
    task.load_dataset("valid")
    return model, task


def _loaded(model, task):
    """What calibration_samples needs of a loading.Loaded."""
    class _Cfg:
        class task:  # noqa: N801
            data = ""

        class generation:  # noqa: N801
            min_len = 1

    class _Loaded:
        pass

    loaded = _Loaded()
    loaded.task, loaded.model, loaded.cfg = task, model, _Cfg
    loaded.saved_cfg = type("S", (), {"task": task.cfg})
    return loaded


def _samples(model, task, n=24, max_tokens=300):
    samples, _ = calibration_samples(_loaded(model, task), "valid", n, max_tokens)
    return samples


# ------------------------------------------------------------------------------------------- mask search


def test_fisher_equals_sum_of_squared_per_sentence_gradients(tiny):
    model, task = tiny
    pad = task.target_dictionary.pad()
    samples = _samples(model, task, n=10, max_tokens=200)
    assert len(samples) > 1  # several batches with padding
    grads = select.sentence_gradients(model, samples, pad)
    fisher = select.fisher_scores(grads)
    order = [sid for s in samples for sid in s["id"].tolist()]
    dataset = task.dataset("valid")
    expected = {}
    for sid in sorted(order):  # each sentence alone, in a batch of one
        alone = dataset.collater([dataset[sid]])
        for p in model.parameters():
            p.requires_grad_(False)
        with row_head_masks(model, 1, requires_grad=True) as leaves:
            select.sentence_nll(model, alone, pad).backward()
            for key, leaf in leaves.items():
                expected[key] = expected.get(key, 0) + leaf.grad.double()[0].pow(2)
    for key in fisher:
        torch.testing.assert_close(fisher[key], expected[key], rtol=1e-4, atol=1e-9)
    assert all(g.shape[0] == 10 for g in grads.values())
    assert not any(p.grad is not None for p in model.parameters())


def test_rearrangement_never_increases_its_objective_and_keeps_the_budget():
    gen = torch.Generator().manual_seed(0)
    for trial in range(20):
        heads = 8
        grads = {("enc-self", 1): torch.randn(30, heads, generator=gen, dtype=torch.float64),
                 ("dec-self", 1): torch.randn(30, heads, generator=gen, dtype=torch.float64) * 3}
        ids = {k: tuple(range(1, heads + 1)) for k in grads}
        scores = select.fisher_scores(grads)
        removed = select.fill_by_heads(scores, ids, 3 + trial % 9)
        r = select.rearrange(removed, grads, ids)
        assert len(r.removed) == len(removed)
        for key in grads:
            assert sum(h[:2] == key for h in r.removed) == sum(h[:2] == key for h in removed)
            if key in r.objective_before:
                assert r.objective_after[key] <= r.objective_before[key] + 1e-9
        # the objective is what the docstring says: Σ_x (Σ_{h∈P} g_x,h)²
        for key, g in grads.items():
            cols = [h.head - 1 for h in r.removed if (h.type, h.layer) == key]
            if cols and key in r.objective_after:
                assert r.objective_after[key] == pytest.approx(float(g[:, cols].sum(1).pow(2).sum()), rel=1e-9)


def test_fill_by_flops_reaches_the_budget():
    scores = {("enc-self", 1): torch.tensor([1.0, 2.0, 3.0]), ("enc-dec", 1): torch.tensor([1.5, 0.5, 9.0])}
    ids = {k: (1, 2, 3) for k in scores}
    cost = {("enc-self", 1): 1.0, ("enc-dec", 1): 4.0}
    removed = select.fill_by_flops(scores, ids, cost, 5.0)
    assert sum(cost[(h.type, h.layer)] for h in removed) >= 5.0
    assert removed[0] == Head("enc-self", 1, 1) or Head("enc-dec", 1, 2) in removed
    with pytest.raises(ValueError):
        select.fill_by_flops(scores, ids, cost, 100.0)


# ------------------------------------------------------------------------------------------- reconstruction


def _pre_norm(model):
    """The same weights computed pre-norm (LayerNorm before each sublayer): exercises the residual capture at the
    LayerNorm's input. The properties tested hold for any weights."""
    model = copy.deepcopy(model)
    for layer in list(model.encoder.layers) + list(model.decoder.layers):
        layer.normalize_before = True
    return model


def test_a_ridge_systems_condition_is_bounded_without_an_svd_where_the_bound_clears_the_guard():
    """X'X + λI with X'X positive semi-definite: condition <= 1 + trace/λ. Where that clears the guard the bound is
    taken (an SVD of an 8192-unit FFN's system costs minutes); where it does not, the exact condition decides."""
    torch.manual_seed(0)
    X = torch.randn(50, 8, dtype=torch.float64)
    XtX = X.t() @ X
    lam = 1e-3 * float(XtX.diagonal().mean())
    system = XtX + lam * torch.eye(8, dtype=torch.float64)
    exact, bound = float(torch.linalg.cond(system)), 1 + float(XtX.diagonal().sum()) / lam
    assert exact <= bound
    assert ridge_condition(system, lam, 1e12) == pytest.approx(bound)
    assert ridge_condition(system, lam, bound / 2) == pytest.approx(exact)
    assert ridge_condition(XtX, 0.0, 1e12) == pytest.approx(float(torch.linalg.cond(XtX)))


@pytest.mark.parametrize("method", ["scales", "out-proj"])
@pytest.mark.parametrize("norm", ["post", "pre"])
def test_nothing_removed_reconstruction_is_the_identity(tiny, method, norm):
    model, task = tiny
    model = _pre_norm(model) if norm == "pre" else model
    pad = task.target_dictionary.pad()
    samples = _samples(model, task)
    set_head_masks(model, [])
    student = copy.deepcopy(model)
    before = {k: v.clone() for k, v in student.state_dict().items()}
    fits = reconstruct(model, student, samples, pad, ReconstructionOptions(method=method, refit_unpruned=True,
                                                                           refit_ffn=False))
    assert len(fits) == len(HeadLayout.of(model).heads)
    assert not reconstruct(model, student, samples, pad,
                           ReconstructionOptions(method=method, refit_ffn=True, refit_inputs=True))
    for fit in fits:
        assert fit.fallback is None and fit.method == method
        if method == "scales":
            assert fit.scales == pytest.approx([1.0] * fit.kept, abs=1e-4)
    for k, v in student.state_dict().items():
        torch.testing.assert_close(v, before[k], atol=1e-4, rtol=1e-4)


def _sublayer_error(teacher, student, samples, key, pad) -> float:
    """Σ over real tokens of ||student's residual stream after the sublayer - teacher's||², by plain forwards."""
    total = 0.0
    for s in samples:
        with capture(teacher, [key]) as t, capture(student, [key]) as st:
            teacher(**s["net_input"], features_only=True)
            student(**s["net_input"], features_only=True)
        mask = token_mask(s, key, pad)
        target = (t[key].residual[0] + t[key].output[0])[mask]
        total += float((st[key].residual[0] + st[key].output[0])[mask].sub(target).pow(2).sum())
    return total


@pytest.mark.parametrize("method", ["scales", "out-proj"])
@pytest.mark.parametrize("norm", ["post", "pre"])
def test_reconstruction_lowers_the_error_on_the_calibration_tokens(tiny, method, norm):
    model, task = tiny
    model = _pre_norm(model) if norm == "pre" else model
    pad = task.target_dictionary.pad()
    samples = _samples(model, task)
    removed = [Head("enc-self", 2, h) for h in (1, 2, 3, 5)] + [Head("enc-dec", 2, 1), Head("dec-self", 1, 2)]
    student = copy.deepcopy(model)
    set_head_masks(student, removed)
    ffn_student = copy.deepcopy(student)
    fits = reconstruct(model, student, samples, pad, ReconstructionOptions(method=method, refit_ffn=False))
    assert [f.key for f in fits] == [("enc-self", 2), ("dec-self", 1), ("enc-dec", 2)]
    # with the FFN refit: every FFN above the first pruned sublayer, none below it
    ffn_fits = reconstruct(model, ffn_student, samples, pad, ReconstructionOptions(method=method, refit_ffn=True))
    assert [f.key for f in ffn_fits if f.key[0].endswith("ffn")] == [
        ("enc-ffn", 2), ("enc-ffn", 3), ("enc-ffn", 4), ("dec-ffn", 1), ("dec-ffn", 2), ("dec-ffn", 3)]
    assert all(f.error_after <= f.error_before for f in ffn_fits)
    assert all(f.error_after <= f.error_before for f in fits)
    assert any(f.error_after < 0.99 * f.error_before for f in fits)
    # measured again, independently of the normal equations: the first refit sublayer (its inputs are unchanged)
    masked = copy.deepcopy(model)
    set_head_masks(masked, removed)
    key = ("enc-self", 2)

    def error(m):
        return _sublayer_error(model, m, samples, key, pad)

    assert error(student) < error(masked)
    assert error(student) == pytest.approx(fits[0].error_after, rel=1e-3)


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_window_fit_lowers_the_held_out_error_and_keeps_removed_heads_removed(tiny, norm):
    model, task = tiny
    model = _pre_norm(model) if norm == "pre" else model
    pad = task.target_dictionary.pad()
    samples = _samples(model, task, n=40, max_tokens=120)
    assert len(samples) >= 6  # one batch held out
    removed = [Head("enc-self", 2, h) for h in (1, 2, 3, 5)] + [Head("enc-dec", 2, 1), Head("dec-self", 1, 2)]
    student = copy.deepcopy(model)
    set_head_masks(student, removed)
    teacher_before = {k: v.clone() for k, v in model.state_dict().items()}
    fits = reconstruct(model, student, samples, pad, ReconstructionOptions(refit_ffn=False,
                       window=WindowOptions(steps=30, lr=1e-3)))
    windows = [f for f in fits if f.part == "window"]
    assert [f.key for f in windows] == [("enc-self", 2), ("dec-self", 1), ("enc-dec", 2)]
    closed = {f.key: f for f in fits if f.part == "output"}
    for f in windows:  # it starts where the closed-form fit ended, and never ends above it
        assert f.error_before == pytest.approx(closed[f.key].error_after, rel=1e-4)
        assert f.error_after <= f.error_before
    assert any(f.method == "window" and f.steps > 0 and f.error_after < 0.99 * f.error_before for f in windows)
    for k, v in model.state_dict().items():
        assert torch.equal(v, teacher_before[k]), k
    # a removed head's projections get no gradient: its rows are the closed-form student's (which leaves q/k/v)
    attn, original = student.encoder.layers[1].self_attn, model.encoder.layers[1].self_attn
    hd = attn.head_dim
    for h in (1, 2, 3, 5):
        rows = slice((h - 1) * hd, h * hd)
        for proj in ("q_proj", "k_proj", "v_proj"):
            assert torch.equal(getattr(attn, proj).weight[rows], getattr(original, proj).weight[rows])
    # measured again, independently: the first window's error is the student's own error at that sublayer
    total = _sublayer_error(model, student, samples, ("enc-self", 2), pad)
    assert total == pytest.approx(windows[0].error_after, rel=1e-3)
    # steps that only raise the held-out error are all undone
    wild = copy.deepcopy(model)
    set_head_masks(wild, removed)
    plain = copy.deepcopy(wild)
    reconstruct(model, plain, samples, pad, ReconstructionOptions(refit_ffn=False))
    wild_fits = reconstruct(model, wild, samples, pad, ReconstructionOptions(refit_ffn=False,
                       window=WindowOptions(steps=5, lr=10.0)))
    assert all(f.method == "none" and f.steps == 0 for f in wild_fits if f.part == "window")
    for k, v in plain.state_dict().items():
        assert torch.equal(v, wild.state_dict()[k]), k


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_a_window_step_on_some_sentences_of_a_batch_is_those_sentences_of_the_whole_batch(tiny, norm):
    """A step above step_tokens takes some sentences of its batch: their window outputs must be exactly their rows
    of the whole batch's (encoder and decoder self-attention with their masks, encoder-decoder attention)."""
    from fairseq_headprune.prune.reconstruct import _Student, teacher_targets
    from fairseq_headprune.prune.window_fit import _difference, _step_batch, record_batches, window_modules

    model, task = tiny
    model = _pre_norm(model) if norm == "pre" else model
    pad = task.target_dictionary.pad()
    samples = _samples(model, task, n=12, max_tokens=400)
    student = copy.deepcopy(model)
    set_head_masks(student, [Head("enc-self", 1, 2), Head("dec-self", 2, 1)])
    keys = [("enc-self", 2), ("dec-self", 2), ("enc-dec", 1)]
    targets = teacher_targets(model, samples, keys, pad)
    runner = _Student(student, samples)
    generator = torch.Generator().manual_seed(0)
    for key in keys:
        module, _, output = window_modules(student, key)
        whole = max(record_batches(runner, key, module, targets[key], pad), key=lambda b: b.mask.size(1))
        assert whole.mask.size(1) >= 4 and not whole.mask.all()  # several sentences, with padding
        rows = torch.tensor([0, 2, whole.mask.size(1) - 1])
        part = whole.rows(rows)
        with torch.no_grad():
            full = output(*whole.call)[:, rows]
            torch.testing.assert_close(output(*part.call), full, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(_difference(part, output), (whole.residual[:, rows] + full
                                       - whole.target[:, rows])[whole.mask[:, rows]], atol=1e-5, rtol=1e-5)
        limit = int(whole.mask.sum()) // 3
        step = _step_batch(whole, limit, generator)  # a random share of the sentences, about the limit's worth
        assert 1 <= step.mask.size(1) <= whole.mask.size(1) // 3 + 1
        assert _step_batch(whole, int(whole.mask.sum()), generator) is whole  # within the limit: the batch itself


@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("first", ["enc-self", "dec-self"])
def test_input_maps_bring_the_drifted_inputs_back_towards_the_teacher(tiny, norm, first):
    model, task = tiny
    model = _pre_norm(model) if norm == "pre" else model
    pad = task.target_dictionary.pad()
    samples = _samples(model, task)
    removed = [Head(first, 1, h) for h in (1, 2, 3)]
    plain, mapped = copy.deepcopy(model), copy.deepcopy(model)
    set_head_masks(plain, removed)
    set_head_masks(mapped, removed)
    reconstruct(model, plain, samples, pad, ReconstructionOptions(refit_ffn=True))
    fits = reconstruct(model, mapped, samples, pad, ReconstructionOptions(refit_ffn=True, refit_inputs=True))
    inputs = [f.key for f in fits if f.part == "input"]
    # every sublayer above the first pruned one of its stream; the encoder output before the decoder when the
    # encoder drifted, and the decoder's stream from its first encoder-decoder attention's output on
    if first == "enc-self":
        assert inputs[:8] == [("enc-ffn", 1), ("enc-self", 2), ("enc-ffn", 2), ("enc-self", 3), ("enc-ffn", 3),
                              ("enc-self", 4), ("enc-ffn", 4), ("enc-out", 4)]
        assert inputs[8] == ("dec-ffn", 1)  # decoder self-attention 1 and the queries of layer 1 read no drift
    else:
        assert inputs[:2] == [("enc-dec", 1), ("dec-ffn", 1)]
        assert all(k[0] not in ("enc-self", "enc-ffn", "enc-out") for k in inputs)
    assert all(f.error_after <= f.error_before for f in fits)
    assert any(f.error_after < 0.99 * f.error_before for f in fits if f.part == "input")
    # measured again, independently: the first mapped layer reads the same drifted input in both students (the
    # pruned sublayer below is fitted alike); through its map it computes closer to the teacher's layer
    key = inputs[0]
    probe = {"enc-ffn": lambda m: m.encoder.layers[0].fc1,
             "enc-dec": lambda m: m.decoder.layers[0].encoder_attn.q_proj}[key[0]]  # the layer reading it

    def error(student):
        total = 0.0
        for s in samples:
            outs = {}
            hooks = [probe(m).register_forward_hook(lambda _m, _a, out, m=m, outs=outs: outs.setdefault(id(m), out))
                     for m in (model, student)]
            try:
                model(**s["net_input"], features_only=True)
                student(**s["net_input"], features_only=True)
            finally:
                for h in hooks:
                    h.remove()
            mask = token_mask(s, key, pad)
            total += float((outs[id(student)] - outs[id(model)])[mask].pow(2).sum())
        return total

    assert error(mapped) < error(plain)


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_forwards_from_the_kept_layer_inputs_fit_what_forwards_from_the_embeddings_fit(tiny, norm, monkeypatch):
    """The student runner starts each forward at the input of the layer it last reached: the fits (closed form,
    input maps, window) come out bit for bit as with every forward from the embeddings."""
    from fairseq_headprune.prune import reconstruct as R

    model, task = tiny
    model = _pre_norm(model) if norm == "pre" else model
    pad = task.target_dictionary.pad()
    samples = _samples(model, task)
    removed = [Head("enc-self", 2, 1), Head("enc-self", 3, 4), Head("dec-self", 1, 2), Head("enc-dec", 2, 3)]
    options = ReconstructionOptions(refit_ffn=True, refit_inputs=True, window=WindowOptions(steps=10))
    students = [copy.deepcopy(model), copy.deepcopy(model)]
    for student in students:
        set_head_masks(student, removed)
    streamed = reconstruct(model, students[0], samples, pad, options)
    forward_to = R._Student.forward_to

    def from_the_embeddings(runner, b, key):
        runner._streams.clear()
        return forward_to(runner, b, key)

    monkeypatch.setattr(R._Student, "forward_to", from_the_embeddings)
    whole = reconstruct(model, students[1], samples, pad, options)
    assert [f.as_json() for f in streamed] == [f.as_json() for f in whole]
    assert {f.part for f in streamed} == {"input", "output", "window"}
    theirs = dict(students[1].named_parameters())
    assert all(torch.equal(p, theirs[name]) for name, p in students[0].named_parameters())


def test_a_search_in_steps_runs_the_teacher_once_and_fits_what_a_run_each_step_fits(tiny, monkeypatch):
    """--search-steps: every step's student is fitted towards the same model on the same sentences, from its
    targets held (reconstruct.TeacherTargets): the same heads and weights as with the teacher run at each step."""
    from fairseq_headprune.prune import reconstruct as R
    from fairseq_headprune.prune.shrink import Calibration, search_with_reconstruction

    model, task = tiny
    pad = task.target_dictionary.pad()
    samples = _samples(model, task)
    calibration = Calibration(samples=samples, subset="valid", sentences=24, targets="references", ids_sha256="",
                              source_tokens=0, target_tokens=0)
    grads = select.sentence_gradients(model, samples, pad)
    options = ShrinkOptions(remove="12", search_steps=3)
    runs = []
    real = R.teacher_targets
    monkeypatch.setattr(R, "teacher_targets", lambda *a: runs.append(a[0]) or real(*a))

    def search():
        runs.clear()
        result = search_with_reconstruction(model, grads, parse_budget(options), options, calibration, pad)
        return result, len(runs)

    held, held_runs = search()
    monkeypatch.setattr(R.TeacherTargets, "serves", lambda self, teacher, samples: False)
    each, each_runs = search()
    assert held.selection.removed == each.selection.removed and len(held.selection.removed) == 12
    assert (held_runs, each_runs) == (1, 3)
    theirs = dict(each.student.named_parameters())
    assert all(torch.equal(p, theirs[name]) for name, p in held.student.named_parameters())


# ------------------------------------------------------------------------------------------- budgets


def test_a_flops_budget_is_met_by_every_free_search(tiny):
    model, task = tiny
    pad = task.target_dictionary.pad()
    samples = _samples(model, task, n=16)
    set_head_masks(model, [])
    grads = select.sentence_gradients(model, samples, pad)
    lengths = ([int(n) for s in samples for n in s["net_input"]["src_tokens"].ne(pad).sum(1)],
               [int(n) for s in samples for n in s["target"].ne(pad).sum(1)])
    for search in ("fisher", "importance", "block", "full"):
        options = ShrinkOptions(flops="80%", search=search)
        selection = select_heads(model, grads, parse_budget(options), options, lengths)
        assert selection.removed and selection.flops["share"] <= 0.80, search
        assert selection.flops["share"] > 0.70, (search, selection.flops)  # not far past the budget


def test_budgets():
    assert parse_budget(ShrinkOptions(remove="50%")) == Budget("remove", 50.0, True)
    assert parse_budget(ShrinkOptions(keep="12")) == Budget("keep", 12.0, False)
    layout = HeadLayout({("enc-self", 1): (1, 2, 3, 4), ("dec-self", 1): (1, 2)},
                        {("enc-self", 1): 4, ("dec-self", 1): 2})
    assert heads_to_remove(Budget("remove", 50.0, True), layout, ("enc-self", "dec-self")) == 3
    assert heads_to_remove(Budget("keep", 1.0, False), layout, ("enc-self",)) == 3
    assert heads_to_remove(Budget("remove", 100.0, True), layout, ("enc-self",)) == 4


# ------------------------------------------------------------------------------------------- the command


def _cmd(data, ckpt, *extra):
    return ["fairseq-headprune", "shrink", data, "--path", ckpt, "--beam", "2", "--max-tokens", "500",
            "--calibration-sentences", "30", *extra]


def test_pruned_checkpoint_decodes_as_the_in_memory_model(stock_checkpoint, tiny_data, tmp_path):
    from fairseq_headprune import cli
    from fairseq_headprune.cli import shrink as command
    from fairseq_headprune.fairseq_io.loading import load
    from fairseq_headprune.prune.shrink import shrink, write_checkpoint

    out = tmp_path / "small.pt"
    argv = _cmd(tiny_data, stock_checkpoint, "--remove", "40%", "--refit-inputs", "--out", out)[2:]
    cfg, args = cli.parse("shrink", command, [str(a) for a in argv])
    loaded = load(cfg)
    options = command.shrink_options(args)
    result, calibration = shrink(loaded, options, log=lambda *_: None)
    record = write_checkpoint(loaded, result, calibration, options, str(out), str(tmp_path / "small.json"),
                              log=lambda *_: None)
    assert record["check"]["identical_hypotheses"]
    assert record["heads_kept"] == 56 - 22  # 4 x 8 encoder heads, 3 x 4 x 2 decoder heads; 40% of 56
    reloaded, task = load_stock(out, tiny_data)
    batch = sample_batch(task, n=8)
    ours, theirs = beam_hypotheses(reloaded, task, batch), beam_hypotheses(result.student, task, batch)
    assert [t for t, _ in ours] == [t for t, _ in theirs]
    assert [s for _, s in ours] == pytest.approx([s for _, s in theirs], abs=1e-4)
    assert sum(p.numel() for p in reloaded.parameters()) < sum(p.numel() for p in loaded.model.parameters())
    saved = json.loads((tmp_path / "small.json").read_text())
    assert saved["calibration"]["sentences"] == 30 and saved["selection"]["removed"] == 22
    assert saved["checkpoint_sha256"] == file_sha256(str(out)), "the record names the file written beside it"
    # the command itself, end to end, and stock fairseq-generate on its output
    proc = run(_cmd(tiny_data, stock_checkpoint, "--keep", "30", "--refit", "scales", "--out", tmp_path / "b.pt"))
    assert "wrote" in proc.stdout and (tmp_path / "b.json").exists()
    gen = run_fairseq(["fairseq-generate", tiny_data, "--path", tmp_path / "b.pt", "--user-dir", cli.PACKAGE_DIR,
                       "--gen-subset", "test", "--beam", "2", "--max-tokens", "500"])
    assert "BLEU" in gen.stdout or "BLEU" in gen.stderr


def test_given_heads_are_removed_and_reconstructed_without_a_search(stock_checkpoint, tiny_data, tmp_path):
    from fairseq_headprune import cli
    from fairseq_headprune.cli import shrink as command
    from fairseq_headprune.prune.shrink import shrink
    from fairseq_headprune.core.heads import attention_modules, parse_head_spec
    from fairseq_headprune.core.masking import current_masked_heads, set_head_masks
    from fairseq_headprune.fairseq_io.loading import load

    spec = tmp_path / "closed.json"  # the shape of `gates`' closed-heads.json: a selection made elsewhere
    spec.write_text(json.dumps({"enc-self": {"1": [1, 2, 3]}, "dec-self": {"2": [2, 4]}, "enc-dec": {"3": "1-3"}}))
    argv = _cmd(tiny_data, stock_checkpoint, "--heads", f"@{spec}", "--out", tmp_path / "g.pt")[2:]
    cfg, args = cli.parse("shrink", command, [str(a) for a in argv])
    loaded = load(cfg)
    held = parse_head_spec("dec-self:1:1")  # a mask the caller's model holds: read unmasked, left as it was
    set_head_masks(loaded.model, held)
    result, _ = shrink(loaded, command.shrink_options(args), log=lambda *_: None)
    assert current_masked_heads(loaded.model) == held
    assert result.selection.removed == parse_head_spec(f"@{spec}") and len(result.selection.removed) == 8
    assert result.selection.order == "given (--heads)"
    fitted = {f.key for f in result.fits if f.method != "none"}
    assert {("enc-self", 1), ("dec-self", 2), ("enc-dec", 3)} <= fitted  # reconstructed, not only removed
    masks = {key: attn.head_mask.tolist() for key, attn in attention_modules(result.student).items()}
    assert masks[("enc-self", 1)][:3] == [0, 0, 0] and sum(masks[("enc-dec", 3)]) == 1
    assert sum(sum(m) for m in masks.values()) == 56 - 8


def _gated(stock_checkpoint, tiny_data, path):
    from fairseq_headprune.core.masking import install_head_gates

    model, _ = load_stock(stock_checkpoint, tiny_data)
    install_head_gates(model, ["enc-self"])
    state = torch.load(stock_checkpoint, map_location="cpu", weights_only=False)
    state["model"] = model.state_dict()
    torch.save(state, path)
    return path


def _empty_subset(tiny_data, tmp_path):
    import shutil

    from fairseq.data import indexed_dataset

    data = tmp_path / "empty-valid"
    data.mkdir()
    for f in tiny_data.iterdir():
        if f.name.startswith("dict.") or f.name.startswith("test."):
            shutil.copy(f, data / f.name)
    for lang in ("de", "en"):
        prefix = str(data / f"valid.de-en.{lang}")
        builder = indexed_dataset.make_builder(prefix + ".bin", impl="mmap", vocab_size=1000)
        builder.finalize(prefix + ".idx")
    return data


def test_bad_input_is_one_line_and_exit_code_2(stock_checkpoint, tiny_data, tmp_path):
    out = tmp_path / "x.pt"
    cases = [
        (["--remove", "0"], "above 0"),
        (["--remove", "0.5%"], "removes no head"),
        (["--remove", "0%"], "above 0%"),
        (["--remove", "150%"], "at most 100%"),
        (["--remove", "500"], "cannot remove 500 heads"),
        (["--keep", "57"], "have only 56"),
        (["--remove", "50%", "--types", "enc-foo"], "unknown attention type"),
        (["--flops", "5%"], "cannot be reached"),
        (["--remove", "10%", "--calibration-sentences", "0"], "at least 1"),
        (["--remove", "20", "--min-heads-per-layer", "4"], "at most 16 can go"),
        (["--remove", "10%", "--min-heads-per-layer", "-1"], "at least 0"),
        (["--remove", "10%", "--window-steps", "-1"], "--window-steps must be >= 0"),
        (["--remove", "10%", "--window-steps", "5", "--refit", "none"], "needs --refit"),
        (["--heads", "enc-self:1:1", "--search", "fisher"], "--search would choose them"),
        (["--heads", "enc-self:1:1", "--shape", "per-stack"], "--shape would choose them"),
        (["--heads", "enc-self:9:1"], "does not exist"),
        (["--heads", "dec-self:1:1-4"], "leaves dec-self:1 fewer than 1 head"),
        (["--heads", "enc-self:1:1", "--sweep", "50", "--results-dir", str(tmp_path / "s")], "--sweep searches"),
    ]
    for extra, message in cases:
        proc = run(_cmd(tiny_data, stock_checkpoint, *extra, "--out", out), check=False)
        assert proc.returncode == 2, (extra, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("fairseq-headprune shrink: error:"), (extra, proc.stderr)
        assert message in lines[0], (extra, lines[0])
    assert not out.exists()
    # a sweep budget one of its methods cannot meet is refused before anything is decoded
    proc = run(_cmd(tiny_data, stock_checkpoint, "--sweep", "50,95", "--sweep-methods", "michel,full+out-proj+ffn+min1",
                    "--gen-subset", "test", "--results-dir", tmp_path / "sweep"), check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "at most 46 can go" in lines[0], proc.stderr
    assert not (tmp_path / "sweep" / "shrink-sweep.jsonl").exists()
    proc = run(_cmd(_empty_subset(tiny_data, tmp_path), stock_checkpoint, "--remove", "10%", "--out", out),
               check=False)
    assert proc.returncode == 2 and "is empty" in proc.stderr, proc.stderr
    gated = _gated(stock_checkpoint, tiny_data, tmp_path / "gated.pt")
    proc = run(_cmd(tiny_data, gated, "--remove", "10%", "--out", out), check=False)
    assert proc.returncode == 2 and "L0 head gates" in proc.stderr, proc.stderr
    link = tmp_path / "link.pt"
    link.symlink_to(stock_checkpoint)
    for target in (stock_checkpoint, link):  # never the input, links resolved
        proc = run(_cmd(tiny_data, stock_checkpoint, "--remove", "10%", "--out", target), check=False)
        assert proc.returncode == 2 and "is the checkpoint being read" in proc.stderr, proc.stderr
    # a record named as the checkpoint would overwrite it (`--out X.json`): refused before any work
    proc = run(_cmd(tiny_data, stock_checkpoint, "--remove", "10%", "--out", tmp_path / "m.json"), check=False)
    assert proc.returncode == 2 and "would be written over it" in proc.stderr, proc.stderr
    assert not (tmp_path / "m.json").exists()


def test_fills_keep_the_minimum_of_heads_per_layer():
    # layer 1's heads have tiny gradients, layer 2's large ones: without a minimum every fill empties layer 1
    torch.manual_seed(0)
    grads = {("enc-self", 1): 0.01 * torch.randn(16, 4, dtype=torch.float64),
             ("enc-self", 2): torch.randn(16, 4, dtype=torch.float64)}
    ids = {("enc-self", 1): (1, 2, 3, 4), ("enc-self", 2): (1, 2, 3, 4)}
    scores = select.fisher_scores(grads)

    def per_layer(removed):
        return [sum(h.layer == layer for h in removed) for layer in (1, 2)]

    fills = {"diagonal": lambda m: select.fill_by_heads(scores, ids, 5, min_kept=m),
             "block": lambda m: select.fill_greedy(grads, ids, 5, block=True, min_kept=m),
             "full": lambda m: select.fill_greedy(grads, ids, 5, block=False, min_kept=m),
             "flops": lambda m: select.fill_by_flops(scores, ids, {k: 1.0 for k in ids}, 5.0, min_kept=m),
             "greedy flops": lambda m: select.fill_greedy(grads, ids, 0, head_cost={k: 1.0 for k in ids},
                                                               flops_to_remove=5.0, min_kept=m)}
    for name, fill in fills.items():
        assert per_layer(fill(0)) == [4, 1], name
        assert per_layer(fill(1)) == [3, 2], name  # the budget is met exactly, from the other layer
        with pytest.raises(ValueError, match="at least 2 in every layer"):  # 5 of 8 cannot go keeping 2 each
            fill(2)


def test_greedy_fill_counts_correlated_heads_together():
    # heads 1 and 2 of a layer have small, perfectly correlated gradients; head 3 a larger independent one: the
    # diagonal fill removes 1 and 2, the block/full greedy fill sees that together they cost more than 1 and 3
    g = torch.zeros(4, 3, dtype=torch.float64)
    g[:, 0] = g[:, 1] = torch.tensor([1.0, 1.0, 1.0, 1.0])
    g[:, 2] = torch.tensor([1.2, -1.2, 1.2, -1.2])
    grads = {("enc-self", 1): g}
    ids = {("enc-self", 1): (1, 2, 3)}
    assert select.fill_by_heads(select.fisher_scores(grads), ids, 2) == [Head("enc-self", 1, 1),
                                                                                Head("enc-self", 1, 2)]
    for block in (True, False):
        removed = select.fill_greedy(grads, ids, 2, block=block)
        assert Head("enc-self", 1, 3) in removed and len(removed) == 2
    # a FLOP budget: the greedy step takes the smallest increase per FLOP until enough is saved
    removed = select.fill_greedy(grads, ids, 0, head_cost={("enc-self", 1): 2.0}, flops_to_remove=3.0)
    assert len(removed) == 2
    with pytest.raises(ValueError):
        select.fill_greedy(grads, ids, 0, head_cost={("enc-self", 1): 2.0}, flops_to_remove=7.0)
