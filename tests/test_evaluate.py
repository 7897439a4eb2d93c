"""The evaluator every command scores with, against stock fairseq-generate on the tiny model: every sentence gets
a hypothesis and a reference, and BLEU is sacreBLEU's on fairseq-generate's own detokenised output (D- and T-
lines) under --remove-bpe, under --bpe subword_nmt --tokenizer moses, and against raw --references. A subset
whose batches miss a sentence is refused."""
import pytest
import sacrebleu

from conftest import SLICE, stock_run
from fairseq_headprune.errors import UserError
from fairseq_headprune.decoding.evaluate import SubsetEvaluator
from fairseq_headprune.fairseq_io.loading import load

# several batches (the last one smaller): a lost batch would lose sentences
DECODE = ["--gen-subset", "test", "--beam", "2", "--max-tokens", "600", "--max-len-b", "40"]
MOSES = ["--bpe", "subword_nmt", "--tokenizer", "moses", "-s", "de", "-t", "en"]


def fairseq_generate(data, checkpoint, *extra):
    """Stock fairseq-generate (no user module; recorded once, conftest.stock_run): the detokenised hypotheses and
    references of its D- and T- lines. --required-batch-size-multiple 1, or fairseq 0.12 drops the remainder."""
    out = stock_run(["fairseq-generate", data, "--path", checkpoint, *DECODE, "--required-batch-size-multiple", "1",
                     *extra]).stdout
    hyps, refs = {}, {}
    for line in out.splitlines():
        if line.startswith("D-"):
            sid, _score, text = line.split("\t")
            hyps[int(sid[2:])] = text
        elif line.startswith("T-"):
            sid, text = line.split("\t")
            refs[int(sid[2:])] = text
    assert hyps.keys() == refs.keys()
    return [hyps[i] for i in sorted(hyps)], [refs[i] for i in sorted(refs)]


def evaluator(data, checkpoint, *extra, references=None):
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    parser = options.get_generation_parser(default_task="translation_headprune")
    args = options.parse_args_and_arch(parser, input_args=[str(data), "--path", str(checkpoint), *DECODE,
                                                           *[str(x) for x in extra]])
    return SubsetEvaluator(load(convert_namespace_to_omegaconf(args)), "test", references)


def check_against_generate(ev, hyps, refs, expected_refs=None):
    n = len(ev.dataset)
    assert n == 200 and len(ev.samples) >= 3  # the whole test set, over several batches
    assert sum(s["id"].numel() for s in ev.samples) == n
    ours = ev.translate()
    assert len(ours) == len(ev.references) == n
    assert all(h.strip() for h in ours) and all(r.strip() for r in ev.references)  # none left empty
    assert len(hyps) == n  # fairseq-generate translated every sentence too
    assert ours == hyps
    assert ev.references == (refs if expected_refs is None else expected_refs)
    expected = sacrebleu.corpus_bleu(hyps, [refs if expected_refs is None else expected_refs])
    assert ev.bleu(ours).score == pytest.approx(expected.score, abs=1e-9)
    assert expected.score > 0  # the tiny model translates something
    return ours


def test_remove_bpe(tiny_data, stock_checkpoint):
    hyps, refs = fairseq_generate(tiny_data, stock_checkpoint, "--remove-bpe")
    assert not any("@@" in h for h in hyps)
    check_against_generate(evaluator(tiny_data, stock_checkpoint, "--remove-bpe"), hyps, refs)


@pytest.fixture(scope="module")
def moses_generate(tiny_data, stock_checkpoint):
    return fairseq_generate(tiny_data, stock_checkpoint, *MOSES, "--bpe-codes", tiny_data / "code")


def test_subword_nmt_and_moses(tiny_data, stock_checkpoint, moses_generate):
    hyps, refs = moses_generate
    ev = evaluator(tiny_data, stock_checkpoint, *MOSES, "--bpe-codes", tiny_data / "code")
    ours = check_against_generate(ev, hyps, refs)
    # detokenised: BPE joined and Moses' spaces before punctuation removed
    assert not any("@@" in h for h in ours)
    assert any(r.endswith(".") and not r.endswith(" .") for r in ev.references)


def test_raw_references(tiny_data, stock_checkpoint, moses_generate):
    hyps, refs = moses_generate
    raw = (SLICE / "test.en").read_text(encoding="utf-8").splitlines()
    ev = evaluator(tiny_data, stock_checkpoint, *MOSES, "--bpe-codes", tiny_data / "code",
                   references=str(SLICE / "test.en"))
    assert ev.reference_source == str(SLICE / "test.en")
    check_against_generate(ev, hyps, refs, expected_refs=raw)
    # a reference file of another length is refused in one line
    short = SLICE.parent / "missing-refs.en"
    with pytest.raises(UserError, match="cannot read references"):
        evaluator(tiny_data, stock_checkpoint, "--remove-bpe", references=str(short))


def test_reference_file_of_another_length_is_refused(tiny_data, stock_checkpoint, tmp_path):
    refs = tmp_path / "refs.en"
    refs.write_text("\n".join((SLICE / "test.en").read_text(encoding="utf-8").splitlines()[:-1]) + "\n")
    with pytest.raises(UserError, match="have 199 lines but subset 'test' has 200"):
        evaluator(tiny_data, stock_checkpoint, "--remove-bpe", references=str(refs))


def test_a_subset_whose_batches_miss_sentences_is_refused(tiny_data, stock_checkpoint):
    """Sentences longer than the positions allowed are skipped by fairseq's batching: never a score of part of
    the set."""
    with pytest.raises(UserError, match=r"fairseq batched \d+ of the 200 sentences of 'test'"):
        evaluator(tiny_data, stock_checkpoint, "--remove-bpe", "--skip-invalid-size-inputs-valid-test",
                  "--max-source-positions", "12")
