"""The compression pipeline, one module per stage: what a user takes home after the studies have said which heads
a model does not need.

  select        which heads to remove under a budget (Fisher fills, rearrangement, the per-stack shape)
  layers        which whole layers to remove (greedy calibration loss, or evenly spaced)
  ffn           which FFN hidden units to remove (mask Fisher)
  reconstruct   closed-form refit of each pruned sublayer towards the unpruned model (ReconstructionOptions);
  window_fit    its nonlinear upgrade: each pruned attention fitted whole by Adam (WindowOptions)
  sublayers     the sublayers both fits address, and the hooks that capture their streams
  shrink        select + reconstruct on calibration data, written as a smaller fairseq checkpoint (ShrinkOptions)
  recover       a short distillation from the unpruned model on fairseq's training loop (RecoverOptions);
  sequence_targets  its sequence-level targets: the teacher's beam translations, cached
  export        a CTranslate2 model of the result, checked against fairseq (ExportOptions)

and `compress`, which runs them for a stated speed: levers (what each structure buys in the engine: the cost table),
choice (which shape to build), options (CompressOptions: the command's options), stages (one module per
stage of the run: cost_table, choice, shrink, recover, export, measure, report, outputs, and plan), pipeline (the
staged, resumable run that orders and caches them), model_card.

Removing what they choose is core.surgery's, for every structure. Functions take loaded models and options
dataclasses; none of them sees argparse.
"""
