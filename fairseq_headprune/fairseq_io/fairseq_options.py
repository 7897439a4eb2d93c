"""One rule for fairseq's options: each field that reaches a study is applied as fairseq-generate applies it, or the
command is refused before any work in one line that names the option.

Every command takes fairseq-generate's whole option set, but the studies decode with their own loop (masks switched
in place, beam searches shared between masks), so an option fairseq-generate honours somewhere else (`--prefix-size`
in its own loop, `--fp16` by halving the model, `--retain-dropout` in prepare_for_inference_) would be accepted,
written into the run identity and silently ignored. `RULES` classifies every field of the config sections a study
sees; `check(cfg)` refuses any refused field set to a value other than fairseq's default, and any field this table
does not know (a new fairseq option, another task's option) set likewise, so nothing new slips through unapplied.

Kinds: DECODE (changes hypotheses; reaches the same fairseq call fairseq-generate makes: task.build_generator,
setup_task/load_dataset, load_model_ensemble; tests/test_fairseq_options.py compares our hypotheses with
fairseq-generate's for each), SAME_CALL (passed to the same fairseq call, no hypothesis of its own to compare:
paths, subsets, batching, user module), INERT (cannot change a result here: logging, training-only settings,
options read only by fairseq's other tasks or only together with a refused one), and a refusal (the reason).
"""
from __future__ import annotations

from dataclasses import MISSING, fields
from typing import Any, Dict, Iterator, Tuple

from fairseq_headprune.errors import UserError

DECODE = "decode"
SAME_CALL = "same call"
INERT = "inert"

_TRAINING = INERT  # read by fairseq-train only
_LOGGING = INERT
_SAMPLING = ("samples at random: every study compares decodes (of masks, budgets, checkpoints), which random "
             "samples turn into noise; use beam search")

RULES: Dict[str, Dict[str, str]] = {
    "generation": {
        "beam": DECODE, "max_len_a": DECODE, "max_len_b": DECODE, "min_len": DECODE, "match_source_len": DECODE,
        "unnormalized": DECODE, "lenpen": DECODE, "unkpen": DECODE,
        "temperature": DECODE,
        "nbest": INERT,  # only the best hypothesis is scored, as fairseq-generate's own BLEU scores it
        "no_early_stop": INERT,  # deprecated: fairseq 0.12's generator ignores it
        "no_beamable_mm": INERT,  # BeamableMM exists in fconv models only
        "beam_mt": INERT, "max_len_a_mt": INERT, "max_len_b_mt": INERT, "lenpen_mt": INERT,  # speech-to-speech only
        "eos_token": INERT,  # speech tasks only
        "iter_decode_eos_penalty": INERT, "iter_decode_max_iter": INERT, "iter_decode_force_max_iter": INERT,
        "iter_decode_with_beam": INERT, "iter_decode_with_external_reranker": INERT, "retain_iter_history": INERT,
        "decoding_format": INERT,  # iterative refinement (non-autoregressive tasks) only
        "sacrebleu": INERT,  # how fairseq-generate scores; the studies score with sacreBLEU themselves
        "print_step": INERT,
        "no_seed_provided": INERT,  # fairseq's own bookkeeping of --seed
        "diverse_beam_strength": INERT,  # only with --diverse-beam-groups (refused)
        "lm_weight": INERT,  # only with --lm-path (refused)
        "retain_dropout_modules": INERT,  # only with --retain-dropout (refused)
        "replace_unk": "needs alignments and raw-text data, which the studies' decoding does not keep",
        "score_reference": "scores the references instead of translating; the studies translate",
        "prefix_size": "forcing the reference's first tokens is not implemented in the studies' decoding",
        "sampling": _SAMPLING, "sampling_topk": _SAMPLING, "sampling_topp": _SAMPLING,
        "constraints": "lexically constrained decoding is not implemented in the studies' decoding",
        "diverse_beam_groups": "diverse beam search is not implemented in the studies' decoding (masks share beams)",
        "diversity_rate": "diverse beam search is not implemented in the studies' decoding (masks share beams)",
        "print_alignment": "the studies print no alignments and decode without them",
        # fairseq 0.12's CPU blocker compares the n-gram at the padded end of its token buffer, so it blocks
        # nothing: fairseq-generate ignores the option too (tests/test_fairseq_options.py shows both unchanged)
        "no_repeat_ngram_size": "fairseq 0.12's n-gram blocker blocks nothing on the CPU (fairseq-generate's output "
                                "is unchanged by it too), so the option would be recorded but not applied",
        "lm_path": "language-model fusion is not implemented in the studies' decoding",
        "retain_dropout": "decodes with dropout on are random, and the studies compare decodes",
    },
    "common": {
        "seed": SAME_CALL,  # to the batch iterator, as fairseq-generate passes it; decoding has no randomness left
        "cpu": INERT,  # the studies run on the CPU
        "user_dir": SAME_CALL,
        "no_progress_bar": _LOGGING, "log_interval": _LOGGING, "log_format": _LOGGING, "log_file": _LOGGING,
        "aim_repo": _LOGGING, "aim_run_hash": _LOGGING, "tensorboard_logdir": _LOGGING, "wandb_project": _LOGGING,
        "azureml_logging": _LOGGING, "profile": _LOGGING, "reset_logging": _LOGGING, "suppress_crashes": _LOGGING,
        "fp16_no_flatten_grads": _TRAINING, "fp16_init_scale": _TRAINING, "fp16_scale_window": _TRAINING,
        "fp16_scale_tolerance": _TRAINING, "on_cpu_convert_precision": _TRAINING, "min_loss_scale": _TRAINING,
        "threshold_loss_scale": _TRAINING, "amp": _TRAINING, "amp_batch_retries": _TRAINING,
        "amp_init_scale": _TRAINING, "amp_scale_window": _TRAINING, "empty_cache_freq": _TRAINING,
        "all_gather_list_size": _TRAINING, "quantization_config_path": _TRAINING, "use_plasma_view": _TRAINING,
        "plasma_path": _TRAINING,
        "fp16": "the studies compute in fp32 on the CPU (fairseq-generate would halve the model; "
                "--memory-efficient-fp16 sets --fp16 too)",
        "memory_efficient_fp16": "the studies compute in fp32 on the CPU",
        "bf16": "the studies compute in fp32 on the CPU",
        "memory_efficient_bf16": "the studies compute in fp32 on the CPU",
        "tpu": "the studies run on the CPU (fairseq sets --tpu for --bf16 and --memory-efficient-bf16 too)",
        "model_parallel_size": "model-parallel checkpoints are not supported",
    },
    "common_eval": {
        "path": SAME_CALL, "model_overrides": SAME_CALL, "post_process": SAME_CALL,  # --remove-bpe: test_evaluate.py
        "quiet": INERT,
        "results_path": "is fairseq-generate's output file; this command writes into --results-dir",
    },
    "dataset": {
        "gen_subset": SAME_CALL, "max_tokens": SAME_CALL, "batch_size": SAME_CALL, "dataset_impl": SAME_CALL,
        "skip_invalid_size_inputs_valid_test": SAME_CALL,  # a set missing a sentence is refused (loading.batches)
        "num_shards": SAME_CALL, "shard_id": SAME_CALL,  # split the masks of a sweep, never the data
        # batching only (never a hypothesis): rounding batch sizes makes fairseq 0.12 drop sentences, so it is not
        # passed on (see loading.batches); padding to a multiple and loader processes change no result
        "required_batch_size_multiple": INERT, "required_seq_len_multiple": INERT, "num_workers": INERT,
        "data_buffer_size": INERT,
        "train_subset": _TRAINING, "valid_subset": _TRAINING, "combine_valid_subsets": _TRAINING,
        "ignore_unused_valid_subsets": _TRAINING, "validate_interval": _TRAINING,
        "validate_interval_updates": _TRAINING, "validate_after_updates": _TRAINING,
        "fixed_validation_seed": _TRAINING, "disable_validation": _TRAINING, "max_tokens_valid": _TRAINING,
        "batch_size_valid": _TRAINING, "max_valid_steps": _TRAINING, "curriculum": _TRAINING,
        "grouped_shuffling": _TRAINING, "update_epoch_batch_itr": _TRAINING, "update_ordered_indices_seed": _TRAINING,
    },
    "checkpoint": {
        "checkpoint_suffix": "sharded or suffixed checkpoints are not supported: name the file with --path",
        "checkpoint_shard_count": "sharded checkpoints are not supported",
        "model_parallel_size": "model-parallel checkpoints are not supported",
        **{name: _TRAINING for name in (
            "save_dir", "restore_file", "continue_once", "finetune_from_model", "reset_dataloader",
            "reset_lr_scheduler", "reset_meters", "reset_optimizer", "optimizer_overrides", "save_interval",
            "save_interval_updates", "keep_interval_updates", "keep_interval_updates_pattern", "keep_last_epochs",
            "keep_best_checkpoints", "no_save", "no_epoch_checkpoints", "no_last_checkpoints",
            "no_save_optimizer_state", "best_checkpoint_metric", "maximize_best_checkpoint_metric", "patience",
            "load_checkpoint_on_all_dp_ranks", "write_checkpoints_asynchronously")},
    },
    "task": {  # fairseq's translation task and translation_headprune
        "data": SAME_CALL, "source_lang": SAME_CALL, "target_lang": SAME_CALL, "dataset_impl": SAME_CALL,
        "load_alignments": SAME_CALL, "num_batch_buckets": SAME_CALL,
        "left_pad_source": SAME_CALL, "left_pad_target": SAME_CALL, "truncate_source": DECODE,
        "max_source_positions": DECODE, "max_target_positions": SAME_CALL, "required_seq_len_multiple": SAME_CALL,
        "upsample_primary": _TRAINING, "train_subset": _TRAINING, "gate_lr_scale": _TRAINING,
        "eval_bleu": _TRAINING, "eval_bleu_args": _TRAINING, "eval_bleu_detok": _TRAINING,
        "eval_bleu_detok_args": _TRAINING, "eval_tokenized_bleu": _TRAINING, "eval_bleu_remove_bpe": _TRAINING,
        "eval_bleu_print_samples": _TRAINING,
        "gated_types": SAME_CALL, "gate_temperature": SAME_CALL, "gate_init_log_alpha": SAME_CALL,  # build_model
        "mask_heads": "the studies set and clear head masks themselves, so a fixed mask would be overridden; "
                      "remove the heads first (fairseq-headprune remove) and study the smaller checkpoint",
    },
}
# sections applied whole: the options of the chosen --bpe and --tokenizer go to task.build_bpe/build_tokenizer, as
# fairseq-generate passes them (compared with fairseq-generate in tests/test_evaluate.py)
WHOLE_SECTIONS = ("bpe", "tokenizer")


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _default(field) -> Any:
    if field.default is not MISSING:
        return field.default
    if field.default_factory is not MISSING:  # type: ignore[misc]
        return field.default_factory()  # type: ignore[misc]
    return MISSING


def section_dataclasses(cfg) -> Iterator[Tuple[str, type]]:
    """(section, its fairseq dataclass) for every section RULES covers; the task's from fairseq's task registry."""
    from fairseq.dataclass import configs
    from fairseq.tasks import TASK_DATACLASS_REGISTRY

    yield "generation", configs.GenerationConfig
    yield "common", configs.CommonConfig
    yield "common_eval", configs.CommonEvalConfig
    yield "dataset", configs.DatasetConfig
    yield "checkpoint", configs.CheckpointConfig
    task = TASK_DATACLASS_REGISTRY.get(_value(cfg.task, "_name"))
    if task is not None:
        yield "task", task


def _value(section, name: str) -> Any:
    return section.get(name) if hasattr(section, "get") else getattr(section, name, None)


def _differs(value: Any, default: Any) -> bool:
    if default is MISSING:
        return value is not None
    try:
        return value != default and not (value in (None, "") and default in (None, ""))
    except Exception:  # noqa: BLE001 - values of odd types that do not compare: treat as set
        return True


def refusals(cfg) -> Iterator[str]:
    """One message per option the user set that the studies cannot apply as fairseq-generate would."""
    for section, dataclass in section_dataclasses(cfg):
        values, rules = cfg.get(section), RULES[section]
        for field in fields(dataclass):
            if field.name == "_name" or values is None:
                continue
            default = _default(field)
            if isinstance(default, str) and default.startswith("${"):
                continue  # a copy of another section's field (fairseq's II(...)), checked there
            value = _value(values, field.name)
            if not _differs(value, default):
                continue
            rule = rules.get(field.name)
            if rule is None:
                yield (f"{flag(field.name)} ({section} option) is not supported by fairseq-headprune: it is not "
                       "known to be applied as fairseq-generate applies it")
            elif rule not in (DECODE, SAME_CALL, INERT):
                yield f"{flag(field.name)} is not supported: {rule}"
    scoring = cfg.get("scoring")
    if scoring is not None and _value(scoring, "_name") not in (None, "bleu"):  # fairseq-generate's default
        yield "--scoring is not supported: the studies score with sacreBLEU and compare-mt's bootstrap themselves"


def check(cfg) -> None:
    """Refuse (UserError, one line) the first option set that the studies cannot apply as fairseq-generate would."""
    for message in refusals(cfg):
        raise UserError(message)
