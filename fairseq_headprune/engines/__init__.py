"""One way to build, run and time a model: fairseq's generator and CTranslate2 (ct2_spec: a model as a CTranslate2
spec; ct2 and fairseq_engine: batches decoded as fairseq-generate decodes them; engine_model: either engine behind
one run; timing: interleaved rounds and paired statistics). Studies and compress both call it; it imports neither."""
