"""What attention heads do (Voita et al. 2019, Sections 4.1 and 5): confidence, and the functions of encoder
self-attention heads (positional, rare-token, syntactic), as pure functions of attention weights.

Attention weights are (heads, batch, queries, keys) tensors as `attention_capture` records them. Every function
returns sums and counts, so statistics of batches add up and a results log can resume between batches.

- Confidence: a head's maximum attention weight at a query, keys other than EOS only, averaged over queries.
  EOS is left out because heads park attention on it (Voita et al. exclude it); queries are the source tokens
  (encoder self-attention) or the generation steps (decoder sides), EOS queries excluded, as are decoder steps
  that see no key but EOS (the first step of decoder self-attention).
- Positional: the share of source tokens (EOS excluded) whose maximum attention weight over keys other than
  EOS goes to relative position -1 or +1; a head is positional when one of them reaches 90% (Voita et al.).
  EOS is left out of the maximum as for confidence: it is the last key, so a look at it would count as +1.
- Rare token: the share of source tokens whose maximum attention weight (over keys other than EOS, as above)
  goes to the least frequent token of the sentence (EOS excluded; ties: any of the least frequent tokens).
  Frequencies are training counts of the model's own tokens (BPE pieces): fairseq's dictionary counts, or
  counts from a given training text.
- Syntactic: for each dependency relation (nsubj, obj (UD v1 dobj), amod, advmod; subtypes like nsubj:pass
  count as their relation) and each direction (from the dependent to its governor, and back), the share of
  arcs where the query word's maximum attention goes to the other word; a head is syntactic for a relation
  when this accuracy beats, by at least 10 points (Voita et al.), the positional baseline that always picks
  the relation's most frequent relative position. Words are the parser's tokens, mapped to the model's BPE
  pieces by aligning their characters; attention between words follows Clark et al. (2019), since Voita et
  al. do not say how they merge subwords: attention *to* a word is the sum over its pieces, attention *from*
  a word the mean over its pieces. Attention to pieces of no word (EOS, unaligned) forms one more key, so a
  head that looks elsewhere scores a miss.
"""
from __future__ import annotations

import difflib
import re
from collections import Counter
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from fairseq_headprune.errors import UserError

RELATIONS = ("nsubj", "obj", "amod", "advmod")
DIRECTIONS = ("dep->head", "head->dep")
RELATION_KEYS = tuple(f"{r} {d}" for r in RELATIONS for d in DIRECTIONS)
_ALIASES = {"dobj": "obj"}
POSITIONAL_THRESHOLD = 0.9
SYNTACTIC_MARGIN = 0.10
RARE_THRESHOLD = 0.5


# -- confidence ---------------------------------------------------------------------------------------------

def confidence_sums(weights: torch.Tensor, query_mask: torch.Tensor, key_mask: torch.Tensor) -> Tuple[List[float], int]:
    """Sum over the queries in query_mask (batch, queries) of each head's maximum weight over the keys in
    key_mask (batch, keys), and the number of queries."""
    allowed = weights.masked_fill(~key_mask[None, :, None, :], 0.0)
    best = allowed.max(dim=-1).values  # (heads, batch, queries)
    mask = query_mask.unsqueeze(0).to(best.dtype)
    return (best * mask).sum(dim=(1, 2)).double().tolist(), int(query_mask.sum())


# -- positional and rare-token heads -------------------------------------------------------------------------

def positional_rare_counts(
    weights: torch.Tensor, src_tokens: torch.Tensor, pad: int, eos: int, frequencies: torch.Tensor
) -> Dict[str, object]:
    """For encoder self-attention weights (heads, batch, src, src): how many source tokens (EOS and padding
    excluded) each head sends its maximum weight (EOS keys left out) to position -1, to +1, and to the
    sentence's rarest token.

    frequencies: (vocabulary,) training counts of the model's tokens."""
    heads = weights.size(0)
    real = src_tokens.ne(pad) & src_tokens.ne(eos)  # (batch, src)
    # the key position of each query's maximum over keys other than EOS (heads park attention there, as for
    # confidence): with EOS last, the last token's look at EOS would otherwise count as "+1"
    not_eos = src_tokens.ne(eos)[None, :, None, :]
    target = weights.masked_fill(~not_eos, float("-inf")).argmax(dim=-1)  # (heads, batch, src)
    position = torch.arange(src_tokens.size(1), device=src_tokens.device)
    offset = target - position.view(1, 1, -1)
    counts = frequencies.to(src_tokens.device)[src_tokens].double().masked_fill(~real, float("inf"))
    rarest = counts.eq(counts.min(dim=1, keepdim=True).values) & real  # (batch, src)
    hits_rare = rarest.unsqueeze(0).expand(heads, -1, -1).gather(2, target)
    q = real.unsqueeze(0)
    return {
        "queries": int(real.sum()),
        "prev": ((offset == -1) & q).sum(dim=(1, 2)).tolist(),
        "next": ((offset == 1) & q).sum(dim=(1, 2)).tolist(),
        "rare": (hits_rare & q).sum(dim=(1, 2)).tolist(),
    }


# -- dependency parses ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Arc:
    relation: str  # one of RELATIONS
    dependent: int  # surface token index (0-based)
    governor: int


@dataclass(frozen=True)
class ParsedSentence:
    """A parse reduced to what the analysis needs: the surface tokens (a multiword token like German "zum" =
    "zu dem" is one surface token) and the arcs of the studied relations between surface tokens."""

    surface: Tuple[str, ...]
    arcs: Tuple[Arc, ...]


def read_conllu(path: str) -> List[ParsedSentence]:
    """The sentences of a CoNLL-U file, in order. Only ID, FORM, HEAD and DEPREL are read (a ten-column
    format: no library needed); empty nodes (ID 3.1) are ignored."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise UserError(f"cannot read parses {path}: {e.strerror}") from None
    sentences = []
    for number, block in enumerate(re.split(r"\n\s*\n", text.strip()), start=1):
        lines = [line for line in block.splitlines() if line.strip() and not line.startswith("#")]
        if lines:
            sentences.append(_parse_block(lines, path, number))
    return sentences


def _parse_block(lines: List[str], path: str, number: int) -> ParsedSentence:
    surface: List[str] = []
    word_to_surface: Dict[int, int] = {}
    range_end = 0
    words = []
    for line in lines:
        cols = line.split("\t")
        if len(cols) != 10:
            raise UserError(f"{path}: sentence {number}: not CoNLL-U (a line with {len(cols)} columns, not 10)")
        ident, form, head, deprel = cols[0], cols[1], cols[6], cols[7]
        if "." in ident:
            continue
        if "-" in ident:  # a multiword token: its words map to this surface token
            start, end = (int(x) for x in ident.split("-"))
            surface.append(form)
            for w in range(start, end + 1):
                word_to_surface[w] = len(surface) - 1
            range_end = end
            continue
        if not ident.isdigit() or not (head.isdigit() or head == "_"):
            raise UserError(f"{path}: sentence {number}: bad ID '{ident}' or HEAD '{head}'")
        w = int(ident)
        if w > range_end:
            surface.append(form)
            word_to_surface[w] = len(surface) - 1
        words.append((w, int(head) if head.isdigit() else 0, deprel))
    arcs = []
    for w, head, deprel in words:
        relation = _ALIASES.get(deprel.split(":")[0], deprel.split(":")[0])
        if relation in RELATIONS and head in word_to_surface:
            dep_s, gov_s = word_to_surface[w], word_to_surface[head]
            if dep_s != gov_s:
                arcs.append(Arc(relation, dep_s, gov_s))
    return ParsedSentence(tuple(surface), tuple(arcs))


# -- words and BPE pieces ------------------------------------------------------------------------------------

# Moses escapes (sacremoses tokenize without -x) and aggressive hyphen splits, undone for character alignment.
_MOSES = {"&amp;": "&", "&lt;": "<", "&gt;": ">", "&apos;": "'", "&quot;": '"', "&#124;": "|", "&#91;": "[",
          "&#93;": "]", "@-@": "-"}
_MOSES_RE = re.compile("|".join(re.escape(k) for k in _MOSES))
MIN_ALIGNED = 0.9


def _piece_characters(pieces: Sequence[str]) -> Tuple[str, List[int]]:
    chars, owner = [], []
    for i, piece in enumerate(pieces):
        for c in piece[:-2] if piece.endswith("@@") else piece:
            chars.append(c)
            owner.append(i)
    text = "".join(chars)
    out, out_owner, i = [], [], 0
    while i < len(text):
        m = _MOSES_RE.match(text, i)
        step = m.end() - i if m else 1
        out.append(_MOSES[m.group()] if m else text[i])
        out_owner.append(owner[i])
        i += step
    return "".join(out), out_owner


def align_surface_to_pieces(surface: Sequence[str], pieces: Sequence[str]) -> Optional[List[List[int]]]:
    """The piece indices of each surface token, by aligning characters (whitespace ignored, Moses escapes and
    @-@ undone); None when under 90% of the parse's characters find a piece (the parse is of another
    sentence, or another text normalisation). Unknown pieces (<unk>) simply leave their characters unmatched."""
    piece_text, owner = _piece_characters(pieces)
    chars, char_owner = [], []
    for i, form in enumerate(surface):
        for c in re.sub(r"\s", "", form):
            chars.append(c)
            char_owner.append(i)
    if not chars:
        return None
    groups: List[set] = [set() for _ in surface]
    matched = 0
    matcher = difflib.SequenceMatcher(None, "".join(chars), piece_text, autojunk=False)
    for a, b, size in matcher.get_matching_blocks():
        for k in range(size):
            groups[char_owner[a + k]].add(owner[b + k])
        matched += size
    if matched < MIN_ALIGNED * len(chars):
        return None
    return [sorted(g) for g in groups]


def word_attention(weights: torch.Tensor, groups: Sequence[Sequence[int]]) -> torch.Tensor:
    """(heads, words, words + 1) word-to-word attention from (heads, pieces, pieces) piece attention: the
    mean over a query word's pieces of the sum over a key word's pieces; the last column holds the attention
    that goes to pieces of no word (EOS, unaligned pieces). Words without pieces get empty rows."""
    heads, n, _ = weights.shape
    w = len(groups)
    to_word = torch.zeros(n, w + 1, dtype=weights.dtype)
    from_word = torch.zeros(w, n, dtype=weights.dtype)
    covered = torch.zeros(n, dtype=torch.bool)
    for i, g in enumerate(groups):
        for p in g:
            to_word[p, i] = 1.0
            covered[p] = True
        if g:
            from_word[i, list(g)] = 1.0 / len(g)
    to_word[~covered, w] = 1.0
    return torch.einsum("wq,hqk,kv->hwv", from_word, weights.cpu(), to_word)


def syntactic_counts(word_attn_by_layer: Dict[object, torch.Tensor], sentence: ParsedSentence,
                     groups: Sequence[Sequence[int]]) -> Tuple[Dict[object, Dict[str, List[int]]], Dict[str, Dict]]:
    """Hits per layer, head and relation-direction, and per relation-direction the arcs' count and relative
    word offsets (for the positional baseline). Arcs with a word that has no piece are left out."""
    hits: Dict[object, Dict[str, List[int]]] = {}
    arcs: Dict[str, Dict] = {}
    for arc in sentence.arcs:
        if not groups[arc.dependent] or not groups[arc.governor]:
            continue
        for direction, (query, target) in zip(DIRECTIONS, ((arc.dependent, arc.governor),
                                                           (arc.governor, arc.dependent))):
            name = f"{arc.relation} {direction}"
            entry = arcs.setdefault(name, {"n": 0, "offsets": {}})
            entry["n"] += 1
            offset = str(target - query)
            entry["offsets"][offset] = entry["offsets"].get(offset, 0) + 1
            for layer, attn in word_attn_by_layer.items():
                best = attn[:, query].argmax(dim=-1)  # (heads,)
                row = hits.setdefault(layer, {}).setdefault(name, [0] * attn.size(0))
                for h, b in enumerate(best.tolist()):
                    row[h] += int(b == target)
    return hits, arcs


def positional_baseline(offsets: Dict[str, int]) -> Tuple[Optional[int], float]:
    """The most frequent relative position of a relation-direction and the share of arcs it gets right."""
    if not offsets:
        return None, 0.0
    counter = Counter({int(k): v for k, v in offsets.items()})
    offset, count = counter.most_common(1)[0]
    return offset, count / sum(counter.values())


# -- labels -------------------------------------------------------------------------------------------------

def head_labels(prev: float, nxt: float, rare: float, syntactic: Dict[str, float], baselines: Dict[str, float],
                positional_threshold: float = POSITIONAL_THRESHOLD, rare_threshold: float = RARE_THRESHOLD,
                syntactic_margin: float = SYNTACTIC_MARGIN) -> List[str]:
    """A head's function labels from its shares: "positional -1", "positional +1", "rare", "syntactic REL DIR"."""
    labels = []
    if prev >= positional_threshold:
        labels.append("positional -1")
    if nxt >= positional_threshold:
        labels.append("positional +1")
    if rare >= rare_threshold:
        labels.append("rare")
    for name, accuracy in syntactic.items():
        if accuracy >= baselines.get(name, 0.0) + syntactic_margin:
            labels.append(f"syntactic {name}")
    return labels
