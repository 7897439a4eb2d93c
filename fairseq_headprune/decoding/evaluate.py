"""Decoding a subset under the model's current masks, BLEU and teacher-forced loss: the one loop every
experiment reuses. The data is read and batched once; each call decodes it again with whatever ξ is set."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence

import sacrebleu
import torch
from fairseq.sequence_generator import EnsembleModel

from fairseq_headprune.errors import UserError
from fairseq_headprune.core.heads import Head, attention_modules, head_ids
from fairseq_headprune.decoding.layer_inputs import LayerInputCache, lowest_masked_layers
from fairseq_headprune.fairseq_io.loading import Loaded, batches, load
from fairseq_headprune.core.masking import set_head_masks
from fairseq_headprune.decoding.mask_batching import timed_translation
from fairseq_headprune.records.identity import remember_legacy_fingerprint


class _ReusableEncoderEnsemble(EnsembleModel):
    """fairseq's generator ensemble whose encoder output can be handed in, so that masks which leave the
    encoder alone reuse one encoder pass instead of recomputing it."""

    encoder_outs = None

    def forward_encoder(self, net_input):
        if self.encoder_outs is not None:
            return self.encoder_outs
        return super().forward_encoder(net_input)


@dataclass(frozen=True)
class EvaluatorSpec:
    """What another process needs to build the same evaluator (picklable): the fairseq config the model and data
    were loaded with, the subset and the reference file. `open()` loads the checkpoint as `load(cfg)` does."""

    cfg: Any
    subset: str
    references: Optional[str] = None

    def open(self, reuse: bool = False) -> "SubsetEvaluator":
        """The evaluator, its model loaded; reuse=True: the one this process opened before for the same spec (a
        local worker serving several sweeps of one report), and the same loaded model for the same config."""
        import pickle

        if not reuse:
            return SubsetEvaluator(load(self.cfg), self.subset, self.references)
        key, cfg_key = pickle.dumps(self), pickle.dumps(self.cfg)
        if key not in _OPENED:
            if cfg_key not in _LOADED:
                _LOADED[cfg_key] = load(self.cfg)
            _OPENED[key] = SubsetEvaluator(_LOADED[cfg_key], self.subset, self.references)
        return _OPENED[key]


_OPENED: Dict[bytes, "SubsetEvaluator"] = {}  # per process: EvaluatorSpec.open(reuse=True)
_LOADED: Dict[bytes, Loaded] = {}


class SubsetEvaluator:
    """Translate and score one subset repeatedly, as fairseq-generate would with the same options."""

    def __init__(self, loaded: Loaded, subset: str, references: Optional[str] = None):
        self.loaded, self.subset = loaded, subset
        self.spec = EvaluatorSpec(loaded.cfg, subset, references)
        cfg, task = loaded.cfg, loaded.task
        self.dataset, itr = batches(loaded, subset)
        self.device = next(loaded.model.parameters()).device
        self.samples = [self._to_device(s) for s in itr]
        self.generator = task.build_generator([loaded.model], cfg.generation)
        self.generator.model = _ReusableEncoderEnsemble([loaded.model])
        self._cache = LayerInputCache(loaded.model)
        self.tokenizer = task.build_tokenizer(cfg.tokenizer)
        self.bpe = task.build_bpe(cfg.bpe)
        self.post_process = cfg.common_eval.post_process
        self.size = len(self.dataset)
        self.references = self._read_references(references) if references else self._decoded_targets()
        self.reference_source = references or "binarised targets, decoded"

    def _to_device(self, sample):
        from fairseq import utils

        return utils.move_to_cuda(sample) if self.device.type == "cuda" else sample

    def detokenize(self, text: str) -> str:
        if self.bpe is not None:
            text = self.bpe.decode(text)
        if self.tokenizer is not None:
            text = self.tokenizer.decode(text)
        return text

    def _read_references(self, path: str) -> List[str]:
        try:
            with open(path, encoding="utf-8") as f:
                refs = [line.rstrip("\n") for line in f]
        except OSError as e:
            raise UserError(f"cannot read references {path}: {e.strerror}") from None
        if len(refs) != self.size:
            raise UserError(f"references {path} have {len(refs)} lines but subset '{self.subset}' has {self.size}")
        return refs

    def _decoded_targets(self) -> List[str]:
        tgt_dict = self.loaded.task.target_dictionary
        refs = [""] * self.size
        for sample in self.samples:
            for i, sid in enumerate(sample["id"].tolist()):
                tokens = sample["target"][i]
                tokens = tokens[tokens.ne(tgt_dict.pad())]
                refs[sid] = self.detokenize(tgt_dict.string(tokens.int().cpu(), self.post_process, escape_unk=True,
                                                            extra_symbols_to_ignore=self.symbols_to_strip()))
        return refs

    def data_fingerprint(self) -> str:
        """What the results are computed from: each sentence's id, source tokens (padding stripped) and reference,
        in id order; never their batching, so a resume with another --max-tokens or --batch-size is the same run.
        Files written before (whose fingerprint hashed the padded batches) are recognised by
        results.identity.same_data while the batching they were written with is the current one."""
        pad = self.loaded.task.source_dictionary.pad()
        sources = {}
        for sample in self.samples:
            for i, sid in enumerate(sample["id"].tolist()):
                tokens = sample["net_input"]["src_tokens"][i]
                sources[sid] = tokens[tokens.ne(pad)].cpu().numpy().astype("int64").tobytes()
        h = hashlib.sha256(b"sentences\n")
        for sid in sorted(sources):
            h.update(f"{sid}:{len(sources[sid])}:".encode())
            h.update(sources[sid])
        h.update("\n".join(self.references).encode())
        fingerprint = h.hexdigest()[:16]
        legacy = hashlib.sha256()  # the fingerprint of files written before: the padded batches as they came
        for sample in self.samples:
            legacy.update(sample["id"].cpu().numpy().tobytes())
            legacy.update(sample["net_input"]["src_tokens"].cpu().numpy().tobytes())
        legacy.update("\n".join(self.references).encode())
        remember_legacy_fingerprint(legacy.hexdigest()[:16], fingerprint)
        return fingerprint

    @torch.no_grad()
    def translate(self) -> List[str]:
        """Detokenised best hypotheses in dataset order, under the current masks. While the encoder runs as
        stock (no encoder mask or gate), its output is computed once per batch and reused by later calls; under
        encoder masks it runs from the lowest masked layer, fed that layer's recorded unmasked input."""
        task, model = self.loaded.task, self.loaded.model
        ensemble = self.generator.model
        starts = lowest_masked_layers(model)
        hyps = [""] * self.size
        for b, sample in enumerate(self.samples):
            ensemble.encoder_outs = self._encoder_outs(b, sample["net_input"], starts)
            try:
                outputs = task.inference_step(self.generator, [model], sample)
            finally:
                ensemble.encoder_outs = None
            for sid, nbest in zip(sample["id"].tolist(), outputs):
                hyps[sid] = self.hypothesis_text(nbest[0])
        return hyps

    @torch.no_grad()
    def translate_many(self, mask_sets: Sequence[Sequence[Head]], masks_per_batch: int = 1) -> List[List[str]]:
        """Hypotheses for each set of masked heads, as translate() under that mask would give them.

        masks_per_batch 1 decodes one mask at a time. Above 1, several masks share one beam search: each
        sentence is repeated once per mask and every row carries its own ξ, which pays fairseq's per-step Python
        overhead once: faster for small batches (and on GPUs), slower where a beam search of a few thousand rows is
        compute-bound on a CPU. fairseq_headprune.decoding.mask_batching chooses the number by measuring
        (`auto`). Either way, masks that leave the encoder alone reuse one encoder pass per batch, and the
        hypotheses are the same. The model's own masks must be off (all ξ = 1) meanwhile.
        """
        model, task = self.loaded.model, self.loaded.task
        if masks_per_batch <= 1:
            results = []
            try:
                for mask in mask_sets:
                    set_head_masks(model, mask)
                    results.append(self.translate())
            finally:
                set_head_masks(model, [])
            return results
        modules = attention_modules(model)
        ensemble = self.generator.model
        beam = self.generator.beam_size
        results = [[""] * self.size for _ in mask_sets]
        for b, sample in enumerate(self.samples):
            ids, n = sample["id"].tolist(), sample["id"].numel()
            for start in range(0, len(mask_sets), masks_per_batch):
                group = list(range(start, min(start + masks_per_batch, len(mask_sets))))
                masks = [mask_sets[i] for i in group]
                rows = self._row_masks(modules, masks, n)
                enc_layers = [h.layer - 1 for m in masks for h in m if h.type == "enc-self"]
                # what the cache records unmasked is computed before any row mask is set
                if enc_layers:
                    self._cache.encoder_inputs(b, sample["net_input"])
                else:
                    expand = torch.arange(n, device=self.device).repeat(len(group))
                    encoder_out = self._cache.encoder_out(b, sample["net_input"])
                    ensemble.encoder_outs = [model.encoder.reorder_encoder_out(encoder_out, expand)]
                try:
                    for key, attn in modules.items():
                        attn.row_head_mask = rows[key] if key[0] == "enc-self" else rows[key].repeat_interleave(beam, 0)
                    if enc_layers:  # the encoder from the group's lowest masked layer up, on the group's rows
                        ensemble.encoder_outs = [self._cache.encoder_out_from(b, sample["net_input"], min(enc_layers),
                                                                              times=len(group))]
                    outputs = task.inference_step(self.generator, [model], _repeat(sample, len(group)))
                finally:
                    ensemble.encoder_outs = None
                    for attn in modules.values():
                        attn.row_head_mask = None
                for r, nbest in enumerate(outputs):
                    results[group[r // n]][ids[r % n]] = self.hypothesis_text(nbest[0])
        return results

    def _encoder_outs(self, b: int, net_input: dict, starts) -> Optional[list]:
        """What the generator's encoder step returns for batch b under the model's fixed masks: the cached unmasked
        output when the encoder is stock, the encoder run from its lowest masked layer up (the unmasked inputs of
        that layer reused) when it is not; None (the generator runs the encoder) under gates or per-row masks."""
        if starts is None:
            return None
        if starts[0] is None:
            return [self._cache.encoder_out(b, net_input)]
        return [self._cache.encoder_out_from(b, net_input, starts[0])]

    def _row_masks(self, modules, masks: Sequence[Sequence[Head]], n: int) -> Dict:
        """(len(masks) * n, heads) per module: mask-major rows, zeros on each mask's heads."""
        rows = {}
        for key, attn in modules.items():
            ids = head_ids(attn)
            r = torch.ones(len(masks), n, attn.num_heads, dtype=attn.out_proj.weight.dtype, device=self.device)
            for k, mask in enumerate(masks):
                for h in mask:
                    if (h.type, h.layer) == key:
                        r[k, :, ids.index(h.head)] = 0
            rows[key] = r.view(len(masks) * n, attn.num_heads)
        return rows

    def hypothesis_text(self, best) -> str:
        """One hypothesis as fairseq-generate's D- line: BPE removed, detokenised (what sacreBLEU scores)."""
        from fairseq import utils

        _, text, _ = utils.post_process_prediction(
            hypo_tokens=best["tokens"].int().cpu(), src_str="", alignment=None, align_dict=None,
            tgt_dict=self.loaded.task.target_dictionary, remove_bpe=self.post_process,
            extra_symbols_to_ignore=self.symbols_to_strip(),
        )
        return self.detokenize(text)

    def symbols_to_strip(self) -> set:
        """What fairseq-generate strips from hypotheses and references: EOS, and the target-language token of the
        multilingual and mBART tasks (their generators name it)."""
        generator = self.generator
        return set(getattr(generator, "symbols_to_strip_from_output", None) or {generator.eos})

    def bleu(self, hypotheses: List[str]) -> sacrebleu.metrics.bleu.BLEUScore:
        return self.bleu_metric().corpus_score(hypotheses, [self.references])

    def bleu_metric(self) -> sacrebleu.BLEU:
        return sacrebleu.BLEU()

    def bleu_signature(self) -> str:
        """sacreBLEU's signature (it needs one scoring to know the number of references)."""
        metric = self.bleu_metric()
        metric.corpus_score(self.references[:1], [self.references[:1]])
        return str(metric.get_signature())

    @torch.no_grad()
    def nll(self) -> float:
        """Teacher-forced NLL per target token (nats) of the references under the current masks."""
        model, pad = self.loaded.model, self.loaded.task.target_dictionary.pad()
        total, tokens = 0.0, 0
        for b, sample in enumerate(self.samples):
            # each forward starts at the lowest masked layer; only real target tokens meet the output layer
            features = self._cache.decoder_features(b, sample["net_input"])
            target = sample["target"]
            real = target.ne(pad)
            logits = model.decoder.output_layer(features[real])
            lprobs = model.get_normalized_probs((logits, None), log_probs=True)
            total -= float(lprobs.gather(-1, target[real].unsqueeze(-1)).sum())
            tokens += int(real.sum())
        return total / max(tokens, 1)


def decoder_start(sample, pad: int, generator) -> int:
    """The token the decoder starts from when it teacher-forces this batch: the references' first decoder input
    when the batch has them, else the generator's EOS, which fairseq's beam search starts from (EOS for
    `translation` and `translation_multi_simple_epoch`, whose target-language token is the first output; the
    target-language token for mBART's `translation_from_pretrained_bart`). Teacher-forcing a model's own
    translations must start as its references do."""
    prev = sample["net_input"].get("prev_output_tokens")
    if prev is None:
        return int(generator.eos)
    first = prev[0]
    return int(first[first.ne(pad)][0])


def _repeat(sample, times: int) -> dict:
    """The batch repeated `times` times along the batch dimension (mask-major rows)."""
    net_input = {k: (v.repeat(times, *([1] * (v.dim() - 1))) if torch.is_tensor(v) else v)
                 for k, v in sample["net_input"].items()}
    return {**sample, "net_input": net_input, "id": sample["id"].repeat(times)}


def translate_worker(spec: EvaluatorSpec) -> Callable[[Sequence, Any], Any]:
    """A local worker's handler (fairseq_headprune.decoding.workers): the evaluator built once from `spec`, then for
    each task, a group of (index, heads) pairs, the hypotheses of each (the group sharing beam searches) and the CPU
    seconds they took (mask_batching.timed_translation)."""
    evaluator = spec.open(reuse=True)

    def translate_group(group: Sequence, shared: Any = None):
        return timed_translation(evaluator, [masked for _, masked in group])

    return translate_group
