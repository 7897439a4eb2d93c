"""Sequence-level distillation data (Kim & Rush 2016): the teacher's beam translations of the training source,
written as a fairseq data folder whose training targets are those translations; and a distillation set: raw source
text beyond the parallel data (monolingual source, other domains), tokenised with the model's own tokenizer and
BPE, translated by the teacher (its n best beam hypotheses each a pair: data diversification), and added to the
training data as a further shard (`train1`), which fairseq-train reads together with `train`.

The translations are generated once with fairseq's own generator (task.build_generator, task.inference_step) and
cached in `DATA/../<name>.teacher-<hash>/`, keyed by the teacher's hash, the training data's fingerprint and the
decoding settings; each batch is appended (and fsync'ed) to `hypotheses.jsonl` as it is decoded, so a killed run
resumes where it stopped. The folder links every file of DATA but the training targets, which it rebuilds with
fairseq's indexed-dataset builder. Single-pair translation data (`train.SRC-TGT.TGT.bin`) only.
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
from typing import Dict, List

from fairseq_headprune.errors import UserError
from fairseq_headprune.records.identity import file_sha256
from fairseq_headprune.fairseq_io.loading import PACKAGE_DIR
from fairseq_headprune.records.log import atomic_output


def language_pair(data: str, subset: str):
    """(source, target) of single-pair translation data; refused in one line otherwise."""
    found = glob.glob(os.path.join(data, f"{subset}.*-*.*.idx"))
    pairs = sorted({os.path.basename(p).split(".")[1] for p in found})
    if len(pairs) != 1:
        raise UserError(f"--distill sequences needs single-pair translation data ({subset}.SRC-TGT.LANG.bin) in "
                        f"{data}; found {pairs or 'none'}")
    src, tgt = pairs[0].split("-")
    return src, tgt


def cache_key(teacher: str, data: str, subset: str, beam: int, max_len_a: float, max_len_b: int) -> str:
    src, tgt = language_pair(data, subset)
    parts = [file_sha256(teacher)] + [file_sha256(p) for p in sorted(glob.glob(os.path.join(
        data, f"{subset}.{src}-{tgt}.{src}.*")))] + [file_sha256(os.path.join(data, f"dict.{tgt}.txt")),
                                                    f"beam={beam} a={max_len_a} b={max_len_b}"]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]


def _read_done(path: str, field: str = "tokens") -> Dict[int, List]:
    done = {}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:  # the torn last line of a killed run
                    continue
                done[int(row["id"])] = row[field]
    return done


def teacher_targets_data(data: str, options, log=print) -> str:
    """The data folder whose training targets are the teacher's translations (built or resumed); its path."""
    subset = options.train_subset
    src, tgt = language_pair(data, subset)
    key = cache_key(options.teacher, data, subset, options.sequence_beam, options.sequence_max_len_a,
                    options.sequence_max_len_b)
    folder = os.path.join(os.path.dirname(os.path.abspath(data.rstrip("/"))),
                          f"{os.path.basename(data.rstrip('/'))}.teacher-{key}")
    target_prefix = os.path.join(folder, f"{subset}.{src}-{tgt}.{tgt}")
    if os.path.exists(target_prefix + ".idx"):
        return folder
    os.makedirs(folder, exist_ok=True)
    hyp_path = os.path.join(folder, "hypotheses.jsonl")
    done = _read_done(hyp_path)
    translate_missing(data, options, subset, src, tgt, done, hyp_path, log)
    done = _read_done(hyp_path)
    write_targets(data, folder, subset, src, tgt, done)
    log(f"teacher translations of {len(done)} '{subset}' sentences in {folder}")
    return folder


def translate_missing(data, options, subset, src, tgt, done, hyp_path, log, nbest: int = 1) -> None:
    """Decode the sentences not yet in `done` with the teacher, appending each batch to `hyp_path` (with
    nbest > 1, each sentence's n best hypotheses under "nbest")."""
    import torch
    from fairseq import checkpoint_utils, tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq import options as fairseq_options

    parser = fairseq_options.get_generation_parser(default_task="translation")
    args = fairseq_options.parse_args_and_arch(parser, input_args=[
        data, "--user-dir", PACKAGE_DIR, "--task", "translation", "-s", src, "-t", tgt, "--path", options.teacher,
        "--beam", str(options.sequence_beam), "--max-len-a", str(options.sequence_max_len_a),
        "--max-len-b", str(options.sequence_max_len_b), "--max-tokens", "4000", "--gen-subset", subset])
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    models, _ = checkpoint_utils.load_model_ensemble([options.teacher], task=task)
    model = models[0].eval()
    task.load_dataset(subset)
    dataset = task.dataset(subset)
    todo = [i for i in range(len(dataset)) if i not in done]
    if not todo:
        return
    log(f"decoding {len(todo)} of {len(dataset)} '{subset}' sentences with the teacher (beam {options.sequence_beam})")
    generator = task.build_generator([model], cfg.generation)
    itr = task.get_batch_iterator(dataset=dataset, max_tokens=4000, max_positions=utils.resolve_max_positions(
        task.max_positions(), model.max_positions()), required_batch_size_multiple=1,
        num_workers=0).next_epoch_itr(shuffle=False)
    todo_set = set(todo)
    eos = task.target_dictionary.eos()
    with open(hyp_path, "a", encoding="utf-8") as f:
        for sample in itr:
            ids = sample["id"].tolist()
            if not todo_set.intersection(ids):
                continue
            with torch.no_grad():
                hyps = task.inference_step(generator, [model], sample)
            for sid, hyp in zip(ids, hyps):
                best = [h["tokens"].tolist() for h in hyp[:nbest]]
                best = [t[:-1] if t and t[-1] == eos else t for t in best]
                row = {"id": sid, "tokens": best[0]}
                if nbest > 1:
                    row["nbest"] = best
                f.write(json.dumps(row) + "\n")
            f.flush()
            os.fsync(f.fileno())


def write_targets(data, folder, subset, src, tgt, done) -> None:
    """Link every file of `data` into `folder` except the subset's targets, written from `done` (atomically)."""
    import torch
    from fairseq.data import Dictionary, indexed_dataset

    for path in glob.glob(os.path.join(data, "*")):
        name = os.path.basename(path)
        if name.startswith(f"{subset}.{src}-{tgt}.{tgt}.") or not os.path.isfile(path):
            continue
        link = os.path.join(folder, name)
        if not os.path.lexists(link):
            os.symlink(os.path.abspath(path), link)
    dictionary = Dictionary.load(os.path.join(data, f"dict.{tgt}.txt"))
    source = indexed_dataset.make_dataset(os.path.join(data, f"{subset}.{src}-{tgt}.{src}"), impl="mmap")
    if len(done) != len(source):
        raise UserError(f"the teacher translated {len(done)} of {len(source)} '{subset}' sentences")
    prefix = os.path.join(folder, f"{subset}.{src}-{tgt}.{tgt}")
    tmp = prefix + ".tmp"
    builder = indexed_dataset.make_builder(tmp + ".bin", impl="mmap", vocab_size=len(dictionary))
    for i in range(len(source)):
        builder.add_item(torch.IntTensor(done[i] + [dictionary.eos()]))
    builder.finalize(tmp + ".idx")
    os.replace(tmp + ".bin", prefix + ".bin")
    os.replace(tmp + ".idx", prefix + ".idx")  # the .idx last: its presence means the folder is complete


# --------------------------------------------------------------------------------------------- the distillation set


def encode_source(lines: List[str], tokenizer, bpe, dictionary) -> List[List[int]]:
    """Raw sentences as the model reads them (fairseq-interactive's encode_fn: tokenizer, then BPE, then the
    source dictionary's ids, EOS appended); empty lines dropped."""
    out = []
    for line in lines:
        line = line.strip()
        if not line:
            continue
        if tokenizer is not None:
            line = tokenizer.encode(line)
        if bpe is not None:
            line = bpe.encode(line)
        out.append(dictionary.encode_line(line, add_if_not_exist=False, append_eos=True).long().tolist())
    return out


def unknown_share(rows: List[List[int]], unk: int) -> float:
    tokens = sum(len(r) - 1 for r in rows)
    return sum(r.count(unk) for r in rows) / max(tokens, 1)


MAX_UNKNOWN = 0.05  # more unknown source tokens than this: the text is not in the model's tokenisation


def next_shard(data: str, subset: str, src: str, tgt: str) -> str:
    """The name of the first free shard of `subset` (train1, train2, ...), which fairseq-train reads with it."""
    k = 1
    while os.path.exists(os.path.join(data, f"{subset}{k}.{src}-{tgt}.{src}.idx")):
        k += 1
    return f"{subset}{k}"


def _write_indexed(prefix: str, rows: List[List[int]], vocab_size: int) -> None:
    """A fairseq mmap indexed dataset written whole (the .idx last: its presence means complete)."""
    import torch
    from fairseq.data import indexed_dataset

    tmp = prefix + ".tmp"
    builder = indexed_dataset.make_builder(tmp + ".bin", impl="mmap", vocab_size=vocab_size)
    for row in rows:
        builder.add_item(torch.IntTensor(row))
    builder.finalize(tmp + ".idx")
    os.replace(tmp + ".bin", prefix + ".bin")
    os.replace(tmp + ".idx", prefix + ".idx")


def distillation_key(teacher: str, sources: List[str], base: str, subset: str, options, encoders: str) -> str:
    parts = [file_sha256(teacher)] + [file_sha256(p) for p in sources] + [
        file_sha256(p) for p in sorted(glob.glob(os.path.join(base, "dict.*.txt")))] + [
        f"beam={options.sequence_beam} a={options.sequence_max_len_a} b={options.sequence_max_len_b} "
        f"nbest={options.distillation.nbest} subset={subset} {encoders}"]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]


def _write_source(paths, encoders, source_dict, folder: str, prefix: str) -> None:
    """The --distill-source files encoded as the model reads them, written as one binarised subset (refused in one
    line when too many of their tokens are unknown to the dictionary)."""
    tokenizer, bpe, described = encoders
    lines = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            lines += f.read().splitlines()
    rows = encode_source(lines, tokenizer, bpe, source_dict)
    share = unknown_share(rows, source_dict.unk())
    if share > MAX_UNKNOWN:  # refused before anything is written
        raise UserError(f"--distill-source: {share:.0%} of its tokens are unknown to the model's dictionary: "
                        f"give the model's --tokenizer and --bpe (now: {described})")
    os.makedirs(folder, exist_ok=True)
    _write_indexed(prefix, rows, len(source_dict))


def distillation_set_data(base: str, options, encoders, log=print) -> Dict:
    """The data folder holding `base` (linked) and the distillation set: options.distillation.source translated by the
    teacher, its n best hypotheses each a pair, as the next shard of the training subset. Built once and cached
    beside `base` (keyed by the teacher, the source files, the dictionaries, the decoding and the encoders);
    resumable. `encoders`: (tokenizer, bpe, description). Returns {"data": folder, "shard", "pairs", ...}."""
    from fairseq.data import Dictionary

    described = encoders[2]
    subset = options.train_subset
    src, tgt = language_pair(base, subset)
    key = distillation_key(options.teacher, options.distillation.source, base, subset, options, described)
    folder = os.path.join(os.path.dirname(os.path.abspath(base.rstrip("/"))),
                          f"{os.path.basename(base.rstrip('/'))}.distill-{key}")
    shard = next_shard(base, subset, src, tgt)
    info_path = os.path.join(folder, "distillation-set.json")
    if os.path.exists(os.path.join(folder, f"{shard}.{src}-{tgt}.{tgt}.idx")) and os.path.exists(info_path):
        with open(info_path, encoding="utf-8") as f:
            return {**json.load(f), "data": folder}
    source_dict = Dictionary.load(os.path.join(base, f"dict.{src}.txt"))
    target_dict = Dictionary.load(os.path.join(base, f"dict.{tgt}.txt"))
    source_prefix = os.path.join(folder, f"distill.{src}-{tgt}.{src}")
    if not os.path.exists(source_prefix + ".idx"):
        _write_source(options.distillation.source, encoders, source_dict, folder, source_prefix)
    for path in glob.glob(os.path.join(base, "*")):
        link = os.path.join(folder, os.path.basename(path))
        if os.path.isfile(path) and not os.path.lexists(link):
            os.symlink(os.path.realpath(path), link)
    hyp_path = os.path.join(folder, "hypotheses.jsonl")
    field = "nbest" if options.distillation.nbest > 1 else "tokens"
    translate_missing(folder, options, "distill", src, tgt, _read_done(hyp_path, field), hyp_path, log,
                      nbest=options.distillation.nbest)
    done = _read_done(hyp_path, field)
    from fairseq.data import indexed_dataset

    source = indexed_dataset.make_dataset(source_prefix, impl="mmap")
    if len(done) != len(source):
        raise UserError(f"the teacher translated {len(done)} of {len(source)} --distill-source sentences")
    pairs_src, pairs_tgt = [], []
    for i in range(len(source)):
        for hyp in (done[i] if options.distillation.nbest > 1 else [done[i]]):
            pairs_src.append(source[i].tolist())
            pairs_tgt.append(list(hyp) + [target_dict.eos()])
    _write_indexed(os.path.join(folder, f"{shard}.{src}-{tgt}.{src}"), pairs_src, len(source_dict))
    _write_indexed(os.path.join(folder, f"{shard}.{src}-{tgt}.{tgt}"), pairs_tgt, len(target_dict))
    info = {"shard": shard, "sources": len(source), "pairs": len(pairs_src), "nbest": options.distillation.nbest,
            "encoders": described, "unknown_share": round(unknown_share(
                [source[i].tolist() for i in range(len(source))], source_dict.unk()), 4)}
    with atomic_output(info_path) as f:
        json.dump(info, f)
    log(f"distillation set: {len(source)} source sentences, {len(pairs_src)} pairs (the teacher's "
        f"{options.distillation.nbest} best each) as '{shard}' beside '{subset}' in {folder}")
    return {**info, "data": folder}
