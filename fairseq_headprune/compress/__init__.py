"""The compression pipeline, one module per stage: what a user takes home after the studies have said which heads
a model does not need.

  select        which heads to remove under a budget (Fisher fills, rearrangement, the per-stack shape)
  reconstruct   closed-form refit of each pruned sublayer towards the unpruned model (ReconstructionOptions);
  window_fit    its nonlinear upgrade: each pruned attention fitted whole by Adam (WindowOptions)
  sublayers     the sublayers both fits address, and the hooks that capture their streams
  shrink        select + reconstruct on calibration data, written as a smaller fairseq checkpoint (ShrinkOptions)
  recover       a short distillation from the unpruned model on fairseq's training loop (RecoverOptions);
  sequence_targets  its sequence-level targets: the teacher's beam translations, cached
  export        a CTranslate2 model of the result, checked against fairseq (ExportOptions)

Functions take loaded models and options dataclasses; none of them sees argparse.
"""
