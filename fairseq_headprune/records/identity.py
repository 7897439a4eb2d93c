"""What makes two result rows comparable: the run identity every resumable results file carries in its header.

A row may join a file only when it was computed from the same checkpoint (hash), the same data (subset and a
fingerprint of its ids, sources and references), the same metric and significance settings, the same study
inputs (importance or ablation files by hash, seeds) and the same decoding. The decoding part is derived from
fairseq's configuration **as a whole**: every field of the generation, task, BPE and tokenizer configs, minus a
short documented list of fields that cannot change a hypothesis (`NEUTRAL`). A new fairseq option therefore
joins the identity by default; tests/test_run_identity.py walks every field and fails on one that is neither.
"""
from __future__ import annotations

import glob
import hashlib
import os
from typing import Any, Dict, Iterable, List, Mapping, Optional

# Fields that cannot change a hypothesis, a score or a p-value, by config section. Batching (--max-tokens,
# --batch-size, workers) lives in cfg.dataset, which is not part of the identity at all: batches change padding,
# not results (every command refuses a set that was batched incompletely).
NEUTRAL: Dict[str, frozenset] = {
    "generation": frozenset({
        "_name",
        "print_alignment",        # what fairseq-generate prints beside a hypothesis
        "print_step",             # idem
        "retain_iter_history",    # idem (iterative refinement's intermediate outputs)
        "sacrebleu",              # how fairseq-generate scores its own output; we score with sacreBLEU ourselves
        "no_seed_provided",       # fairseq's bookkeeping of whether --seed was given (the seed itself counts)
    }),
    "task": frozenset({
        "_name",
        "data",                   # a folder path: its content is fingerprinted (data_fingerprint)
        "train_subset",           # training only
        "num_batch_buckets",      # batching
        "eval_bleu", "eval_bleu_args", "eval_bleu_detok", "eval_bleu_detok_args", "eval_tokenized_bleu",
        "eval_bleu_remove_bpe", "eval_bleu_print_samples",  # fairseq-train's validation BLEU
        "gate_lr_scale",          # training only: how fast gates move, not what a trained gate computes
    }),
}
# cfg.common fields that change what a model computes (precision) or samples (seed)
COMMON_FIELDS = ("seed", "fp16", "bf16", "memory_efficient_fp16", "memory_efficient_bf16", "cpu")
# config fields naming files whose content (not path) is what counts
FILE_FIELDS = ("bpe_codes", "sentencepiece_model", "bpe_vocab", "bpe_merges", "gpt2_encoder_json", "gpt2_vocab_bpe")


# data fingerprints of files written before the fingerprint became the sentences' own (it hashed the padded batches)
# -> the sentences' fingerprint, for the batching this process reads them with (evaluate.data_fingerprint fills it)
_LEGACY_FINGERPRINTS: Dict[str, str] = {}


def remember_legacy_fingerprint(legacy: str, fingerprint: str) -> None:
    _LEGACY_FINGERPRINTS[legacy] = fingerprint


def canonical_fingerprint(value: Any) -> Any:
    """A recorded data fingerprint as the current code computes it: an old batch-based one this process has seen
    the sentences of becomes theirs; anything else unchanged."""
    return _LEGACY_FINGERPRINTS.get(value, value) if isinstance(value, str) else value


def upgrade_fingerprints(header: Mapping[str, Any]) -> Dict[str, Any]:
    """A results header with its old batch-based data fingerprints replaced by the sentences' own (see above), so
    a file written before resumes under any batching once it has been reopened with its original batching."""
    return {k: (canonical_fingerprint(v) if k.endswith("data_fingerprint") else
                {kk: canonical_fingerprint(vv) for kk, vv in v.items()} if k.endswith("data_fingerprints")
                and isinstance(v, Mapping) else v) for k, v in header.items()}


def file_sha256(path: str, limit: Optional[int] = None) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:limit] if limit else h.hexdigest()


def calibration_files_sha256(loaded, subset: str) -> str:
    """The calibration subset's files in the data folder (binarised and raw), hashed: the shrink's input by content."""
    folder = loaded.cfg.task.data.split(os.pathsep)[0]
    files = sorted(glob.glob(os.path.join(folder, subset + ".*")))
    return hashlib.sha256("".join(f"{os.path.basename(f)}:{file_sha256(f)}," for f in files).encode()).hexdigest()


def input_file(path: Optional[str]) -> Optional[str]:
    """A study input file as the identity records it: its content hash (None when not given)."""
    return file_sha256(path, 16) if path else None


def _section(cfg: Any, name: str) -> Dict[str, Any]:
    from omegaconf import OmegaConf

    section = cfg.get(name) if hasattr(cfg, "get") else getattr(cfg, name, None)
    if section is None:
        return {}
    if OmegaConf.is_config(section):
        return OmegaConf.to_container(section, resolve=True)
    return dict(vars(section)) if hasattr(section, "__dict__") else dict(section)


def _task_section(cfg: Any) -> Dict[str, Any]:
    """The task's options. An argparse task (translation_multi_simple_epoch, translation_from_pretrained_bart) gets
    the whole command-line namespace as its config: only the options its own parser defines are the task's."""
    import argparse

    section = _section(cfg, "task")
    task = cfg.get("task") if hasattr(cfg, "get") else getattr(cfg, "task", None)
    if not isinstance(task, argparse.Namespace):
        return section
    from fairseq.tasks import TASK_REGISTRY

    parser = argparse.ArgumentParser(add_help=False)
    TASK_REGISTRY[section["_name"]].add_args(parser)
    own = {action.dest for action in parser._actions}
    return {k: v for k, v in section.items() if k in own or k == "_name"}


def _with_file_hashes(values: Mapping[str, Any]) -> Dict[str, Any]:
    out = {}
    for key, value in values.items():
        if key in FILE_FIELDS and isinstance(value, str) and os.path.isfile(value):
            value = f"sha256:{file_sha256(value, 16)}"
        out[key] = value
    return out


def decoding_identity(cfg) -> Dict[str, Any]:
    """Everything in fairseq's config that can change a hypothesis or its detokenised text."""
    generation = {k: v for k, v in _section(cfg, "generation").items() if k not in NEUTRAL["generation"]}
    task = {k: v for k, v in _task_section(cfg).items() if k not in NEUTRAL["task"]}
    common = _section(cfg, "common")
    common_eval = _section(cfg, "common_eval")
    return {
        "generation": generation,
        "task": task,
        "precision_and_seed": {k: common.get(k) for k in COMMON_FIELDS},
        "post_process": common_eval.get("post_process"),  # --remove-bpe
        "model_overrides": common_eval.get("model_overrides"),
        "bpe": _with_file_hashes(_section(cfg, "bpe")) or None,
        "tokenizer": _with_file_hashes(_section(cfg, "tokenizer")) or None,
    }


def run_identity(command: str, loaded=None, evaluator=None, *, cfg=None, metric: Optional[str] = None,
                 bootstrap: Optional[Mapping[str, Any]] = None, inputs: Optional[Mapping[str, Any]] = None,
                 decoding: bool = True, **extra: Any) -> Dict[str, Any]:
    """The header of a resumable results file.

    loaded: the model (its checkpoint's hash); evaluator: the subset (name, data fingerprint, references hash);
    metric and bootstrap: how rows are scored and tested; inputs: the study's own inputs (file hashes via
    `input_file`, seeds); decoding: include fairseq's decoding configuration (False for studies that never decode).
    """
    cfg = cfg if cfg is not None else loaded.cfg
    identity: Dict[str, Any] = {"command": command}
    if loaded is not None:
        identity["checkpoint_sha256"] = file_sha256(loaded.checkpoint)
    if evaluator is not None:
        identity.update(subset=evaluator.subset, data_fingerprint=evaluator.data_fingerprint(),
                        references_sha256=hashlib.sha256("\n".join(evaluator.references).encode()).hexdigest()[:16])
    if metric is not None:
        identity["metric"] = metric
    if bootstrap is not None:
        identity["bootstrap"] = dict(bootstrap)
    if inputs:
        identity["inputs"] = dict(inputs)
    if decoding:
        identity["decoding"] = decoding_identity(cfg)
    identity.update(extra)
    return identity


def _flatten(obj: Any, prefix: str = "") -> Dict[str, Any]:
    if isinstance(obj, Mapping) and obj:
        out: Dict[str, Any] = {}
        for key, value in obj.items():
            out.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: obj}


_MISSING = object()


def describe_differences(theirs: Mapping[str, Any], ours: Mapping[str, Any], limit: int = 4) -> List[str]:
    """The fields in which two identities differ, as 'decoding.generation.min_len: 1 there, 3 now'."""
    a, b = _flatten(theirs), _flatten(ours)
    out = []
    for key in sorted(set(a) | set(b)):
        x, y = a.get(key, _MISSING), b.get(key, _MISSING)
        if x != y:
            there = "not recorded" if x is _MISSING else repr(x)
            now = "not set" if y is _MISSING else repr(y)
            out.append(f"{key}: {there} there, {now} now")
    if len(out) > limit:
        out = out[:limit] + [f"and {len(out) - limit} more fields"]
    return out


def fields_of(identity: Mapping[str, Any]) -> Iterable[str]:
    return _flatten(identity).keys()
