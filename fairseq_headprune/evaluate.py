"""Decoding a subset under the model's current masks, BLEU and teacher-forced loss: the one loop every
experiment reuses. The data is read and batched once; each call decodes it again with whatever ξ is set."""
from __future__ import annotations

import hashlib
from typing import List, Optional

import sacrebleu
import torch

from fairseq_headprune.errors import UserError
from fairseq_headprune.loading import Loaded, batches


class SubsetEvaluator:
    """Translate and score one subset repeatedly, as fairseq-generate would with the same options."""

    def __init__(self, loaded: Loaded, subset: str, references: Optional[str] = None):
        self.loaded, self.subset = loaded, subset
        cfg, task = loaded.cfg, loaded.task
        self.dataset, itr = batches(loaded, subset)
        self.device = next(loaded.model.parameters()).device
        self.samples = [self._to_device(s) for s in itr if s and "net_input" in s]
        self.generator = task.build_generator([loaded.model], cfg.generation)
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
                refs[sid] = self.detokenize(tgt_dict.string(tokens.int().cpu(), self.post_process, escape_unk=True))
        return refs

    def data_fingerprint(self) -> str:
        """What the results are computed from: the subset's sentence ids, sources and references."""
        h = hashlib.sha256()
        for sample in self.samples:
            h.update(sample["id"].cpu().numpy().tobytes())
            h.update(sample["net_input"]["src_tokens"].cpu().numpy().tobytes())
        h.update("\n".join(self.references).encode())
        return h.hexdigest()[:16]

    @torch.no_grad()
    def translate(self) -> List[str]:
        """Detokenised best hypotheses in dataset order, under the current masks."""
        from fairseq import utils

        task, model, tgt_dict = self.loaded.task, self.loaded.model, self.loaded.task.target_dictionary
        hyps = [""] * self.size
        for sample in self.samples:
            outputs = task.inference_step(self.generator, [model], sample)
            for sid, nbest in zip(sample["id"].tolist(), outputs):
                best = nbest[0]
                _, text, _ = utils.post_process_prediction(
                    hypo_tokens=best["tokens"].int().cpu(), src_str="", alignment=None, align_dict=None,
                    tgt_dict=tgt_dict, remove_bpe=self.post_process,
                )
                hyps[sid] = self.detokenize(text)
        return hyps

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
        for sample in self.samples:
            logits = model(**sample["net_input"])[0]
            lprobs = model.get_normalized_probs((logits, None), log_probs=True)
            target = sample["target"]
            nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
            total += float(nll.masked_fill(target.eq(pad), 0).sum())
            tokens += int(target.ne(pad).sum())
        return total / max(tokens, 1)
