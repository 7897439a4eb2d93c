"""The deployable folder: what `export-ct2` and `compress` write beside the CTranslate2 model (config.json, model.bin,
the vocabularies) so that it goes from raw text to raw text wherever it is copied.

  translate.json         the tokenizer and its options (fairseq's --tokenizer), the subword model (--bpe), the
                         language tokens fairseq puts before the source and forces first in the target, the symbols
                         its output drops, and the decoding options the export was checked with
  bpe.codes              subword-nmt's codes (--bpe subword_nmt), or
  fastbpe.codes          fastBPE's codes (--bpe fastbpe: the WMT'19 releases' bpecodes), or
  sentencepiece.model    the SentencePiece model (--bpe sentencepiece)
  README.md              how to use it: `fairseq-headprune translate`, or a snippet using only ctranslate2 and the
                         tokenizer's own libraries

Every path in translate.json is a file name inside the folder. Tokenizers and subword models other than Moses,
`space`, subword-nmt, fastBPE and SentencePiece are refused in one line (their files are not carried); so are
fastBPE codes it cannot read (the `fastBPE` module would crash the process on them).
"""
from __future__ import annotations

import json
import os
import shutil
from typing import Dict, List, Optional, Tuple

from omegaconf import OmegaConf

from fairseq_headprune.engines.ct2 import translate_options
from fairseq_headprune.errors import UserError

SETTINGS = "translate.json"
GUIDE = "README.md"
CARD = "MODEL_CARD.md"
# fairseq's --bpe -> (its option naming the file, the file's name in the folder)
SUBWORD_FILES = {"subword_nmt": ("bpe_codes", "bpe.codes"), "fastbpe": ("bpe_codes", "fastbpe.codes"),
                 "sentencepiece": ("sentencepiece_model", "sentencepiece.model")}
TOKENIZERS = ("moses", "space")
FILES = (SETTINGS, GUIDE, CARD, *(name for _, name in SUBWORD_FILES.values()))
FORMAT = 1


def _section(node) -> Optional[Dict]:
    """A fairseq config section (cfg.tokenizer, cfg.bpe) as a plain dict with its interpolations resolved."""
    if node is None:
        return None
    values = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else dict(vars(node))
    return values if values.get("_name") else None


def check_tokenization(tokenizer: Optional[Dict], bpe: Optional[Dict]) -> None:
    """What the folder can carry: Moses or `space` and subword-nmt, fastBPE or SentencePiece (or none), in one line
    if not."""
    if tokenizer and tokenizer["_name"] not in TOKENIZERS:
        raise UserError(f"--tokenizer {tokenizer['_name']}: the deployable folder carries "
                        f"{', '.join(TOKENIZERS)} or none")
    if bpe and bpe["_name"] not in SUBWORD_FILES:
        raise UserError(f"--bpe {bpe['_name']}: the deployable folder carries {', '.join(SUBWORD_FILES)} or none")
    if bpe and bpe["_name"] == "sentencepiece" and bpe.get("sentencepiece_enable_sampling"):
        raise UserError("--sentencepiece-enable-sampling: a deployed model segments its input one way")


def check_fastbpe_codes(path: str) -> None:
    """fastBPE codes as its reader takes them, `LEFT RIGHT COUNT` on every line; one line when not (the `fastBPE`
    module crashes the process on anything else)."""
    try:
        with open(path, "rb") as f:
            for number, line in enumerate(f, 1):
                if len(line.rstrip(b"\n").split(b" ")) != 3:
                    raise UserError(f"{path} line {number} is not fastBPE codes (`LEFT RIGHT COUNT` a line, as "
                                    "`fastbpe learnbpe` writes them)")
    except OSError as e:
        raise UserError(f"cannot read {path}: {e}") from None


def settings(cfg, decoding: Dict, source_prefix: List[str], target_prefix: List[str], strip: List[str],
             max_positions: int, max_source_positions: int) -> Dict:
    """translate.json's content from fairseq's configuration (`cfg.tokenizer`, `cfg.bpe`, `cfg.generation`) and what
    the task adds (language tokens); the subword model's file is named by its name in the folder. `max_positions`:
    the decoder's, `max_source_positions`: the encoder's (a longer source is truncated to it, EOS included)."""
    tokenizer, bpe = _section(cfg.tokenizer), _section(cfg.bpe)
    check_tokenization(tokenizer, bpe)
    files = {}
    if bpe:
        option, name = SUBWORD_FILES[bpe["_name"]]
        if not bpe.get(option) or not os.path.isfile(bpe[option]):
            raise UserError(f"--{option.replace('_', '-')}: no such file: {bpe.get(option)}")
        if bpe["_name"] == "fastbpe":
            check_fastbpe_codes(bpe[option])
        files[name] = bpe[option]
        bpe = {**bpe, option: name}
    generation = cfg.generation
    return {"format": FORMAT, "tokenizer": tokenizer, "bpe": bpe, "source_prefix": list(source_prefix),
            "target_prefix": list(target_prefix), "strip": sorted(set(strip)),
            "decoding": {**decoding, "max_len_a": float(generation.max_len_a), "max_len_b": int(generation.max_len_b),
                         "max_positions": int(max_positions), "max_source_positions": int(max_source_positions)},
            "files": files}


def write(folder: str, content: Dict) -> None:
    """translate.json, the subword model's file and README.md into `folder` (a model folder being staged)."""
    files = content.pop("files")
    content["decoding"].update(translate_options(folder))  # a folder with a vocabulary map decodes with it
    for name, source in files.items():
        shutil.copyfile(source, os.path.join(folder, name))
    with open(os.path.join(folder, SETTINGS), "w", encoding="utf-8") as f:
        json.dump(content, f, indent=1, ensure_ascii=False)
        f.write("\n")
    with open(os.path.join(folder, GUIDE), "w", encoding="utf-8") as f:
        f.write(guide(content))


def model_folder(path: str) -> str:
    """The CTranslate2 folder of `path`: the folder itself, or a compress output's ct2/ (one line when neither)."""
    for folder in (path, os.path.join(path, "ct2")):
        if os.path.isfile(os.path.join(folder, SETTINGS)) and os.path.isfile(os.path.join(folder, "model.bin")):
            return folder
    if os.path.isfile(os.path.join(path, "model.bin")):
        raise UserError(f"{path} has no {SETTINGS}: export it again with this version (export-ct2 or compress) to "
                        "carry its tokenizer")
    raise UserError(f"{path} is not a deployable model folder (no {SETTINGS} and model.bin in it or in its ct2/)")


def source_positions(content: Dict) -> int:
    """The most source tokens (EOS included) a folder's model reads: the encoder's positions (folders written before
    they were recorded: the decoder's, which fairseq gives the same by default)."""
    decoding = content["decoding"]
    return int(decoding.get("max_source_positions") or decoding["max_positions"])


def read(folder: str) -> Dict:
    """translate.json of a model folder, its files checked (one line when one is missing or of another format)."""
    path = os.path.join(folder, SETTINGS)
    try:
        with open(path, encoding="utf-8") as f:
            content = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"cannot read {path}: {e}") from None
    if not isinstance(content, dict) or content.get("format") != FORMAT:
        raise UserError(f"{path} is not a translate.json this version reads (format {FORMAT})")
    bpe = content.get("bpe")
    if bpe:
        name = bpe[SUBWORD_FILES[bpe["_name"]][0]]
        if not os.path.isfile(os.path.join(folder, name)):
            raise UserError(f"{folder} lacks {name}, the {bpe['_name']} model it was exported with")
        if bpe["_name"] == "fastbpe":
            check_fastbpe_codes(os.path.join(folder, name))
    return content


# --------------------------------------------------------------------------------------------- README.md


def guide(content: Dict) -> str:
    """README.md of the folder: what it holds, the command, and the snippet for its own tokenization."""
    tokenizer, bpe = content.get("tokenizer"), content.get("bpe")
    what = ", ".join(filter(None, [f"{tokenizer['_name']} tokenizer" if tokenizer else None,
                                   f"{bpe['_name']} ({bpe[SUBWORD_FILES[bpe['_name']][0]]})" if bpe else None]))
    return "\n".join([
        "# A CTranslate2 translation model, from raw text to raw text", "",
        "Written by `fairseq-headprune export-ct2` (or `compress`) from a fairseq checkpoint; its translations were "
        "checked against fairseq-generate's before it was written. "
        f"{CARD}, where present, says what was removed and how it was measured.", "",
        "- `config.json`, `model.bin`, the vocabulary: the CTranslate2 model",
        f"- `{SETTINGS}`: its tokenization ({what or 'none: the input is the tokens fairseq reads'}), language "
        "tokens and the decoding options it was checked with",
        *([f"- `{bpe[SUBWORD_FILES[bpe['_name']][0]]}`: the subword model"] if bpe else []), "",
        "## Translate", "",
        "```bash", "fairseq-headprune translate THIS_FOLDER < input.txt > output.txt   # --beam, --batch-size, "
        "--compute-type", "```", "",
        "One raw sentence per line in, one detokenised translation per line out.", "",
        "## With CTranslate2 alone", "",
        "The same, one sentence at a time, with `ctranslate2` and the tokenizer's own libraries only (saved as "
        "`translate.py`: `python translate.py THIS_FOLDER < input.txt > output.txt`):", "",
        "```python", snippet(content), "```", "",
    ])


def _subword_lines(bpe: Dict) -> Tuple[List[str], List[str], str, str]:
    """The snippet's lines for the folder's subword model: imports, set-up, its encoding of `pieces` and its
    decoding of `text` (as fairseq's encoder for it does)."""
    if bpe["_name"] == "subword_nmt":
        separator = bpe.get("bpe_separator") or "@@"
        return (["from subword_nmt.apply_bpe import BPE"],
                [f"with open(os.path.join(folder, {bpe['bpe_codes']!r}), encoding=\"utf-8\") as codes:",
                 f"    bpe = BPE(codes, separator={separator!r})"],
                "pieces = bpe.process_line(pieces)",
                f"text = (text + \" \").replace({separator + ' '!r}, \"\").rstrip()")
    if bpe["_name"] == "fastbpe":
        return (["import fastBPE"], [f"bpe = fastBPE.fastBPE(os.path.join(folder, {bpe['bpe_codes']!r}))"],
                "pieces = bpe.apply([pieces])[0]", "text = (text + \" \").replace(\"@@ \", \"\").rstrip()")
    return (["import sentencepiece"],  # sentencepiece
            [f"spm = sentencepiece.SentencePieceProcessor(model_file=os.path.join(folder, "
             f"{bpe['sentencepiece_model']!r}))"],
            "pieces = \" \".join(spm.encode(pieces, out_type=str))",
            "text = text.replace(\" \", \"\").replace(\"\\u2581\", \" \").strip()")


def snippet(content: Dict) -> str:
    """Python that translates stdin to stdout with ctranslate2 and the tokenizer's own libraries only, in this
    folder's tokenization (as fairseq's encoders apply it)."""
    tokenizer, bpe, decoding = content.get("tokenizer"), content.get("bpe"), content["decoding"]
    imports = ["import sys", "", "import ctranslate2"]
    setup = ['folder = sys.argv[1] if len(sys.argv) > 1 else "."',
             'translator = ctranslate2.Translator(folder, device="cpu")']
    encode, decode = ["pieces = line"], []
    if tokenizer and tokenizer["_name"] == "moses":
        imports.append("from sacremoses import MosesDetokenizer, MosesTokenizer")
        setup += [f"tokenizer = MosesTokenizer(lang={tokenizer['source_lang']!r})",
                  f"detokenizer = MosesDetokenizer(lang={tokenizer['target_lang']!r})"]
        encode = [f"pieces = tokenizer.tokenize(line, aggressive_dash_splits="
                  f"{not tokenizer.get('moses_no_dash_splits', False)}, return_str=True, "
                  f"escape={not tokenizer.get('moses_no_escape', False)})"]
    elif tokenizer:  # space
        imports.append("import re")
        encode = ['pieces = re.sub(r"\\s+", " ", line).strip()']
    if bpe:
        more, steps, encode_step, decode_step = _subword_lines(bpe)
        imports, setup = ["import os", *imports, *more], setup + steps
        encode.append(encode_step)
        decode.append(decode_step)
    if tokenizer and tokenizer["_name"] == "moses":
        decode.append("text = detokenizer.detokenize(text.split())")
    options = {k: decoding[k] for k in ("beam_size", "length_penalty", "min_decoding_length",
                                        "no_repeat_ngram_size", "use_vmap") if k in decoding}
    prefix = content.get("target_prefix") or []
    lines = [*imports, "", *setup,
             f"source_prefix, target_prefix = {content.get('source_prefix') or []!r}, {prefix!r}",
             f"strip = set({content.get('strip') or []!r})",
             f"a, b, positions = {decoding['max_len_a']!r}, {decoding['max_len_b']!r}, {decoding['max_positions']!r}",
             f"source_positions = {source_positions(content)!r}",
             "for line in sys.stdin:",
             "    line = line.strip()  # as fairseq-interactive reads a line",
             "    if not line:",
             "        print()",
             "        continue",
             *[f"    {x}" for x in encode],
             "    tokens = (source_prefix + pieces.split())[:source_positions - 1]  # the encoder's positions, EOS "
             "included",
             "    cap = min(int(a * (len(tokens) + 1) + b), positions - 1)  # fairseq's max-len-a/b",
             "    result = translator.translate_batch([tokens], max_decoding_length=cap, "
             + ", ".join(f"{k}={v!r}" for k, v in options.items())
             + (", target_prefix=[target_prefix]" if prefix else "") + ")",
             "    text = \" \".join(t for t in result[0].hypotheses[0] if t not in strip)",
             *[f"    {x}" for x in decode],
             "    print(text)"]
    return "\n".join(lines)
