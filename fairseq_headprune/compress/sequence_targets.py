"""Sequence-level distillation data (Kim & Rush 2016): the teacher's beam translations of the training source,
written as a fairseq data folder whose training targets are those translations.

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


def _read_done(path: str) -> Dict[int, List[int]]:
    done = {}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:  # the torn last line of a killed run
                    continue
                done[int(row["id"])] = row["tokens"]
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


def translate_missing(data, options, subset, src, tgt, done, hyp_path, log) -> None:
    """Decode the sentences not yet in `done` with the teacher, appending each batch to `hyp_path`."""
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
                tokens = hyp[0]["tokens"].tolist()
                if tokens and tokens[-1] == eos:
                    tokens = tokens[:-1]
                f.write(json.dumps({"id": sid, "tokens": tokens}) + "\n")
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
