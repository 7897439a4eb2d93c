"""Voita et al.'s Hard Concrete head gates: the distribution, the gated model, L0 fine-tuning and the export."""
import copy
import json
import math

import pytest
import torch

from conftest import TINY_ARCH, build_key, cached_build, copy_cached, package_key, run, run_fairseq, stock_key
from fairseq_headprune import cli
from fairseq_headprune.core.gates import (
    HeadGate,
    deterministic_gates,
    fold_gates_into_state_dict,
    log_alphas_from_state_dict,
    prob_open,
    sample_gates,
)
from fairseq_headprune.core.heads import Head, parse_head_spec
from fairseq_headprune.core.masking import head_gates, install_head_gates, install_head_masks, set_head_masks
from helpers import load_stock, sample_batch, teacher_forced_logits

LOG11 = math.log(11)


@pytest.mark.parametrize("temperature", [0.33, 2 / 3])
def test_samples_lie_in_unit_interval_with_exact_zeros_and_ones(temperature):
    g = torch.Generator().manual_seed(0)
    log_alpha = torch.tensor([-1.0, 0.0, 1.0]).repeat(20000)
    s = sample_gates(log_alpha, temperature, generator=g)
    assert s.min() >= 0 and s.max() <= 1
    assert (s == 0).any() and (s == 1).any()
    assert ((s > 0) & (s < 1)).any()


@pytest.mark.parametrize("temperature", [0.33, 2 / 3])
def test_expected_l0_matches_monte_carlo(temperature):
    g = torch.Generator().manual_seed(1)
    log_alpha = torch.tensor([-3.0, -1.0, 0.0, 0.5, 2.5])
    n = 100_000
    samples = sample_gates(log_alpha.repeat(n, 1), temperature, generator=g)
    empirical = (samples != 0).double().mean(0)
    expected = prob_open(log_alpha, temperature).double()
    stderr = (expected * (1 - expected) / n).sqrt()
    assert ((empirical - expected).abs() <= 5 * stderr + 1e-4).all(), (empirical, expected)
    gate = HeadGate(5, temperature)
    with torch.no_grad():
        gate.theta.copy_(log_alpha)
    assert torch.isclose(gate.expected_l0(), expected.sum().float())


def test_sample_gradient_reaches_log_alpha():
    log_alpha = torch.zeros(64, requires_grad=True)
    sample_gates(log_alpha, 0.33, generator=torch.Generator().manual_seed(2)).sum().backward()
    assert log_alpha.grad is not None and (log_alpha.grad > 0).any()
    la = torch.zeros(3, requires_grad=True)
    prob_open(la).sum().backward()
    assert (la.grad > 0).all()


def test_eval_gates_are_deterministic_with_exact_ends():
    gate = HeadGate(4, init_log_alpha=0.0, lr_scale=10.0)
    with torch.no_grad():
        gate.theta.copy_(torch.tensor([-LOG11 - 1e-3, -1.0, 1.0, LOG11 + 1e-3]) / 10.0)
    gate.eval()
    first = gate()
    assert torch.equal(first, gate())
    assert first[0] == 0 and first[3] == 1 and 0 < first[1] < first[2] < 1
    torch.testing.assert_close(first, deterministic_gates(gate.log_alpha))
    gate.train()
    draws = {tuple(gate().tolist()) for _ in range(50)}
    assert len(draws) > 1


def test_lr_scale_is_a_learning_rate_multiplier_for_adam():
    """log α = s θ: one Adam step moves log α s times as far as with the plain parametrisation."""
    moves = []
    for s in (1.0, 20.0):
        gate = HeadGate(3, init_log_alpha=1.0, lr_scale=s)
        opt = torch.optim.Adam(gate.parameters(), lr=1e-3)
        gate.expected_l0().backward()
        opt.step()
        moves.append(float((gate.log_alpha - 1.0).abs().mean()))
    assert moves[1] == pytest.approx(20 * moves[0], rel=1e-3)


@pytest.fixture(scope="module")
def stock(stock_checkpoint, tiny_data):
    return load_stock(stock_checkpoint, tiny_data)


def test_state_dicts_load_both_ways(stock):
    model, _ = stock
    gated = copy.deepcopy(model)
    install_head_gates(gated, ["enc-self", "dec-self"], init_log_alpha=3.0)
    gated.load_state_dict(model.state_dict(), strict=True)  # stock into gated: gates keep their initial value
    assert {k[0] for k in head_gates(gated)} == {"enc-self", "dec-self"}
    assert all(torch.allclose(g.log_alpha, torch.tensor(3.0)) for g in head_gates(gated).values())
    with torch.no_grad():
        head_gates(gated)[("enc-self", 2)].theta.fill_(-4.0)
    plain = copy.deepcopy(model)
    install_head_masks(plain)
    plain.load_state_dict(gated.state_dict(), strict=True)  # gated into ungated: the gates are created
    assert set(head_gates(plain)) == set(head_gates(gated))
    assert torch.equal(head_gates(plain)[("enc-self", 2)].theta, torch.full((8,), -4.0))


def test_closed_gates_as_masks_equal_the_gated_model_when_open_gates_are_one(stock):
    model, task = stock
    batch = sample_batch(task)
    gated = copy.deepcopy(model)
    install_head_gates(gated, ["enc-self", "enc-dec", "dec-self"])
    closed = [Head("enc-self", 1, 2), Head("enc-self", 4, 8), Head("enc-dec", 3, 1), Head("dec-self", 2, 3)]
    with torch.no_grad():
        for (t, layer), g in head_gates(gated).items():
            g.theta.fill_(5.0)
            for h in closed:
                if (h.type, h.layer) == (t, layer):
                    g.theta[h.head - 1] = -5.0
    gated.eval()
    masked = copy.deepcopy(model)
    install_head_masks(masked)
    set_head_masks(masked, closed)
    # the gated model takes fairseq's Python path everywhere, the masked one the fused path in unmasked layers
    torch.testing.assert_close(teacher_forced_logits(gated, batch), teacher_forced_logits(masked, batch),
                               atol=1e-5, rtol=0)
    assert not torch.allclose(teacher_forced_logits(model, batch), teacher_forced_logits(masked, batch), atol=1e-3)


def test_folded_state_dict_equals_gated_model_with_fractional_gates(stock):
    model, task = stock
    batch = sample_batch(task)
    gated = copy.deepcopy(model)
    install_head_gates(gated, ["enc-self", "enc-dec", "dec-self"])
    with torch.no_grad():
        for g in head_gates(gated).values():
            g.theta.copy_(torch.linspace(-4.0, 4.0, g.theta.numel()))  # closed, fractional and open gates
    gated.eval()
    folded = copy.deepcopy(model)
    folded.load_state_dict(fold_gates_into_state_dict(gated.state_dict()), strict=True)
    torch.testing.assert_close(teacher_forced_logits(folded, batch), teacher_forced_logits(gated, batch),
                               atol=1e-5, rtol=0)


def finetune(data, stock_checkpoint, save_dir, l0_lambda, types, start="--finetune-from-model", updates=25):
    resets = ["--reset-optimizer", "--reset-dataloader", "--reset-lr-scheduler", "--reset-meters"]
    return run_fairseq(["fairseq-train", data, *TINY_ARCH, "--user-dir", cli.PACKAGE_DIR,
                        "--task", "translation_headprune", "--gated-types", types, "--gate-lr-scale", "300",
                        "--criterion", "label_smoothed_cross_entropy_l0", "--label-smoothing", "0.1",
                        "--l0-lambda", l0_lambda, "--optimizer", "adam", "--lr", "1e-3", "--lr-scheduler", "fixed",
                        start, stock_checkpoint, *(resets if start == "--restore-file" else []),
                        "--max-tokens", "1500", "--max-update", updates, "--save-dir", save_dir,
                        "--no-epoch-checkpoints", "--no-save-optimizer-state", "--seed", "3", "--num-workers", "0",
                        "--log-format", "simple", "--log-interval", "5", "--disable-validation"])


@pytest.fixture(scope="module")
def l0_runs(tiny_data, stock_checkpoint, tmp_path_factory):
    """Two short fine-tunings from the stock checkpoint, started both ways fairseq offers: no penalty on every
    head (--restore-file with resets), and on the encoder-side attentions a penalty large enough to close gates
    (--finetune-from-model; the tiny model, barely trained, may give up all of those: dec-self stays ungated so
    that the closed heads can still be removed). Built once per version of this package's code and of the stock
    model (conftest.cached_build keyed on package_key)."""
    runs = (("0", "enc-self,enc-dec,dec-self", "--restore-file"), ("2", "enc-self,enc-dec", "--finetune-from-model"))

    def build(out):
        for lam, types, start in runs:
            finetune(tiny_data, stock_checkpoint, out / f"l0-{lam}", lam, types, start)

    key = stock_key() + build_key(finetune, run_fairseq) + package_key()
    folder = copy_cached(cached_build("l0-runs", key, build, keep_others=True), tmp_path_factory.mktemp("l0"))
    return {lam: folder / f"l0-{lam}" / "checkpoint_last.pt" for lam, _, _ in runs}


def _log_alphas(checkpoint):
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    return log_alphas_from_state_dict(state["model"])


def test_l0_finetuning_moves_log_alpha_and_a_large_lambda_closes_gates(l0_runs):
    free, penalised = _log_alphas(l0_runs["0"]), _log_alphas(l0_runs["2"])
    assert len(free) == 4 + 3 + 3 and len(penalised) == 4 + 3
    start = torch.tensor(2.5)
    assert all(not torch.allclose(v, start) for v in free.values()), "log alpha must be trained"
    mean_free = torch.cat([v for k, v in free.items() if k[0] != "dec-self"]).mean()
    mean_penalised = torch.cat(list(penalised.values())).mean()
    assert mean_penalised < mean_free - 1.0
    closed = sum(int((deterministic_gates(v) == 0).sum()) for v in penalised.values())
    assert closed > 0
    assert sum(int((deterministic_gates(v) == 0).sum()) for v in free.values()) < closed


def test_gates_command_exports_closed_heads_and_a_folded_checkpoint(l0_runs, tiny_data, tmp_path, stock):
    ckpt = l0_runs["2"]
    folded = tmp_path / "folded.pt"
    out = run(["fairseq-headprune", "gates", ckpt, "--results-dir", tmp_path / "res", "--fold-out", folded]).stdout
    summary = json.loads((tmp_path / "res" / "gates.json").read_text())
    assert summary["l0_lambda"] == 2.0 and summary["updates"] == 25 and summary["total"] == 44
    closed = parse_head_spec(f"@{tmp_path / 'res' / 'closed-heads.json'}")
    assert len(closed) == summary["closed"] == summary["total"] - summary["kept"] > 0
    assert f"{summary['kept']} of 44 gated heads kept" in out
    assert "| enc-self |" in (tmp_path / "res" / "kept-heads.md").read_text()
    # the folded stock checkpoint computes what the gated checkpoint computes in eval mode
    gated_model, task = load_stock(ckpt, tiny_data)
    assert head_gates(gated_model), "a gated checkpoint loads with its gates"
    folded_model, _ = load_stock(folded, tiny_data)
    assert not head_gates(folded_model)
    batch = sample_batch(task)
    torch.testing.assert_close(teacher_forced_logits(folded_model, batch), teacher_forced_logits(gated_model, batch),
                               atol=1e-5, rtol=0)
    # remove refuses the gated checkpoint itself (surgery does not slice gates) and says to fold first
    proc = run(["fairseq-headprune", "remove", tiny_data, "--path", ckpt, "--gen-subset", "test",
                "--heads", f"@{tmp_path / 'res' / 'closed-heads.json'}", "--out", tmp_path / "no.pt"], check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "--fold-out" in proc.stderr
    assert not (tmp_path / "no.pt").exists()
    # and the closed heads can be removed physically from it (remove checks pruned == masked before saving)
    pruned = tmp_path / "pruned.pt"
    run(["fairseq-headprune", "remove", tiny_data, "--path", folded, "--gen-subset", "test",
         "--heads", f"@{tmp_path / 'res' / 'closed-heads.json'}", "--out", pruned])
    pruned_model, _ = load_stock(pruned, tiny_data)
    torch.testing.assert_close(teacher_forced_logits(pruned_model, batch), teacher_forced_logits(gated_model, batch),
                               atol=1e-4, rtol=0)


def test_gated_checkpoint_decodes_with_fairseq_generate(l0_runs, tiny_data):
    proc = run_fairseq(["fairseq-generate", tiny_data, "--path", l0_runs["2"], "--user-dir", cli.PACKAGE_DIR,
                        "--task", "translation_headprune", "--gen-subset", "test", "--beam", "2",
                        "--max-tokens", "3000"])
    assert sum(line.startswith("H-") for line in proc.stdout.splitlines()) > 0


def test_the_half_question_counts_the_gated_heads():
    from fairseq_headprune.studies.compare import claim

    def run(kept_enc, bleu, method="l0"):
        closed = ",".join(f"enc-self:{layer}:1-8" for layer in range(1, 7 - kept_enc // 8))
        return {"method": method, "types": ["enc-self"], "heads_kept": 96 + kept_enc, "bleu": bleu,
                "kept_per_type": {"enc-self": kept_enc, "enc-dec": 48, "dec-self": 48}, "masked": closed}

    # encoder self-attention gated alone: 16 of 48 kept is more than half pruned (of all 144, 112 are kept)
    rows = [{"key": "baseline", "method": "unpruned", "heads_kept": 144, "bleu": 30.0}, run(48, 30.1), run(16, 29.8)]
    text = claim(rows, 144, 30.0)
    assert "More than half of the gated heads (enc-self) pruned (at most 23 of 48 kept)" in text
    assert "L0 gates: **yes**: 16 of the 48 kept, BLEU 29.80 (-0.20)" in text
    assert "Michel I_h: no run pruned more than half of the gated heads (enc-self): not tested" in text
    rows[-1]["bleu"] = 29.7
    assert "L0 gates: **no**: the best run below half (16 of the 48 kept)" in claim(rows, 144, 30.0)


def test_user_errors_are_one_line(stock_checkpoint, tiny_data, tmp_path):
    proc = run(["fairseq-headprune", "gates", stock_checkpoint, "--results-dir", tmp_path], check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().endswith("the checkpoint has no head gates (was it fine-tuned with --gated-types?)")
    proc = run(["fairseq-headprune", "gates", tmp_path / "missing.pt", "--results-dir", tmp_path], check=False)
    assert proc.returncode == 2 and "checkpoint not found" in proc.stderr
    proc = run(["fairseq-train", tiny_data, *TINY_ARCH, "--user-dir", cli.PACKAGE_DIR, "--task",
                "translation_headprune", "--gated-types", "enc-self,cross", "--max-update", "1", "--max-tokens", "1500",
                "--save-dir", tmp_path / "x", "--disable-validation"], check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: --gated-types: unknown attention type 'cross' (use enc-self, enc-dec, dec-self)")


def test_compare_l0_and_michel_at_equal_heads_kept(l0_runs, tiny_data, stock_checkpoint, tmp_path):
    run(["fairseq-headprune", "score", tiny_data, "--path", stock_checkpoint, "--gen-subset", "valid",
         "--results-dir", tmp_path])
    cmd = ["fairseq-headprune", "compare", tiny_data, "--path", stock_checkpoint, "--gen-subset", "test",
           "--beam", "2", "--max-tokens", "3000", "--importance", tmp_path / "importance.json",
           "--gated", l0_runs["2"], l0_runs["0"], "--results-dir", tmp_path]
    run(cmd)
    rows = [json.loads(line) for line in (tmp_path / "compare.jsonl").read_text().splitlines()]
    by_method = {}
    for r in rows[1:]:
        by_method.setdefault(r["method"], []).append(r)
    assert len(by_method["unpruned"]) == 1 and len(by_method["l0"]) == 2
    for r in by_method["l0"]:
        michel = next(m for m in rows[1:] if m["key"] == r["michel_key"])
        assert michel["heads_kept"] == r["heads_kept"]  # the same number of heads, of the same types
        assert michel["types"] == r["types"]
        assert 0 <= r["bleu"] <= 100
    penalised = next(r for r in by_method["l0"] if r["l0_lambda"] == 2.0)
    assert penalised["types"] == ["enc-self", "enc-dec"] and penalised["kept_per_type"]["dec-self"] == 12
    md = (tmp_path / "compare.md").read_text()
    assert "| 2.0 | 25 |" in md and "no fine-tuning" in md
    # the question is asked of the heads the runs gated: here, together, all 56
    assert "More than half of the heads pruned (at most 27 of 56 kept)" in md
    assert (tmp_path / "compare.png").stat().st_size > 0
    again = run(cmd).stdout  # resumes: nothing is decoded again
    assert "BLEU" not in again.split("wrote")[0]
    assert len((tmp_path / "compare.jsonl").read_text().splitlines()) == len(rows)
    bad = run([*cmd[:-5], "--gated", stock_checkpoint, "--results-dir", tmp_path / "bad"], check=False)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.strip().endswith(f"--gated {stock_checkpoint}: the checkpoint has no head gates "
                                       "(was it fine-tuned with --gated-types?)")
