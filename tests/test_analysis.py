"""`analyze`: conservative LRP conserves relevance, per-head attention capture matches fairseq, head functions
on constructed attention, hand-made dependency parses of real test sentences, and the command end to end."""
import contextlib
import copy
import json

import pytest
import torch

from conftest import SLICE, run
from fairseq_headprune.analysis import head_functions as hf
from fairseq_headprune.analysis.attention_capture import capture_attention
from fairseq_headprune.studies import analysis
from fairseq_headprune.analysis.lrp import (conservation_terms, conservative_propagation, layer_shares,
                                            relevance_inputs, step_head_relevances)
from fairseq_headprune.core.masking import install_head_masks, row_head_masks
from helpers import load_stock, sample_batch

# Hand-made UD parses (ID FORM HEAD DEPREL) of the first five German sentences of tests/data/multi30k/test.de.
# Sentence 4 has two multiword tokens (im = in dem), sentence 5 uses the UD v1 label dobj.
PARSES = [
    [(1, "Ein", 2, "det"), (2, "Mann", 0, "root"), (3, "mit", 6, "case"), (4, "einem", 6, "det"),
     (5, "orangefarbenen", 6, "amod"), (6, "Hut", 2, "nmod"), (7, ",", 10, "punct"), (8, "der", 10, "nsubj"),
     (9, "etwas", 10, "obj"), (10, "anstarrt", 2, "acl:relcl"), (11, ".", 2, "punct")],
    [(1, "Ein", 3, "det"), (2, "Boston", 3, "compound"), (3, "Terrier", 4, "nsubj"), (4, "läuft", 0, "root"),
     (5, "über", 7, "case"), (6, "saftig-grünes", 7, "amod"), (7, "Gras", 4, "obl"), (8, "vor", 11, "case"),
     (9, "einem", 11, "det"), (10, "weißen", 11, "amod"), (11, "Zaun", 7, "nmod"), (12, ".", 4, "punct")],
    [(1, "Ein", 2, "det"), (2, "Mädchen", 6, "nsubj"), (3, "in", 5, "case"), (4, "einem", 5, "det"),
     (5, "Karateanzug", 2, "nmod"), (6, "bricht", 0, "root"), (7, "ein", 8, "det"), (8, "Brett", 6, "obj"),
     (9, "mit", 11, "case"), (10, "einem", 11, "det"), (11, "Tritt", 6, "obl"), (12, ".", 6, "punct")],
    [(1, "Fünf", 2, "nummod"), (2, "Leute", 8, "nsubj"), (3, "in", 4, "case"), (4, "Winterjacken", 2, "nmod"),
     (5, "und", 7, "cc"), (6, "mit", 7, "case"), (7, "Helmen", 4, "conj"), (8, "stehen", 0, "root"),
     ("9-10", "im", None, None), (9, "in", 11, "case"), (10, "dem", 11, "det"), (11, "Schnee", 8, "obl"),
     (12, "mit", 13, "case"), (13, "Schneemobilen", 11, "nmod"), ("14-15", "im", None, None), (14, "in", 16, "case"),
     (15, "dem", 16, "det"), (16, "Hintergrund", 13, "nmod"), (17, ".", 8, "punct")],
    [(1, "Leute", 2, "nsubj"), (2, "Reparieren", 0, "root"), (3, "das", 4, "det"), (4, "Dach", 2, "dobj"),
     (5, "eines", 6, "det"), (6, "Hauses", 4, "nmod"), (7, ".", 2, "punct")],
]
ARCS = {"nsubj": 5, "obj": 3, "amod": 3, "advmod": 0}


def conllu(parses) -> str:
    blocks = []
    for i, words in enumerate(parses, start=1):
        lines = [f"# sent_id = {i}"]
        for ident, form, head, rel in words:
            lines.append("\t".join([str(ident), form, "_", "_", "_", "_", "_" if head is None else str(head),
                                    rel or "_", "_", "_"]))
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


@pytest.fixture(scope="module")
def stock(stock_checkpoint, tiny_data):
    return load_stock(stock_checkpoint, tiny_data)


@pytest.fixture(scope="module")
def stock64(stock, monkeypatch_module):
    """The tiny model in float64, with fairseq's float32 softmaxes kept in float64 (their rounding would
    otherwise bound the conservation check at ~1e-7)."""
    from fairseq import utils

    monkeypatch_module.setattr(utils, "softmax", lambda x, dim, onnx_trace=False: torch.softmax(x, dim=dim))
    model, task = stock
    model = copy.deepcopy(model).double()
    install_head_masks(model)
    for p in model.parameters():
        p.requires_grad_(False)
    return model, task


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


@contextlib.contextmanager
def relevance_pass(model, batch, conservative=True):
    """Forward under the LRP context; returns logits' top-1 values, valid steps, ξ leaves, inputs and the
    head outputs (out_proj inputs before ξ, gradient-retaining) by module."""
    net_input = batch["net_input"]
    head_outputs = {}
    hooks = []
    from fairseq_headprune.core.heads import attention_modules

    for key, attn in attention_modules(model).items():
        def pre_hook(_m, inputs, key=key):
            inputs[0].retain_grad()
            head_outputs[key] = inputs[0]
        hooks.append(attn.out_proj.register_forward_pre_hook(pre_hook))  # runs before the ξ multiplication
    context = conservative_propagation(model) if conservative else torch.enable_grad()
    try:
        with torch.enable_grad(), context, relevance_inputs(model) as inputs, \
                row_head_masks(model, net_input["src_tokens"].size(0), requires_grad=True) as leaves:
            logits = model(**net_input)[0]
            yield logits.max(-1).values, batch["target"].ne(1), leaves, inputs, head_outputs
    finally:
        for h in hooks:
            h.remove()


def test_lrp_conserves_relevance_and_head_relevance_is_output_times_gradient(stock64):
    """On the tiny model in float64, for every generation step t (f = sum over sentences of step t's top-1
    logit): f = sum x.df/dx over token+positional embeddings + sum b.df/db over biases, to 1e-9 relative; and
    R_h = xi_h df/dxi_h equals the sum over head h's output elements of output x gradient."""
    model, task = stock64
    batch = sample_batch(task, n=5)
    with relevance_pass(model, batch) as (top, valid, leaves, inputs, head_outputs):
        assert len(inputs.embeddings) == 4  # token and positional embeddings of encoder and decoder
        t = 3
        f = top[valid[:, t], t].sum()
        x_part, b_part = conservation_terms(f, inputs)
        value = float(f.detach())
        assert abs(value - x_part - b_part) < 1e-9 * abs(value)
        assert abs(b_part) > 1e-3 * abs(value) and abs(x_part) > 1e-3 * abs(value)  # both sides matter
        keys = list(head_outputs)
        grads = torch.autograd.grad(f, [head_outputs[k] for k in keys], retain_graph=True)
        relevance, worst = step_head_relevances(top, valid, leaves, inputs)  # frees the graph
        assert worst < 1e-9
        for key, g in zip(keys, grads):
            z = head_outputs[key]  # (queries, batch, heads * head_dim)
            heads = leaves[key].size(1)
            per_head = (z * g).sum(0).view(z.size(1), heads, -1).sum(-1)  # (batch, heads)
            torch.testing.assert_close(relevance[key][:, t], per_head.double(), rtol=1e-9, atol=1e-12)
        assert any(relevance[k][:, t].abs().max() > 1e-3 for k in keys)


def test_plain_gradient_times_input_does_not_conserve(stock64):
    """The check above can fail: through the softmax and LayerNorm's 1/std, plain gradient x input loses
    relevance."""
    model, task = stock64
    batch = sample_batch(task, n=5)
    with relevance_pass(model, batch, conservative=False) as (top, valid, leaves, inputs, _):
        _, worst = step_head_relevances(top, valid, leaves, inputs)
        assert worst > 1e-2


def test_capture_and_lrp_context_keep_outputs_and_match_fairseq_attention(stock):
    model, task = stock
    model = copy.deepcopy(model)
    batch = sample_batch(task, n=6)
    with torch.no_grad():
        logits, extra = model(**batch["net_input"])
        with conservative_propagation(model), capture_attention(model) as captured:
            logits2, extra2 = model(**batch["net_input"])
    torch.testing.assert_close(logits2, logits, rtol=1e-4, atol=1e-4)
    last = max(layer for t, layer in captured if t == "enc-dec")
    # fairseq's own output: the head average of the last layer's encoder-decoder attention
    torch.testing.assert_close(captured[("enc-dec", last)][0].mean(0), extra["attn"][0], rtol=1e-5, atol=1e-6)
    enc = captured[("enc-self", 1)][0]
    src = batch["net_input"]["src_tokens"]
    assert enc.shape == (8, 6, src.size(1), src.size(1))
    real = src.ne(1)
    torch.testing.assert_close(enc.sum(-1)[:, real], torch.ones_like(enc.sum(-1)[:, real]))
    assert float(enc.masked_fill(real[None, :, None, :], 0).abs().max()) == 0.0  # nothing on padding
    dec = captured[("dec-self", 1)][0]
    assert float(dec.triu(1).abs().max()) == 0.0  # causal
    for attn in [m for m in model.modules() if hasattr(m, "skip_embed_dim_check")]:
        assert attn.skip_embed_dim_check is False  # restored


def test_layer_shares_use_magnitudes():
    r = torch.tensor([[1.0, -1.0, 2.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(layer_shares(r), torch.tensor([[0.25, 0.25, 0.5, 0.0], [0.0, 0.0, 0.0, 0.0]]))


def test_positional_rare_and_confidence_on_constructed_attention():
    pad, eos = 1, 2
    src = torch.tensor([[pad, 10, 11, 12, 13, eos], [20, 21, 22, 23, 24, eos]])  # left-padded, as fairseq batches
    counts = torch.zeros(30)
    counts[10:14] = torch.tensor([50.0, 3.0, 40.0, 3.0])  # sentence 1: 11 and 13 tie for rarest
    counts[20:25] = torch.tensor([9.0, 8.0, 7.0, 1.0, 6.0])  # sentence 2: 23 is rarest
    n = src.size(1)
    prev = torch.zeros(n, n)
    for q in range(n):
        prev[q, max(q - 1, 0)] = 1.0
    rare = torch.zeros(2, n, n)
    rare[0, :, 2] = 1.0  # every query of sentence 1 looks at token 11
    rare[1, :, 3] = 1.0  # sentence 2: at token 23
    weights = torch.stack([prev.expand(2, n, n), rare])  # (heads, batch, q, k)
    out = hf.positional_rare_counts(weights, src, pad, eos, counts)
    assert out["queries"] == 9
    # head 1 looks at -1 from every query but sentence 2's first token (it looks at itself): 8 of 9
    assert out["prev"] == [8, 2] and out["next"] == [0, 2]  # head 2 is next to its target now and then
    assert out["rare"] == [2, 9]  # head 1 hits a rarest token only when the previous token is one
    real = src.ne(pad) & src.ne(eos)
    total, count = hf.confidence_sums(weights, real, real)
    assert count == 9 and total[1] == 9.0
    labels = hf.head_labels(8 / 9, 0.0, 2 / 9, {}, {})
    assert labels == [] and hf.head_labels(0.95, 0.0, 1.0, {}, {}) == ["positional -1", "rare"]


def test_word_attention_sums_to_words_and_averages_from_words():
    weights = torch.tensor([[[0.1, 0.2, 0.3, 0.4],
                             [0.3, 0.3, 0.3, 0.1],
                             [0.0, 0.5, 0.5, 0.0],
                             [0.25, 0.25, 0.25, 0.25]]])  # pieces 0-1 = word 0, piece 2 = word 1, piece 3 = EOS
    out = hf.word_attention(weights, [[0, 1], [2]])
    expected = torch.tensor([[[0.45, 0.3, 0.25], [0.5, 0.5, 0.0]]])
    torch.testing.assert_close(out, expected)


def test_conllu_parses_align_with_the_models_pieces(tmp_path, tiny_data, stock):
    """Hand-made parses of real test sentences: multiword tokens, dobj, and Moses' @-@ and escapes."""
    path = tmp_path / "test.conllu"
    path.write_text(conllu(PARSES), encoding="utf-8")
    parses = hf.read_conllu(str(path))
    assert [len(p.surface) for p in parses] == [11, 12, 12, 15, 7]
    assert parses[3].surface[8] == "im"
    relations = [a.relation for p in parses for a in p.arcs]
    assert {r: relations.count(r) for r in hf.RELATIONS} == ARCS
    _, task = stock
    src_dict = task.source_dictionary
    for sid, parse in enumerate(parses):
        tokens = task.dataset("test")[sid]["source"][:-1]
        pieces = [src_dict[i] for i in tokens.tolist()]
        groups = hf.align_surface_to_pieces(parse.surface, pieces)
        assert groups is not None and all(groups), (parse.surface, pieces)
        assert sorted(p for g in groups for p in g) == list(range(len(pieces)))  # every piece has its word
        # a head that looks from every piece to the first piece of its governor scores every dep->head arc
        n = len(pieces) + 1
        good = torch.zeros(1, n, n)
        for q in range(n):
            good[0, q, n - 1] = 1.0  # by default: EOS, a miss
        for arc in parse.arcs:
            for q in groups[arc.dependent]:
                good[0, q] = 0
                good[0, q, groups[arc.governor][0]] = 1.0
        hits, arcs = hf.syntactic_counts({1: hf.word_attention(good, groups)}, parse, groups)
        for name, entry in arcs.items():
            expected = entry["n"] if name.endswith("dep->head") else 0
            assert hits[1][name] == [expected], name
    # an English sentence is not the parse of a German one
    assert hf.align_surface_to_pieces(parses[0].surface, "A man in an orange hat".split()) is None


def test_conllu_errors_are_one_line(tmp_path):
    bad = tmp_path / "bad.conllu"
    bad.write_text("1\tEin\t_\n", encoding="utf-8")
    with pytest.raises(hf.UserError, match="not CoNLL-U"):
        hf.read_conllu(str(bad))


def analyze(data, checkpoint, out, *extra):
    return run(["fairseq-headprune", "analyze", data, "--path", checkpoint, "--gen-subset", "test",
                "--beam", "2", "--max-tokens", "150", "--results-dir", out, "--no-progress-bar", *extra])


def test_analyze_command_end_to_end_with_parses_and_resume(tmp_path, tiny_data, stock_checkpoint, monkeypatch):
    parses = tmp_path / "test.conllu"
    parses.write_text(conllu(PARSES), encoding="utf-8")
    args = ["--num-sentences", "5", "--source-parses", parses]
    proc = analyze(tiny_data, stock_checkpoint, tmp_path / "full", *args)
    assert "LRP conservation error" in proc.stdout
    result = json.loads((tmp_path / "full" / "heads_analysis.json").read_text())
    meta = result["meta"]
    assert meta["sentences"] == 5 and meta["lrp_conservation_max_relative_error"] < 1e-4
    assert meta["syntactic"]["sentences_aligned"] == 5 and meta["syntactic"]["sentences_not_aligned"] == 0
    relations = meta["syntactic"]["relations"]
    assert {name.split()[0]: r["arcs"] for name, r in relations.items()} == {k: v for k, v in ARCS.items() if v}
    assert relations["nsubj dep->head"]["arcs"] == 5
    shape = {"enc-self": (4, 8), "enc-dec": (3, 4), "dec-self": (3, 4)}
    for t, (layers, heads) in shape.items():
        assert len(result[t]) == layers and all(len(e["heads"]) == heads for e in result[t])
        for entry in result[t]:
            assert sum(h["relevance"] for h in entry["heads"]) == pytest.approx(1.0, abs=1e-6)
            assert all(0 < h["confidence"] <= 1 for h in entry["heads"])
    assert set(result["summary"]["enc-self"]["confidence_vs_relevance"]) >= {"spearman_r", "pearson_r"}
    head = result["enc-self"][0]["heads"][0]
    assert set(head["functions"]) == {"prev", "next", "rare", "syntactic"}
    assert set(head["functions"]["syntactic"]) == set(relations)
    for name in ("heads_analysis-enc-self.png", "heads_analysis-enc-dec.png", "heads_analysis-dec-self.png",
                 "head_functions.png"):
        assert (tmp_path / "full" / name).stat().st_size > 1000
    assert not (tmp_path / "full" / analysis.PARTIAL).exists()

    # killed after the first batch: the rerun resumes from the partial log and gives the same numbers
    calls = []
    real = analysis.analyse_batch

    def dies_after_one(*a, **kw):
        if calls:
            raise KeyboardInterrupt
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(analysis, "analyse_batch", dies_after_one)
    stopped = run(["fairseq-headprune", "analyze", tiny_data, "--path", stock_checkpoint, "--gen-subset", "test",
                   "--beam", "2", "--max-tokens", "150", "--results-dir", tmp_path / "resumed", "--no-progress-bar",
                   *args], check=False)  # Ctrl-C: one line, exit code 130
    assert stopped.returncode == 130 and "Traceback" not in stopped.stderr
    assert stopped.stderr.strip().splitlines()[-1].startswith("fairseq-headprune analyze: interrupted: ")
    rows = (tmp_path / "resumed" / analysis.PARTIAL).read_text().splitlines()
    assert len(rows) == 2  # header + one batch
    monkeypatch.setattr(analysis, "analyse_batch", real)
    analyze(tiny_data, stock_checkpoint, tmp_path / "resumed", *args)
    resumed = json.loads((tmp_path / "resumed" / "heads_analysis.json").read_text())
    for t in shape:
        assert _close(resumed[t], result[t]), t


def _close(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if isinstance(a, float):
        return a == pytest.approx(b, rel=1e-6, abs=1e-9)
    return a == b


def test_analyze_without_parses_says_syntax_was_skipped(tmp_path, tiny_data, stock_checkpoint):
    """Also: rare-token frequencies counted from a raw training text, tokenised and BPE'd as the model's input."""
    raw = SLICE / "train.de"
    proc = analyze(tiny_data, stock_checkpoint, tmp_path, "--num-sentences", "3", "--frequency-text", raw,
                   "--tokenizer", "moses", "--bpe", "subword_nmt", "--bpe-codes", tiny_data / "code", "-s", "de",
                   "-t", "en")
    assert "syntactic functions skipped" in proc.stdout
    result = json.loads((tmp_path / "heads_analysis.json").read_text())
    assert "skipped" in result["meta"]["syntactic"]
    assert result["meta"]["frequencies"].startswith(f"counts of {raw}")
    assert "syntactic" not in result["enc-self"][0]["heads"][0]["functions"]


@pytest.mark.parametrize("extra, message", [
    (["--num-sentences", "0"], "--num-sentences must be at least 1"),
    (["--source-parses", "/nonexistent.conllu"], "no such file"),
    (["--rare-threshold", "1.5"], "--rare-threshold must be in"),
])
def test_bad_input_is_one_line(tmp_path, tiny_data, stock_checkpoint, extra, message):
    proc = run(["fairseq-headprune", "analyze", tiny_data, "--path", stock_checkpoint, "--gen-subset", "test",
                "--results-dir", tmp_path, *extra], check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("fairseq-headprune analyze: error:")
    assert message in proc.stderr


def test_parses_of_another_set_are_refused(tmp_path, tiny_data, stock_checkpoint):
    parses = tmp_path / "p.conllu"
    parses.write_text(conllu(PARSES[:2]), encoding="utf-8")
    proc = run(["fairseq-headprune", "analyze", tiny_data, "--path", stock_checkpoint, "--gen-subset", "test",
                "--num-sentences", "5", "--source-parses", parses, "--results-dir", tmp_path], check=False)
    assert proc.returncode == 2 and "has 2 sentences but the subset has 200 (5 analysed)" in proc.stderr
