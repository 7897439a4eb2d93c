"""Every fairseq option that reaches a study is applied as fairseq-generate applies it or refused in one line
(fairseq_headprune/fairseq_io/fairseq_options.py): the table classifies every field of fairseq's configs, each
refused option is refused before any work, and each option that changes hypotheses gives fairseq-generate's own
hypotheses."""
import dataclasses

import pytest

from conftest import run, stock_run
from fairseq_headprune.fairseq_io import fairseq_options as fo

# one command line per refused option (the test fails on a refused option without one)
REFUSED_CASES = {
    "replace_unk": ["--replace-unk"], "score_reference": ["--score-reference"], "prefix_size": ["--prefix-size", "1"],
    "sampling": ["--sampling"], "sampling_topk": ["--sampling-topk", "5"], "sampling_topp": ["--sampling-topp", "0.9"],
    "constraints": ["--constraints"], "diverse_beam_groups": ["--diverse-beam-groups", "2"],
    "diversity_rate": ["--diversity-rate", "0.5"], "print_alignment": ["--print-alignment"],
    "lm_path": ["--lm-path", "lm.pt"], "retain_dropout": ["--retain-dropout"], "fp16": ["--fp16"],
    "memory_efficient_fp16": ["--memory-efficient-fp16"], "bf16": ["--bf16"],
    "memory_efficient_bf16": ["--memory-efficient-bf16"], "tpu": ["--tpu"],
    "model_parallel_size": ["--model-parallel-size", "2"], "results_path": ["--results-path", "out"],
    "checkpoint_suffix": ["--checkpoint-suffix", "-shard0"],
    "checkpoint_shard_count": ["--checkpoint-shard-count", "2"],
    "mask_heads": ["--mask-heads", "enc-self:1:1"],
    "no_repeat_ngram_size": ["--no-repeat-ngram-size", "2"], "scoring": ["--scoring", "chrf"],
}
# per option that changes hypotheses: (the option, the context it is tested in), compared with fairseq-generate's
# own output and with the context alone (the option must change a hypothesis of the tiny model there)
DECODE_CASES = {
    "beam": (["--beam", "4"], []), "max_len_a": (["--max-len-a", "0.1"], ["--max-len-b", "2"]),
    "max_len_b": (["--max-len-b", "3"], []), "min_len": (["--min-len", "12"], []),
    "match_source_len": (["--match-source-len"], []), "unnormalized": (["--unnormalized"], ["--lenpen", "3"]),
    "lenpen": (["--lenpen", "5"], []), "unkpen": (["--unkpen", "-30"], []),
    "temperature": (["--temperature", "8"], []),
    "truncate_source": (["--truncate-source", "--max-source-positions", "6"], []),
    "max_source_positions": (["--truncate-source", "--max-source-positions", "6"], []),
}
BASE = ["--gen-subset", "test", "--beam", "2", "--max-tokens", "400"]


def test_every_field_is_classified_and_every_refusal_and_decode_option_is_tested(tiny_data):
    """A new fairseq option (or one of this package's task) fails here until it is classified; a refused option
    without a refusal case, or an option that changes hypotheses without a comparison with fairseq-generate, too."""
    from fairseq_headprune import cli
    from fairseq_headprune.cli import score

    cfg, _ = cli.parse("score", score, [str(tiny_data), "--path", "unused.pt", "--results-dir", "unused"])
    sections = dict(fo.section_dataclasses(cfg))
    assert set(sections) == set(fo.RULES)
    refused, decode = {"scoring"}, set()
    for section, dataclass in sections.items():
        names = {f.name for f in dataclasses.fields(dataclass) if f.name != "_name"}
        mirrors = {f.name for f in dataclasses.fields(dataclass)
                   if isinstance(f.default, str) and f.default.startswith("${")}
        unknown = names - mirrors - set(fo.RULES[section])
        assert not unknown, f"{section} options neither applied, inert nor refused: {sorted(unknown)}"
        assert set(fo.RULES[section]) <= names, f"RULES[{section}] names options fairseq does not have"
        for name in names - mirrors:
            rule = fo.RULES[section][name]
            if rule == fo.DECODE:
                decode.add(name)
            elif rule not in (fo.SAME_CALL, fo.INERT):
                refused.add(name)
    assert refused == set(REFUSED_CASES), "every refused option needs a refusal case"
    assert decode == set(DECODE_CASES), "every option that changes hypotheses needs a fairseq-generate comparison"


@pytest.mark.parametrize("name", sorted(REFUSED_CASES))
def test_refused_options_are_one_line_before_any_work(tiny_slice, tmp_path, name):
    """A missing checkpoint would be the next error: the refusal comes before loading anything."""
    argv = REFUSED_CASES[name]
    proc = run(["fairseq-headprune", "ablate", tiny_slice, "--path", tmp_path / "missing.pt", "--results-dir",
                tmp_path / "out", *BASE, *argv], check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("fairseq-headprune ablate: error: ") and argv[0] in last, last
    assert not (tmp_path / "out").exists()


def _generate(data, checkpoint, extra):
    out = stock_run(["fairseq-generate", data, "--path", checkpoint, *BASE, "--required-batch-size-multiple", "1",
                     *extra]).stdout
    hyps = {}
    for line in out.splitlines():
        if line.startswith("D-"):
            sid, _score, text = line.split("\t")
            hyps[int(sid[2:])] = text
    return [hyps[i] for i in sorted(hyps)]


def _ours(data, checkpoint, extra):
    from fairseq_headprune import cli
    from fairseq_headprune.cli import ablate
    from fairseq_headprune.decoding.evaluate import SubsetEvaluator
    from fairseq_headprune.fairseq_io.loading import load

    cfg, _ = cli.parse("ablate", ablate, [str(data), "--path", str(checkpoint), "--results-dir", "unused", *BASE,
                                          *extra])
    evaluator = SubsetEvaluator(load(cfg), "test")
    return evaluator.translate(), evaluator.translate_many([[]], masks_per_batch=2)[0]


@pytest.mark.parametrize("option, context", sorted({(tuple(o), tuple(c)) for o, c in DECODE_CASES.values()}))
def test_options_that_change_hypotheses_give_fairseq_generates_own(tiny_slice, stock_checkpoint, option, context):
    """Hypotheses equal to fairseq-generate's under the option (one mask at a time and masks sharing beams), and
    different from those without it: the option took effect."""
    theirs = _generate(tiny_slice, stock_checkpoint, [*context, *option])
    assert len(theirs) == 48
    one, shared = _ours(tiny_slice, stock_checkpoint, [*context, *option])
    assert one == theirs and shared == theirs
    assert theirs != _generate(tiny_slice, stock_checkpoint, list(context)), f"{option} changed nothing here"


def test_fairseqs_cpu_ngram_blocker_blocks_nothing_which_is_why_the_option_is_refused():
    """fairseq 0.12 compares the n-gram at the padded end of the token buffer: after '5 6 5' a correct blocker bans
    6 (the bigram '5 6' again); fairseq's bans nothing. When a fairseq release fixes it, this fails: apply it then."""
    import torch
    from fairseq.ngram_repeat_block import NGramRepeatBlock

    tokens = torch.tensor([[2, 5, 6, 5, 1, 1, 1, 1]])  # step 3 of a buffer padded (1) beyond it, as the generator has
    lprobs = torch.zeros(1, 10)
    blocked = NGramRepeatBlock(2, use_extension=False)(tokens, lprobs.clone(), 1, 1, 3)
    assert torch.equal(blocked, lprobs)
