#!/usr/bin/env python3
"""Moses text steps of fairseq's translation recipes, in Python (sacremoses) instead of the Moses perl scripts.

`prepare` runs every text stage of fairseq's examples/translation/prepare-iwslt14.sh on the extracted IWSLT14
de-en/ folder (prepare-iwslt14.sh calls it); the other commands are the single Moses steps, also used by
prepare-wmt14en2fr.sh:

  prepare ORIG_DIR PREP_DIR [--workers N]        IWSLT14: tags, tokenise, clean, lowercase, valid/test split
  tokenize -l LANG [-a] [--normalize] [--lowercase] [--workers N] [IN OUT]...   (stdin -> stdout without files)
  detokenize -l LANG [IN OUT]...                 Moses detokeniser + XML unescape (for Moses-tokenised refs)
  sgm FILE                                       the <seg> texts of an sgm/xml file, XML entities unescaped
  clean [--ratio R] CORPUS L1 L2 OUT MIN MAX     clean-corpus-n.perl
  count FILE...                                  line counts (split on "\\n"; an unterminated last line counts)

Errors: one line "PROG: error: ..." on stderr, exit code 2 (PROG from $DATA_PREP_PROG).

Fidelity notes (checked against the IWSLT14 text fairseq's recipe produced, ../shared/data/iwslt14/tok):
- tokenizer.perl splits the period of the LAST word of a line unconditionally ("the u.k .", "usw ."); sacremoses
  (0.2) keeps it when the word looks like an abbreviation. `MosesTokenizerPerl` restores perl's rule.
- Lines are read split on "\\n" only (perl's <STDIN>), never on other Unicode line breaks; undecodable bytes
  pass through unchanged (surrogateescape).
- The IWSLT xml segments are NOT unescaped, as in fairseq's sed pipeline (its test set has "r &amp; amp ; d").
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import Iterable, Iterator

PROG = os.environ.get("DATA_PREP_PROG", "moses_steps.py")
ENC = dict(encoding="utf-8", errors="surrogateescape", newline="\n")

# fairseq's prepare-iwslt14.sh: `grep -v '<url>' | grep -v '<talkid>' | grep -v '<keywords>'`, then sed removes
# the title/description tags and keeps their text.
IWSLT_DROP_LINES = ("<url>", "<talkid>", "<keywords>")
IWSLT_STRIP_TAGS = ("<title>", "</title>", "<description>", "</description>")
IWSLT_TEST_SETS = ("IWSLT14.TED.dev2010", "IWSLT14.TEDX.dev2012", "IWSLT14.TED.tst2010",
                   "IWSLT14.TED.tst2011", "IWSLT14.TED.tst2012")
IWSLT_SRC, IWSLT_TGT = "de", "en"
IWSLT_VALID_EVERY = 23          # awk 'NR%23 == 0' -> valid
IWSLT_CLEAN = dict(ratio=1.5, min_len=1, max_len=175)


class DataError(Exception):
    """Bad input: reported as one line, exit code 2."""


def die(message: str) -> None:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    sys.exit(2)


# ---------------------------------------------------------------------------------------------- reading/writing
def iter_lines(path) -> Iterator[str]:
    """Lines of a file without their "\\n" (split on "\\n" only), streamed; the file is opened at once."""
    try:
        f = open(path, **ENC)
    except FileNotFoundError:
        raise DataError(f"missing {path}") from None
    except IsADirectoryError:
        raise DataError(f"{path} is a folder, not a text file") from None
    return _lines_of(f)


def _lines_of(f) -> Iterator[str]:
    with f:
        for line in f:
            yield line[:-1] if line.endswith("\n") else line


def read_lines(path) -> list[str]:
    return list(iter_lines(path))


def write_lines(path, lines: Iterable[str]) -> int:
    n = 0
    with open(path, "w", **ENC) as f:
        for line in lines:
            f.write(line + "\n")
            n += 1
    return n


def stdin_lines() -> Iterator[str]:
    stream = open(sys.stdin.fileno(), **ENC, closefd=False)
    for line in stream:
        yield line[:-1] if line.endswith("\n") else line


def stdout_writer():
    return open(sys.stdout.fileno(), "w", **ENC, closefd=False)


# ------------------------------------------------------------------------------------------------- tokenisation
_PERL_SPACE = re.compile(r"^\s*$")


def _moses_classes():
    from sacremoses import MosesDetokenizer, MosesPunctNormalizer, MosesTokenizer

    class MosesTokenizerPerl(MosesTokenizer):
        """sacremoses' port of tokenizer.perl, plus perl's rule for the last word of a line.

        tokenizer.perl (since 2017, the version fairseq's recipe clones): `if ($i == scalar(@words)-1) { $word =
        $pre." ."; }` -- a final "word." is always split, "U.K." included. Also caches the character classes that
        sacremoses rebuilds as sets on every call (10x faster, same result).
        """

        def __init__(self, lang="en"):
            super().__init__(lang=lang)
            self._lower = frozenset(self.IsLower)
            self._alpha = frozenset(self.IsAlpha)
            self._prefixes = frozenset(self.NONBREAKING_PREFIXES)
            self._numeric_only = frozenset(self.NUMERIC_ONLY_PREFIXES)

        def islower(self, text):
            return not set(text).difference(self._lower)

        def isanyalpha(self, text):
            return not self._alpha.isdisjoint(text)

        def handles_nonbreaking_prefixes(self, text):
            tokens = text.split()
            last = len(tokens) - 1
            for i, token in enumerate(tokens):
                m = re.search(r"^(\S+)\.$", token)
                if not m:
                    continue
                prefix = m.group(1)
                if i == last:
                    tokens[i] = prefix + " ."
                elif (("." in prefix and self.isanyalpha(prefix))
                      or (prefix in self._prefixes and prefix not in self._numeric_only)
                      or (tokens[i + 1] and self.islower(tokens[i + 1][0]))):
                    pass
                elif prefix in self._numeric_only and re.search(r"^[0-9]+", tokens[i + 1]):
                    pass
                else:
                    tokens[i] = prefix + " ."
            return " ".join(tokens)

    return MosesTokenizerPerl, MosesDetokenizer, MosesPunctNormalizer


def _perl_lc(text: str) -> str:
    """lowercase.perl (perl lc): like str.lower() but without Python's final-sigma special case."""
    return text.replace("Σ", "σ").lower()


class TextPipeline:
    """One line in, one line out: [punctuation normalisation + non-printing removal] -> tokenizer.perl -> [lc].

    normalize=True is fairseq's WMT chain `normalize-punctuation.perl | remove-non-printing-char.perl` (with
    sacremoses' fix of perl's standalone ’ -> " bug: every ’ becomes ', as fairseq's sed does for the test sets).
    """

    def __init__(self, lang: str, aggressive: bool = False, normalize: bool = False, lowercase: bool = False,
                 escape: bool = True):
        tokenizer_cls, _, normalizer_cls = _moses_classes()
        self.tokenizer = tokenizer_cls(lang=lang)
        self.normalizer = normalizer_cls(lang=lang) if normalize else None
        self.aggressive, self.lowercase, self.escape = aggressive, lowercase, escape

    def __call__(self, line: str) -> str:
        if self.normalizer is not None:
            line = self.normalizer.normalize(line)
            line = _non_printing().sub(" ", line)      # remove-non-printing-char.perl: s/\p{C}/ /g
        if _PERL_SPACE.match(line):                    # tokenizer.perl passes blank lines through
            return ""
        out = self.tokenizer.tokenize(line, aggressive_dash_splits=self.aggressive, return_str=True,
                                      escape=self.escape)
        return _perl_lc(out) if self.lowercase else out


_NON_PRINTING_RE = None


def _non_printing():
    """\\p{C} (control, format, unassigned, private use), compiled once; `regex` comes with sacremoses."""
    global _NON_PRINTING_RE
    if _NON_PRINTING_RE is None:
        import regex

        _NON_PRINTING_RE = regex.compile(r"\p{C}")
    return _NON_PRINTING_RE


_WORKER_PIPELINE = None


def _init_worker(kwargs):
    global _WORKER_PIPELINE
    _WORKER_PIPELINE = TextPipeline(**kwargs)


def _work(line):
    return _WORKER_PIPELINE(line)


def process_lines(lines: Iterable[str], workers: int = 1, **kwargs) -> Iterator[str]:
    """TextPipeline(**kwargs) over lines, in order; workers > 1 uses a process pool."""
    if workers <= 1:
        pipeline = TextPipeline(**kwargs)
        for line in lines:
            yield pipeline(line)
        return
    from multiprocessing import Pool

    with Pool(workers, initializer=_init_worker, initargs=(kwargs,)) as pool:
        yield from pool.imap(_work, lines, chunksize=2000)


def tokenize_line(line: str, lang: str, **kwargs) -> str:
    return TextPipeline(lang, **kwargs)(line)


def detokenize_lines(lines: Iterable[str], lang: str) -> Iterator[str]:
    """Moses-tokenised text back to plain text: detokenizer.perl with XML unescaping (&apos; &quot; &amp; ...)."""
    _, detokenizer_cls, _ = _moses_classes()
    detok = detokenizer_cls(lang=lang)
    for line in lines:
        yield detok.detokenize(line.split(), return_str=True, unescape=True)


# ---------------------------------------------------------------------------------------------------- xml / sgm
_SEG_OPEN = re.compile(r"<seg\b[^>]*>[ \t\n\r\f\v]*")      # sed 's/<seg id="[0-9]*">\s*//g' (\s: ASCII in sed)
_SEG_CLOSE = re.compile(r"[ \t\n\r\f\v]*</seg>[ \t\n\r\f\v]*")
_XML_ENTITY = re.compile(r"&(amp|lt|gt|quot|apos|#[0-9]+|#[xX][0-9a-fA-F]+);")
_XML_NAMED = {"amp": "&", "lt": "<", "gt": ">", "quot": '"', "apos": "'"}


def xml_unescape(text: str) -> str:
    """The five XML entities and numeric character references, in one pass (no double unescaping)."""
    def repl(m):
        name = m.group(1)
        if name[0] != "#":
            return _XML_NAMED[name]
        try:
            return chr(int(name[2:], 16) if name[1] in "xX" else int(name[1:]))
        except (ValueError, OverflowError):
            return m.group(0)
    return _XML_ENTITY.sub(repl, text)


def xml_segments(lines: Iterable[str], unescape: bool = True, curly_apostrophe: bool = False) -> Iterator[str]:
    """Texts of the <seg id=..>...</seg> lines: fairseq's `grep '<seg id' | sed ...` [| sed "s/’/'/g"].

    unescape=False keeps entities as they are, curly_apostrophe=True turns ’ into ' (both as fairseq's IWSLT
    recipe). The defaults give the plain text of an sgm file (WMT's newstest2014-fren.en == its -src.en.sgm).
    """
    for line in lines:
        if "<seg" not in line:
            continue
        text = _SEG_CLOSE.sub("", _SEG_OPEN.sub("", line))
        if unescape:
            text = xml_unescape(text)
        if curly_apostrophe:
            text = text.replace("’", "'")
        yield text


def strip_train_tags(lines: Iterable[str]) -> Iterator[str]:
    """The IWSLT train.tags filter: drop url/talkid/keywords lines, keep title/description text without tags."""
    for line in lines:
        if any(tag in line for tag in IWSLT_DROP_LINES):
            continue
        for tag in IWSLT_STRIP_TAGS:
            line = line.replace(tag, "")
        yield line


# -------------------------------------------------------------------------------------------------------- clean
_WS = re.compile(r"\s+")


def clean_pairs(src: Iterable[str], tgt: Iterable[str], ratio: float = 9.0, min_len: int = 1, max_len: int = 100,
                max_word_length: int = 1000, names=("L1", "L2")) -> Iterator[tuple[str, str]]:
    """clean-corpus-n.perl, streamed: whitespace-normalised pairs with lengths in [min, max] and within ratio."""
    factored = None
    too_long = re.compile(r"[^\s|]{%d}" % (max_word_length + 1))
    src, tgt = iter(src), iter(tgt)
    n = 0
    for n, f in enumerate(src, start=1):
        e = next(tgt, None)
        if e is None:
            raise DataError(f"{names[1]} is shorter than {names[0]} ({n - 1} lines)")
        if factored is None:
            factored = "|" in e or "|" in f
        if not factored:
            f, e = f.replace("|", ""), e.replace("|", "")
        f = _WS.sub(" ", f).removeprefix(" ").removesuffix(" ")
        e = _WS.sub(" ", e).removeprefix(" ").removesuffix(" ")
        if not f or not e:
            continue
        fc, ec = len(f.split(" ")), len(e.split(" "))
        if ec > max_len or fc > max_len or ec < min_len or fc < min_len:
            continue
        if ec / fc > ratio or fc / ec > ratio:
            continue
        if too_long.search(e) or too_long.search(f):
            continue
        if re.search(r"[ |]\|", f) or re.search(r"[ |]\|", e):
            raise DataError(f"blank factor on line {n} of {names[0]}/{names[1]}")
        yield f, e
    if next(tgt, None) is not None:
        raise DataError(f"{names[1]} is longer than {names[0]} ({n} lines)")


def clean_corpus(src: list[str], tgt: list[str], **kwargs) -> tuple[list[str], list[str]]:
    """clean_pairs as two lists; line counts must agree."""
    if len(src) != len(tgt):
        names = kwargs.get("names", ("L1", "L2"))
        raise DataError(f"{names[0]} has {len(src)} lines but {names[1]} has {len(tgt)}")
    pairs = list(clean_pairs(src, tgt, **kwargs))
    return [f for f, _ in pairs], [e for _, e in pairs]


# ------------------------------------------------------------------------------------------------ IWSLT14 stages
def iwslt_files(orig: Path) -> dict:
    """The files of an extracted IWSLT14 de-en/ folder that the recipe reads; DataError when one is missing."""
    files = {}
    for lang in (IWSLT_SRC, IWSLT_TGT):
        files["train", lang] = orig / f"train.tags.de-en.{lang}"
        for name in IWSLT_TEST_SETS:
            files[name, lang] = orig / f"{name}.de-en.{lang}.xml"
    missing = [str(p) for p in files.values() if not p.is_file()]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise DataError(f"missing {missing[0]}{more}: not an extracted IWSLT14 de-en folder")
    return files


def prepare_iwslt(orig: Path, prep: Path, workers: int = 1, log=sys.stderr) -> dict:
    """fairseq's text stages: PREP/{train,valid,test}.tok.{de,en} (tokenised, lowercased), intermediates in PREP/tmp.

    Returns the line counts {(split, lang): n}.
    """
    files = iwslt_files(orig)
    # read and check everything before any work: bad input fails fast, with one line
    raw = {lang: read_lines(files["train", lang]) for lang in (IWSLT_SRC, IWSLT_TGT)}
    kept = {lang: list(strip_train_tags(raw[lang])) for lang in raw}
    if len(kept[IWSLT_SRC]) != len(kept[IWSLT_TGT]):
        raise DataError(f"{files['train', IWSLT_SRC]} has {len(kept[IWSLT_SRC])} text lines but "
                        f"{files['train', IWSLT_TGT]} has {len(kept[IWSLT_TGT])} (after removing the tag lines)")
    if not kept[IWSLT_SRC]:
        raise DataError(f"{files['train', IWSLT_SRC]} has no text lines")
    segs = {}
    for name in IWSLT_TEST_SETS:
        for lang in (IWSLT_SRC, IWSLT_TGT):
            segs[name, lang] = list(xml_segments(read_lines(files[name, lang]), unescape=False,
                                                  curly_apostrophe=True))
        if len(segs[name, IWSLT_SRC]) != len(segs[name, IWSLT_TGT]) or not segs[name, IWSLT_SRC]:
            raise DataError(f"{files[name, IWSLT_SRC]} has {len(segs[name, IWSLT_SRC])} <seg> lines but "
                            f"{files[name, IWSLT_TGT]} has {len(segs[name, IWSLT_TGT])}")
    tmp = prep / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    print(f"tokenising {len(kept[IWSLT_SRC])} training pairs", file=log)
    tok = {}
    for lang in kept:
        tok[lang] = list(process_lines(kept[lang], workers=workers, lang=lang))
        write_lines(tmp / f"train.tags.de-en.tok.{lang}", tok[lang])
    names = tuple(f"train.tags.de-en.tok.{lang}" for lang in (IWSLT_SRC, IWSLT_TGT))
    clean_src, clean_tgt = clean_corpus(tok[IWSLT_SRC], tok[IWSLT_TGT], **IWSLT_CLEAN, names=names)
    print(f"clean-corpus: {len(clean_src)} of {len(tok[IWSLT_SRC])} pairs kept (ratio 1.5, length 1..175)", file=log)
    counts = {}
    for lang, lines in ((IWSLT_SRC, clean_src), (IWSLT_TGT, clean_tgt)):
        write_lines(tmp / f"train.tags.de-en.clean.{lang}", lines)
        lowered = [_perl_lc(x) for x in lines]
        write_lines(tmp / f"train.tags.de-en.{lang}", lowered)
        counts["valid", lang] = write_lines(prep / f"valid.tok.{lang}", (x for n, x in enumerate(lowered, 1)
                                                                          if n % IWSLT_VALID_EVERY == 0))
        counts["train", lang] = write_lines(prep / f"train.tok.{lang}", (x for n, x in enumerate(lowered, 1)
                                                                          if n % IWSLT_VALID_EVERY != 0))
    test = {IWSLT_SRC: [], IWSLT_TGT: []}
    for name in IWSLT_TEST_SETS:
        for lang in test:
            lines = list(process_lines(segs[name, lang], workers=workers, lang=lang, lowercase=True))
            write_lines(tmp / f"{name}.de-en.{lang}", lines)
            test[lang] += lines
    for lang in test:
        counts["test", lang] = write_lines(prep / f"test.tok.{lang}", test[lang])
    return counts


# ---------------------------------------------------------------------------------------------------------- CLI
def _in_out_pairs(files: list[str]):
    if len(files) % 2:
        raise DataError("files come in IN OUT pairs")
    return [(files[i], files[i + 1]) for i in range(0, len(files), 2)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("prepare")
    s.add_argument("orig")
    s.add_argument("prep")
    s.add_argument("--workers", type=int, default=1)
    s = sub.add_parser("tokenize")
    s.add_argument("-l", "--lang", required=True)
    s.add_argument("-a", "--aggressive", action="store_true")
    s.add_argument("--normalize", action="store_true")
    s.add_argument("--lowercase", action="store_true")
    s.add_argument("--no-escape", action="store_true")
    s.add_argument("--workers", type=int, default=1)
    s.add_argument("files", nargs="*")
    s = sub.add_parser("detokenize")
    s.add_argument("-l", "--lang", required=True)
    s.add_argument("files", nargs="*")
    s = sub.add_parser("sgm")
    s.add_argument("file")
    s = sub.add_parser("clean")
    s.add_argument("--ratio", type=float, default=9.0)
    for name in ("corpus", "l1", "l2", "out"):
        s.add_argument(name)
    s.add_argument("min", type=int)
    s.add_argument("max", type=int)
    s = sub.add_parser("count")
    s.add_argument("files", nargs="+")
    args = p.parse_args(argv)
    try:
        if args.cmd == "prepare":
            counts = prepare_iwslt(Path(args.orig), Path(args.prep), workers=args.workers)
            print(" ".join(f"{split}={counts[split, IWSLT_SRC]}" for split in ("train", "valid", "test")),
                  file=sys.stderr)
        elif args.cmd == "tokenize":
            opts = dict(lang=args.lang, aggressive=args.aggressive, normalize=args.normalize,
                        lowercase=args.lowercase, escape=not args.no_escape)
            if not args.files:
                with stdout_writer() as out:
                    for line in process_lines(stdin_lines(), workers=args.workers, **opts):
                        out.write(line + "\n")
            for src, dst in _in_out_pairs(args.files):
                write_lines(dst, process_lines(iter_lines(src), workers=args.workers, **opts))
        elif args.cmd == "detokenize":
            if not args.files:
                with stdout_writer() as out:
                    for line in detokenize_lines(stdin_lines(), args.lang):
                        out.write(line + "\n")
            for src, dst in _in_out_pairs(args.files):
                write_lines(dst, detokenize_lines(iter_lines(src), args.lang))
        elif args.cmd == "sgm":
            segs = list(xml_segments(read_lines(args.file)))
            if not segs:
                raise DataError(f"{args.file} has no <seg> lines")
            with stdout_writer() as out:
                for line in segs:
                    out.write(line + "\n")
        elif args.cmd == "clean":
            names = (f"{args.corpus}.{args.l1}", f"{args.corpus}.{args.l2}")
            pairs = clean_pairs(iter_lines(names[0]), iter_lines(names[1]), ratio=args.ratio,
                                min_len=args.min, max_len=args.max, names=names)
            kept = 0
            with open(f"{args.out}.{args.l1}", "w", **ENC) as out_src, \
                    open(f"{args.out}.{args.l2}", "w", **ENC) as out_tgt:
                for f, e in pairs:
                    out_src.write(f + "\n")
                    out_tgt.write(e + "\n")
                    kept += 1
            print(f"clean-corpus: {kept} pairs kept (ratio {args.ratio}, length {args.min}..{args.max})",
                  file=sys.stderr)
        elif args.cmd == "count":
            for f in args.files:
                print(sum(1 for _ in iter_lines(f)))
    except DataError as e:
        die(str(e))
    except BrokenPipeError:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
