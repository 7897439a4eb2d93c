"""Loading checkpoints, tasks and data the way fairseq-generate does, with errors a user can act on.

Checkpoints are trusted files: fairseq pickles its configuration into them, and torch >= 2.6 refuses such
pickles by default (`weights_only=True`). `trust_fairseq_checkpoints()` is the one place where this package
lifts that default; never load a checkpoint you would not run as code.
"""
from __future__ import annotations

import ast
import copy
import os
import warnings
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import torch

from fairseq_headprune.errors import UserError
from fairseq_headprune.fairseq_io.trimmed_data import checkpoint_trim, holds_untrimmed, map_dataset, read_through_trim
from fairseq_headprune.tasks.any_task import with_head_masks

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the user module fairseq imports


def trust_fairseq_checkpoints() -> None:
    """Let fairseq's own torch.load calls unpickle checkpoints (torch >= 2.6 defaults to weights_only)."""
    os.environ.setdefault("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    warnings.filterwarnings("ignore", message="Environment variable TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD detected")


@dataclass
class Loaded:
    """A model ready for analysis: the fairseq config, task, model (eval mode, masks installed), saved cfg.
    The task is the one the options name, whatever it is, its class switched to its `_headprune` subclass."""

    cfg: Any
    task: Any
    model: Any
    saved_cfg: Any
    checkpoint: str


def _get(cfg, name: str):
    """A field of a config that may be a dict, an OmegaConf DictConfig or an argparse Namespace."""
    return cfg.get(name) if hasattr(cfg, "get") else getattr(cfg, name, None)


def _explain_load_failure(path: str, error: Exception) -> UserError:
    """fairseq reports a checkpoint whose architecture or task is not registered with an IndexError or a
    KeyError deep inside its registries; name the likely cause instead."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
        model_cfg = (state.get("cfg") or {}).get("model") or state.get("args")
        arch = _get(model_cfg, "arch") or _get(model_cfg, "_name")
    except Exception:  # the checkpoint itself is unreadable: report the original error
        return UserError(f"cannot load checkpoint {path}: {type(error).__name__}: {error}")
    from fairseq.models import ARCH_MODEL_REGISTRY

    if arch and arch not in ARCH_MODEL_REGISTRY:
        return UserError(
            f"checkpoint {path} uses architecture '{arch}', which no loaded module registers: it was trained "
            f"with a fairseq --user-dir; pass the same --user-dir"
        )
    return UserError(f"cannot load checkpoint {path}: {type(error).__name__}: {error}")


def _dictionary_hint(trim: Optional[Dict]) -> str:
    """What to do when the checkpoint does not fit DATA's dictionaries: a vocabulary trimmed by `shrink --keep-vocab`
    (its config says so) reads DATA binarised for the untrimmed model, or against the dictionaries beside it."""
    if not trim:
        return "is it the model's data directory?"
    return (f"its vocabulary was trimmed to {trim['source']['after']} source and {trim['target']['after']} target "
            "symbols by shrink --keep-vocab: use DATA binarised for the model it was trimmed from, or against the "
            "dict.*.txt written beside it")


def _unreadable(path: str, error: Exception) -> UserError:
    first = (str(error).strip().splitlines() or [""])[0]
    return UserError(f"cannot load checkpoint {path}: {type(error).__name__}: {first}")


# Files fairseq reads by option (section, field, option), each checked before anything loads: fairseq would
# otherwise stop with a traceback deep in sentencepiece, subword-nmt or its multilingual data manager.
INPUT_FILES = (
    ("bpe", "sentencepiece_model", "--sentencepiece-model"),
    ("bpe", "bpe_codes", "--bpe-codes"),
    ("task", "lang_dict", "--lang-dict"),
    ("task", "fixed_dictionary", "--fixed-dictionary"),
    ("task", "source_dict", "--source-dict"),
    ("task", "target_dict", "--target-dict"),
)


def missing_input_file(cfg) -> str:
    """The one-line complaint about the first input file an option names that does not exist, or ''."""
    for section, name, option in INPUT_FILES:
        part = _get(cfg, section)
        value = _get(part, name) if part is not None else None
        if isinstance(value, str) and value and not os.path.isfile(value):
            return f"{option}: no such file: {value}"
    return ""


def setup_task(task_cfg):
    """fairseq's setup_task, with a language or dictionary the data does not have as one line."""
    from fairseq import tasks

    name = _get(task_cfg, "_name") or _get(task_cfg, "task")
    try:
        task = tasks.setup_task(task_cfg)
    except (ValueError, FileNotFoundError) as e:  # check_langs' "language pair ... not in the language
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]  # dictionary"; a missing dict.LANG.txt
        raise UserError(f"--task {name}: {first}") from None
    if hasattr(task, "data_manager") and not (_get(task_cfg, "source_lang") and _get(task_cfg, "target_lang")):
        pairs = ",".join(_get(task_cfg, "lang_pairs") or [])
        raise UserError(f"--task {name} scores one language pair: give -s SRC -t TGT (the model's pairs: {pairs})")
    return task


def load(cfg) -> Loaded:
    """Set up the task and load the model of `cfg.common_eval.path` (one checkpoint) as fairseq-generate does."""
    from fairseq import utils

    trust_fairseq_checkpoints()
    utils.import_user_module(cfg.common)
    paths: List[str] = utils.split_paths(cfg.common_eval.path or "")
    if len(paths) != 1:
        raise UserError("--path must name exactly one checkpoint")
    path = paths[0]
    if not os.path.isfile(path):
        raise UserError(f"checkpoint not found: {path}")
    if not cfg.task.data or not os.path.isdir(cfg.task.data.split(os.pathsep)[0]):
        raise UserError(f"data directory not found: {cfg.task.data}")
    missing = missing_input_file(cfg)
    if missing:
        raise UserError(missing)
    task = with_head_masks(setup_task(cfg.task))
    models, saved_cfg = _ensemble(path, ast.literal_eval(cfg.common_eval.model_overrides), task, cfg)
    model = models[0]
    model.eval()
    return Loaded(cfg, task, model, saved_cfg, path)


def _ensemble(path: str, overrides, task, cfg, trimmed: bool = False):
    """fairseq's load_model_ensemble of the one checkpoint, each failure one line. A checkpoint whose vocabulary
    `shrink --keep-vocab` trimmed, given DATA binarised for the untrimmed model, is loaded again with the task
    reading DATA through the trim (trimmed_data.read_through_trim)."""
    from fairseq import checkpoint_utils

    try:
        return checkpoint_utils.load_model_ensemble([path], arg_overrides=overrides, task=task)
    except (IndexError, KeyError, AttributeError) as e:
        raise _explain_load_failure(path, e) from e
    except RuntimeError as e:
        if "moe_layer" in str(e) or "expert" in str(e):
            raise UserError(
                f"checkpoint {path} is a mixture-of-experts model (as NLLB-200's MoE 54B): fairseq 0.12 cannot build "
                "its expert layers (they live on fairseq's moe branch); this package handles dense models, such "
                "as NLLB-200's dense and distilled ones") from e
        if "size mismatch" in str(e) or "Missing key" in str(e):
            trim = checkpoint_trim(path)
            if trim and not trimmed and holds_untrimmed(task, trim):
                read_through_trim(task, trim, path)
                return _ensemble(path, overrides, task, cfg, trimmed=True)
            raise UserError(
                f"checkpoint {path} does not fit the dictionaries in {cfg.task.data}: "
                f"{str(e).splitlines()[0]} ({_dictionary_hint(trim)})"
            ) from e
        raise _unreadable(path, e) from e
    except UserError:
        raise
    except Exception as e:  # a truncated file, not a checkpoint at all, a model the data cannot build
        raise _unreadable(path, e) from e


def load_other(loaded, path: str) -> Loaded:
    """Another checkpoint loaded with the same options as `loaded` (task, data, generation)."""
    cfg = copy.deepcopy(loaded.cfg)
    cfg.common_eval.path = path
    return load(cfg)


def load_subset(loaded: Loaded, subset: str):
    """The subset's dataset, loaded as fairseq-generate loads it; a missing or empty subset is one line."""
    cfg, task = loaded.cfg, loaded.task
    try:  # once: translation_multi_simple_epoch fails on a second load of a split (fairseq 0.12)
        if subset not in task.datasets:
            task.load_dataset(subset, task_cfg=loaded.saved_cfg.task)
    except FileNotFoundError as e:
        raise UserError(f"no '{subset}' subset in {cfg.task.data}: {e}") from e
    except ValueError as e:  # numpy cannot map the empty files fairseq-preprocess writes for an empty text
        if "empty" not in str(e):
            raise
        raise UserError(f"subset '{subset}' of {cfg.task.data} is empty: there is nothing to score") from None
    dataset = task.dataset(subset)
    map_dataset(task, dataset)  # a trimmed checkpoint's ids, where DATA is binarised for the untrimmed model
    if len(dataset) == 0:
        raise UserError(f"subset '{subset}' of {cfg.task.data} is empty: there is nothing to score")
    refuse_unreachable_min_len(cfg.generation, _source_sizes(dataset), loaded.model.max_decoder_positions(), subset)
    return dataset


def _source_sizes(dataset):
    """Source lengths (with EOS) of a language-pair dataset, or None for a dataset that does not expose them."""
    sizes = getattr(dataset, "src_sizes", None)
    if sizes is None:
        sizes = getattr(dataset, "sizes", None)
        sizes = sizes[:, 0] if sizes is not None and getattr(sizes, "ndim", 1) == 2 else None
    return sizes


def refuse_unreachable_min_len(gen_cfg, src_sizes, max_positions: int, subset: str) -> None:
    """fairseq's generator asserts --min-len <= the longest hypothesis its batch allows (from the batch's longest
    source), so a --min-len above what the shortest source allows fails mid-decode, or not, by which sentences share
    its batch: refuse it before any work instead."""
    if gen_cfg.min_len <= 1 or src_sizes is None or len(src_sizes) == 0:
        return
    shortest = int(min(src_sizes))
    if gen_cfg.match_source_len:
        allowed, rule = shortest - 1, "--match-source-len: the source's length without EOS"
    else:
        allowed = min(int(gen_cfg.max_len_a * shortest + gen_cfg.max_len_b), max_positions - 1)
        capped = allowed == max_positions - 1
        rule = "the model's positions" if capped else "--max-len-a x source length + --max-len-b"
    if gen_cfg.min_len > allowed:
        raise UserError(f"--min-len {gen_cfg.min_len} is larger than the longest hypothesis allowed for the shortest "
                        f"source of '{subset}' ({allowed} tokens; {rule}): lower --min-len")


def batches(loaded: Loaded, subset: str, shuffle: bool = False):
    """The batches of a data subset, sized by --max-tokens/--batch-size as in fairseq-generate.

    Batch sizes are not rounded to --required-batch-size-multiple: fairseq 0.12's batch_by_size then drops
    the remainder (100 sentences, multiple 8: 96 are batched, 4 silently lost)."""
    from fairseq import utils

    cfg, task = loaded.cfg, loaded.task
    dataset = load_subset(loaded, subset)
    itr = task.get_batch_iterator(
        dataset=dataset,
        max_tokens=cfg.dataset.max_tokens,
        max_sentences=cfg.dataset.batch_size,
        max_positions=utils.resolve_max_positions(task.max_positions(), loaded.model.max_positions()),
        ignore_invalid_inputs=cfg.dataset.skip_invalid_size_inputs_valid_test,
        required_batch_size_multiple=1,
        seed=cfg.common.seed,
        num_workers=0,  # the batches are materialised at once: worker processes would only add start-up
    ).next_epoch_itr(shuffle=shuffle)
    samples = [s for s in itr if s and "net_input" in s]
    batched = sum(s["id"].numel() for s in samples)
    if batched != len(dataset):  # every result here is a corpus statistic: never score part of a set silently
        raise UserError(f"fairseq batched {batched} of the {len(dataset)} sentences of '{subset}' "
                        "(too long for the model's positions?)")
    return dataset, samples


def progress_for(cfg, prefix: str):
    """Wrap an iterable in fairseq's own progress bar, as --log-format and --no-progress-bar ask."""
    from fairseq.logging import progress_bar

    def wrap(items):
        return progress_bar.progress_bar(
            items, log_format=cfg.common.log_format, log_interval=1, prefix=prefix,
            default_log_format="tqdm" if not cfg.common.no_progress_bar else "none",
        )

    return wrap
