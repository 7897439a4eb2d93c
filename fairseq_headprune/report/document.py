"""A report as a list of blocks, written both as Markdown (figures linked) and as one self-contained HTML file
(figures embedded as base64 data URIs, styles inline): no Markdown parser and no template engine needed.

Inline markup in text and table cells: **bold** and `code`, nothing else; everything else is escaped.
"""
from __future__ import annotations

import base64
import html
import os
import re
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

_CODE = re.compile(r"`([^`]+)`")
_BOLD = re.compile(r"\*\*(.+?)\*\*")

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; max-width: 72rem; margin: 2rem auto;
       padding: 0 1rem; line-height: 1.45; color: #1a1a1a; }
h1 { border-bottom: 2px solid #ddd; padding-bottom: .3rem; }
h2 { margin-top: 2.2rem; border-bottom: 1px solid #eee; }
table { border-collapse: collapse; margin: .8rem 0; font-size: .9rem; }
th, td { border: 1px solid #ccc; padding: .25rem .5rem; text-align: left; vertical-align: top; }
th { background: #f4f4f4; }
code, pre { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: .85rem; }
pre { background: #f6f8fa; padding: .6rem; overflow-x: auto; white-space: pre-wrap; word-break: break-all; }
figure { margin: 1rem 0; }
figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { font-size: .85rem; color: #555; }
.verdict-supported { background: #e6f4ea; }
.verdict-not-supported { background: #fce8e6; }
.verdict-not-run, .verdict-incomplete { background: #fef7e0; }
"""


@dataclass
class Block:
    kind: str  # heading, paragraph, table, image, code, bullets
    text: str = ""
    level: int = 2
    headers: Tuple[str, ...] = ()
    rows: Tuple[Tuple[str, ...], ...] = ()
    row_classes: Tuple[str, ...] = ()
    items: Tuple[str, ...] = ()


@dataclass
class Document:
    title: str
    blocks: List[Block] = field(default_factory=list)

    def heading(self, text: str, level: int = 2) -> None:
        self.blocks.append(Block("heading", text, level=level))

    def paragraph(self, text: str) -> None:
        self.blocks.append(Block("paragraph", text))

    def table(self, headers: Sequence[str], rows: Sequence[Sequence[str]],
              row_classes: Optional[Sequence[str]] = None) -> None:
        self.blocks.append(Block("table", headers=tuple(headers), rows=tuple(tuple(str(c) for c in r) for r in rows),
                                 row_classes=tuple(row_classes or ())))

    def image(self, path: str, caption: str) -> None:
        """A figure file; it must exist when the document is written (a report never links a missing figure)."""
        self.blocks.append(Block("image", caption, items=(path,)))

    def code(self, text: str) -> None:
        self.blocks.append(Block("code", text))

    def bullets(self, items: Sequence[str]) -> None:
        self.blocks.append(Block("bullets", items=tuple(items)))


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(doc: Document, folder: str) -> str:
    """Markdown with figures linked relative to `folder` (where the .md file goes)."""
    out = [f"# {doc.title}", ""]
    for b in doc.blocks:
        if b.kind == "heading":
            out += ["#" * b.level + " " + b.text, ""]
        elif b.kind == "paragraph":
            out += [b.text, ""]
        elif b.kind == "table":
            out.append("| " + " | ".join(_md_cell(h) for h in b.headers) + " |")
            out.append("|" + "---|" * len(b.headers))
            out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in b.rows]
            out.append("")
        elif b.kind == "image":
            rel = os.path.relpath(os.path.abspath(b.items[0]), os.path.abspath(folder))
            out += [f"![{b.text}]({rel})", "", f"*{b.text}*", ""]
        elif b.kind == "code":
            out += ["```", b.text.rstrip("\n"), "```", ""]
        elif b.kind == "bullets":
            out += [f"- {item}" for item in b.items] + [""]
    return "\n".join(out).rstrip("\n") + "\n"


def inline_html(text: str) -> str:
    """Escape, then turn `code` and **bold** into tags (code spans first: no bold inside code)."""
    parts = _CODE.split(text)
    out = []
    for i, part in enumerate(parts):
        if i % 2:
            out.append(f"<code>{html.escape(part)}</code>")
        else:
            out.append(_BOLD.sub(r"<strong>\1</strong>", html.escape(part)))
    return "".join(out)


def data_uri(path: str) -> str:
    ext = os.path.splitext(path)[1].lower().lstrip(".")
    mime = {"png": "image/png", "jpg": "image/jpeg", "jpeg": "image/jpeg", "svg": "image/svg+xml"}.get(ext)
    if mime is None:
        raise ValueError(f"cannot embed {path}: not a PNG, JPEG or SVG")
    with open(path, "rb") as f:
        return f"data:{mime};base64," + base64.b64encode(f.read()).decode("ascii")


def to_html(doc: Document) -> str:
    """One self-contained HTML page: inline style, every figure a data URI, no external reference."""
    body = [f"<h1>{inline_html(doc.title)}</h1>"]
    for b in doc.blocks:
        if b.kind == "heading":
            anchor = re.sub(r"[^a-z0-9]+", "-", b.text.lower()).strip("-")
            body.append(f'<h{b.level} id="{anchor}">{inline_html(b.text)}</h{b.level}>')
        elif b.kind == "paragraph":
            body.append(f"<p>{inline_html(b.text)}</p>")
        elif b.kind == "table":
            head = "".join(f"<th>{inline_html(h)}</th>" for h in b.headers)
            rows = []
            for i, row in enumerate(b.rows):
                cls = b.row_classes[i] if i < len(b.row_classes) and b.row_classes[i] else ""
                attr = f' class="{html.escape(cls)}"' if cls else ""
                rows.append(f"<tr{attr}>" + "".join(f"<td>{inline_html(c)}</td>" for c in row) + "</tr>")
            body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>")
        elif b.kind == "image":
            alt = html.escape(b.text, quote=True)
            body.append(f'<figure><img src="{data_uri(b.items[0])}" alt="{alt}">'
                        f"<figcaption>{inline_html(b.text)}</figcaption></figure>")
        elif b.kind == "code":
            body.append(f"<pre><code>{html.escape(b.text.rstrip())}</code></pre>")
        elif b.kind == "bullets":
            body.append("<ul>" + "".join(f"<li>{inline_html(i)}</li>" for i in b.items) + "</ul>")
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{html.escape(doc.title)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n"
            + "\n".join(body) + "\n</body>\n</html>\n")
