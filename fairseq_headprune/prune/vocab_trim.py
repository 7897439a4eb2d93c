"""A loaded model trimmed to a vocabulary plan (prune.vocabulary): the rows removed (core.surgery.trim_vocabulary),
checked against the untrimmed model, measured (parameters, a float32 CTranslate2 model's weights in bytes), and noted
in the checkpoint it is written as, beside its dictionaries.

The check runs both models teacher-forced on sentences whose source and target tokens are all kept (their ids
mapped old -> new): the trimmed model's logits must equal the untrimmed model's logits of the kept target tokens.
Its softmax is normalised over the kept tokens alone, so a hypothesis changes only where the untrimmed model's
search reached a dropped token (or a beam held one) or the source holds one (it becomes <unk>).
"""
from __future__ import annotations

import copy
import os
from typing import Dict, List, Optional, Sequence, Set, Tuple

import torch
from torch import nn

from fairseq_headprune.core.surgery import trim_vocabulary
from fairseq_headprune.engines.ct2_spec import build_spec, float32_weight_bytes
from fairseq_headprune.errors import UserError
from fairseq_headprune.fairseq_io.loading import load_subset
from fairseq_headprune.prune.vocabulary import Corpus, VocabularyPlan, plan_record, plan_vocabulary

CHECK_TOLERANCE = 1e-4  # the largest logit difference the check accepts (float32 sums in another order)
CFG_KEY = "vocabulary_trim"  # where the checkpoint's config records the trim
CHANGES_BATCH = 16  # sentences per batch of hypothesis_changes' decoding


def untrimmable_parts(model) -> List[str]:
    """Why a model's vocabulary rows cannot be selected (empty: they can)."""
    encoder, decoder = getattr(model, "encoder", None), getattr(model, "decoder", None)
    if encoder is None or decoder is None:
        return [f"model class {type(model).__name__} is not an encoder-decoder"]
    problems = []
    for name, stack in (("encoder", encoder), ("decoder", decoder)):
        if not isinstance(getattr(stack, "embed_tokens", None), nn.Embedding):
            problems.append(f"the {name}'s token embeddings are not one table (adaptive input?)")
    if getattr(decoder, "adaptive_softmax", None) is not None or getattr(decoder, "output_projection", None) is None:
        problems.append("the decoder has an adaptive softmax, not one output projection")
    return problems


def refuse_untrimmable(model) -> None:
    problems = untrimmable_parts(model)
    if problems:
        raise UserError(f"--keep-vocab: this model's vocabulary cannot be trimmed: {'; '.join(problems)}")


def plan_for(loaded, corpora: Sequence[Corpus], floor: Optional[int]) -> VocabularyPlan:
    """What --keep-vocab keeps of the loaded model (embeddings shared between its stacks stay shared); a model or
    task it cannot trim is one line."""
    refuse_untrimmable(loaded.model)
    shared = loaded.model.encoder.embed_tokens is loaded.model.decoder.embed_tokens
    return plan_vocabulary(loaded.task, corpora, floor, shared)


def target_percent(plan: VocabularyPlan) -> float:
    """The share of the target words the plan keeps, in percent (the output layer's rows)."""
    return 100.0 * len(plan.target.old_ids) / plan.target.summary["before"]


def trimmed(model, plan: VocabularyPlan):
    """A copy of `model` holding only the plan's rows, its encoder and decoder given the trimmed dictionaries."""
    model = copy.deepcopy(model)
    trim_vocabulary(model, plan.source.old_ids, plan.target.old_ids, keep_first=plan.source.dictionary.nspecial)
    model.encoder.dictionary, model.decoder.dictionary = plan.source.dictionary, plan.target.dictionary
    return model


def id_map(old_ids: Sequence[int], old_size: int) -> torch.Tensor:
    """old id -> new id (-1 for a dropped token)."""
    out = torch.full((old_size,), -1, dtype=torch.long)
    out[torch.as_tensor(list(old_ids), dtype=torch.long)] = torch.arange(len(old_ids))
    return out


@torch.no_grad()
def check_trimmed(before, after, samples: Sequence[dict], plan: VocabularyPlan) -> Dict:
    """The largest difference between the trimmed model's logits and the untrimmed model's logits of the kept
    target tokens, teacher-forced on the samples' sentences that use kept tokens only; UserError beyond
    CHECK_TOLERANCE."""
    source_map = id_map(plan.source.old_ids, before.encoder.embed_tokens.num_embeddings)
    target_map = id_map(plan.target.old_ids, before.decoder.embed_tokens.num_embeddings)
    kept_columns = torch.as_tensor(plan.target.old_ids, dtype=torch.long)
    checked, total, largest = 0, 0, 0.0
    for sample in samples:
        net = sample["net_input"]
        src, prev = source_map[net["src_tokens"]], target_map[net["prev_output_tokens"]]
        rows = (src >= 0).all(1) & (prev >= 0).all(1) & (target_map[sample["target"]] >= 0).all(1)
        total += int(rows.numel())
        if not rows.any():
            continue
        lengths = net["src_lengths"][rows]
        a = before(net["src_tokens"][rows], lengths, net["prev_output_tokens"][rows])[0].index_select(-1, kept_columns)
        b = after(src[rows], lengths, prev[rows])[0]
        largest = max(largest, float((a - b).abs().max()))
        checked += int(rows.sum())
    if largest > CHECK_TOLERANCE or largest != largest:
        raise UserError(f"the trimmed model's logits differ from the untrimmed model's by {largest:.2e} on the kept "
                        "tokens: nothing written")
    return {"sentences": total, "sentences_checked": checked, "max_logit_diff": largest}


@torch.no_grad()
def best_tokens(loaded, subset: str, sentences: int) -> Tuple[Dict[int, List[str]], Dict[int, List[str]]]:
    """The first `sentences` of `subset` (by id, in batches of CHANGES_BATCH) as fairseq-generate decodes them with
    the loaded model: each sentence's source and best hypothesis as tokens (fairseq's stripped symbols left out)."""
    task, dataset = loaded.task, load_subset(loaded, subset)
    generator = task.build_generator([loaded.model], loaded.cfg.generation)
    strip = set(getattr(generator, "symbols_to_strip_from_output", None) or ()) | {task.target_dictionary.eos()}
    source_strip = {task.source_dictionary.pad(), task.source_dictionary.eos()}
    sources, hypotheses = {}, {}
    ids = list(range(min(sentences, len(dataset))))
    for start in range(0, len(ids), CHANGES_BATCH):
        sample = dataset.collater([dataset[i] for i in ids[start:start + CHANGES_BATCH]])
        outputs = task.inference_step(generator, [loaded.model], sample)
        for i, (sid, nbest) in enumerate(zip(sample["id"].tolist(), outputs)):
            sources[sid] = [task.source_dictionary[t] for t in sample["net_input"]["src_tokens"][i].tolist()
                            if t not in source_strip]
            hypotheses[sid] = [task.target_dictionary[t] for t in nbest[0]["tokens"].tolist() if t not in strip]
    return sources, hypotheses


def hypothesis_changes(untrimmed, trimmed, subset: str, sentences: int, kept_source: Set[str],
                       kept_target: Set[str]) -> Dict:
    """The first `sentences` of `subset` decoded in fairseq by the untrimmed model and the trimmed one (each loaded
    with its task: the trimmed one's reads DATA through the trim): how many hypotheses changed, and why: a token
    not in `kept_source` in the source (read as <unk>), else one not in `kept_target` in the untrimmed hypothesis
    (the trimmed model cannot write it), else the search (the softmax normalised over the kept tokens reorders
    near-equal beams)."""
    sources, before = best_tokens(untrimmed, subset, sentences)
    _, after = best_tokens(trimmed, subset, sentences)
    out = {"subset": subset, "sentences": len(before), "changed": 0, "dropped_source_token": 0,
           "dropped_target_token": 0, "search": 0}
    for sid, hypothesis in before.items():
        if after.get(sid) == hypothesis:
            continue
        out["changed"] += 1
        if any(t not in kept_source for t in sources[sid]):
            out["dropped_source_token"] += 1
        elif any(t not in kept_target for t in hypothesis):
            out["dropped_target_token"] += 1
        else:
            out["search"] += 1
    return out


def parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


def ct2_weight_bytes(model, source_dictionary, target_dictionary, activation: str) -> Tuple[Optional[int], str]:
    """The bytes of the model's weights as a float32 CTranslate2 model (its spec, never written), or None and why
    CTranslate2 cannot take the model."""
    try:
        spec = build_spec(model, source_dictionary, target_dictionary, activation)
    except (UserError, ImportError) as e:
        return None, str(e)
    return float32_weight_bytes(spec), ""


def measure(before, after, loaded, plan: VocabularyPlan) -> Dict:
    """Parameters and float32 CTranslate2 weight bytes of the source model and of the trimmed one."""
    activation = getattr(loaded.saved_cfg.model, "activation_fn", None) or "relu"
    size_before, why = ct2_weight_bytes(before, loaded.task.source_dictionary, loaded.task.target_dictionary,
                                        activation)
    size_after, _ = ct2_weight_bytes(after, plan.source.dictionary, plan.target.dictionary, activation) \
        if size_before is not None else (None, why)
    return {"parameters_before": parameters(before), "parameters_after": parameters(after),
            "ct2_float32_weight_bytes_before": size_before, "ct2_float32_weight_bytes_after": size_after,
            **({"ct2_not_measured": why} if size_before is None else {})}


def ct2_sizes(memory: Dict) -> Optional[Tuple[float, float, str]]:
    """(MiB before, MiB after, what they count) of a record's `memory`: the float32 weights, or a folder on disk in
    a record written before the sizes were read from the spec; None where CTranslate2 could not take the model."""
    for key, what in (("ct2_float32_weight_bytes", "weights"), ("ct2_float32_bytes", "on disk")):
        if memory.get(f"{key}_before") is not None:
            return memory[f"{key}_before"] / 2**20, memory[f"{key}_after"] / 2**20, what
    return None


def cfg_record(plan: VocabularyPlan) -> Dict:
    """What the checkpoint's config records of the trim: sizes, corpora, files and the id map (no local paths)."""
    record = plan_record(plan)
    record["corpora"] = [{k: v for k, v in c.items() if k != "path"} | {"name": os.path.basename(c["path"])}
                         for c in record["corpora"]]
    return record


def note_in_state(state: dict, plan: VocabularyPlan) -> dict:
    """The checkpoint's config (`cfg`, or the legacy `args`) given the trim's record under CFG_KEY."""
    record = cfg_record(plan)
    if state.get("cfg") is not None:
        state["cfg"][CFG_KEY] = record
    elif state.get("args") is not None:
        setattr(state["args"], CFG_KEY, record)
    return state


def describe(record: Dict) -> str:
    """The printed lines: vocabulary sizes, parameters and CTranslate2 bytes before and after."""
    source, target = record["source"], record["target"]
    sides = (f"{source['before']:,} -> {source['after']:,} symbols (source and target: one dictionary)"
             if record["one_dictionary"] else
             f"source {source['before']:,} -> {source['after']:,}, target {target['before']:,} -> "
             f"{target['after']:,} symbols")
    m = record["memory"]
    sizes = ct2_sizes(m)
    size = (f"; CTranslate2 float32 {sizes[2]} {sizes[0]:.2f} MiB -> {sizes[1]:.2f} MiB" if sizes else
            f"; CTranslate2 not measured ({m.get('ct2_not_measured', 'no size recorded')})")
    check = record.get("check")
    checked = ("" if check is None else f"\ncheck: the kept tokens' logits equal on {check['sentences_checked']} of "
               f"{check['sentences']} sentences (those using kept tokens only), max difference "
               f"{check['max_logit_diff']:.1e}")
    changes = record.get("hypotheses")
    changed = ("" if changes is None else f"\nhypotheses: {changes['changed']} of the first {changes['sentences']} "
               f"of '{changes['subset']}' changed in fairseq ({changes_words(changes)})")
    return (f"vocabulary: {sides}; parameters {m['parameters_before']:,} -> {m['parameters_after']:,}{size}"
            f"{checked}{changed}")


def changes_words(changes: Dict) -> str:
    """Why the hypotheses that changed did: "2 by a dropped source token, 1 by the search"."""
    parts = [f"{changes[k]} by {what}" for k, what in (
        ("dropped_source_token", "a dropped source token (read as <unk>)"),
        ("dropped_target_token", "a dropped token of the untrimmed hypothesis"),
        ("search", "the search (near-equal beams reordered)")) if changes[k]]
    return ", ".join(parts) or "none"


def companions(plan: VocabularyPlan, out: str) -> Dict[str, str]:
    """{path beside `out`: text} of the trimmed dictionaries (written with the checkpoint, as one group)."""
    folder = os.path.dirname(os.path.abspath(out))
    return {os.path.join(folder, name): text for name, text in plan.files.items()}


def trim_and_check(loaded, model, plan: VocabularyPlan, samples: Optional[Sequence[dict]]) -> Tuple[object, Dict]:
    """`model` (the loaded one, or its pruned copy) trimmed to the plan, checked against it on `samples` (None:
    not checked), measured against the loaded model; and the record's `vocabulary` entry."""
    after = trimmed(model, plan)
    check = check_trimmed(model, after, samples, plan) if samples is not None else None
    return after, {**plan_record(plan), "check": check, "memory": measure(loaded.model, after, loaded, plan)}
