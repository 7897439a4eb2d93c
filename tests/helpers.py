"""In-process access to the tiny models: load, batch, and compare with stock fairseq."""
from __future__ import annotations

import copy
from pathlib import Path

import torch


def load_stock(checkpoint: Path, data: Path):
    """The checkpoint as stock fairseq loads it (its own task, no head masks); eval mode."""
    from fairseq import checkpoint_utils

    from fairseq_headprune.fairseq_io.loading import trust_fairseq_checkpoints

    trust_fairseq_checkpoints()
    models, _cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(checkpoint)], arg_overrides={"data": str(data)}
    )
    task.load_dataset("test")
    return models[0].eval(), task


def sample_batch(task, n: int = 6, subset: str = "test"):
    dataset = task.dataset(subset)
    return dataset.collater([dataset[i] for i in range(n)])


def zero_head_columns(model, attn_type: str, layer: int, head: int):
    """A copy of a stock model whose out_proj columns for one head are zero: the reference for a masked head."""
    from fairseq_headprune.core.heads import attention_modules

    ref = copy.deepcopy(model)
    attn = attention_modules(ref)[(attn_type, layer)]
    d = attn.head_dim
    with torch.no_grad():
        attn.out_proj.weight[:, (head - 1) * d : head * d] = 0
    return ref


def teacher_forced_logits(model, batch):
    with torch.no_grad():
        return model(**batch["net_input"])[0]


def incremental_logits(model, batch):
    """Decoder logits computed one target position at a time with incremental state (fairseq's decoding path)."""
    net_input = batch["net_input"]
    with torch.no_grad():
        encoder_out = model.encoder(net_input["src_tokens"], src_lengths=net_input["src_lengths"])
        state = torch.jit.annotate(dict, {})
        prev = net_input["prev_output_tokens"]
        steps = []
        for t in range(prev.size(1)):
            out, _ = model.decoder(prev[:, : t + 1], encoder_out=encoder_out, incremental_state=state)
            steps.append(out[:, -1])
    return torch.stack(steps, dim=1)


def beam_hypotheses(model, task, batch, beam: int = 4):
    generator = task.build_generator([model], _GenArgs(beam))
    with torch.no_grad():
        hyps = task.inference_step(generator, [model], batch)
    return [(h[0]["tokens"].tolist(), float(h[0]["score"])) for h in hyps]


class _GenArgs:
    def __init__(self, beam: int):
        self.beam = beam
        self.max_len_a, self.max_len_b, self.min_len = 0, 60, 1
        self.lenpen, self.unkpen = 1.0, 0.0

    def __getattr__(self, name):  # every other generation option at fairseq's default
        from fairseq.dataclass.configs import GenerationConfig

        return getattr(GenerationConfig(), name)


# CTranslate2's int8 kernels round differently on each CPU (the ISA, oneDNN or MKL, and above all whether the CPU has
# VNNI: without it oneDNN's AVX2 u8s8 product saturates 16-bit sums): its int8 hypotheses are compared with fairseq's
# by their agreement (BLEU on token ids, 100: the same), never token for token; float32 exactly. With oneDNN held to
# AVX2 (ONEDNN_MAX_CPU_ISA=AVX2, a CPU without VNNI) every hypothesis of the tiny encoder-cut model differed and the
# agreement was 85; a model exported wrong agrees near 0.
INT8_AGREEMENT = 50.0


def assert_exported_like_fairseq(check: dict, quantization: str = "int8") -> None:
    """An export check (prune.export.export's record): float32 hypotheses equal to fairseq's, the quantized
    model's agreeing with them at least INT8_AGREEMENT."""
    assert check["float32"]["differing"] == 0, check["float32"]
    assert check[quantization]["agreement"] >= INT8_AGREEMENT, check[quantization]
