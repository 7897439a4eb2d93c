"""The pruning library: what removes structures from a trained model, refits it, recovers it and exports it. Plain
functions over loaded models, shapes and small options dataclasses; it never sees argparse and imports neither the
compress pipeline nor the studies (the commands `shrink`, `recover`, `export-ct2`, `translate`, the studies and
compress's stages call it).

  select        which heads to remove under a budget (Fisher fills, rearrangement, the per-stack shape)
  layers        which whole layers to remove (greedy calibration loss, or evenly spaced)
  ffn           which FFN hidden units to remove (mask Fisher)
  sublayers     the sublayers the fits address, and the hooks that capture their streams
  reconstruct   closed-form refit of each pruned sublayer towards the unpruned model (ReconstructionOptions)
  window_fit    its nonlinear upgrade: each pruned attention fitted whole by Adam (WindowOptions)
  vocabulary    which vocabulary a deployment keeps (--keep-vocab: corpora, floor, language tokens) and the
                trimmed dictionaries' files (VocabularyOptions)
  vocab_trim    a model trimmed to that vocabulary: checked against the untrimmed one, measured, noted in its checkpoint
  shrink        select + reconstruct on calibration data, written as a smaller fairseq checkpoint (ShrinkOptions)
  recover       a short distillation from the unpruned model on fairseq's training loop (RecoverOptions)
  sequence_targets  its sequence-level targets: the teacher's beam translations, cached
  levers        what each removable structure buys in the engine (the cost table)
  export        a CTranslate2 model of the result, checked against fairseq (ExportOptions)
  vocab_map     the target-vocabulary map CTranslate2 restricts each batch's search to
  deployable    the deployable folder's tokenizer files and their reading
  translate     raw text in, raw text out through a deployable folder

Removing what they choose is core.surgery's, for every structure.
"""
