"""document.py: a report as blocks -> Markdown (figures linked) and one self-contained HTML page (figures as data
URIs), on a small document written by hand. No model."""
import base64
import re

import pytest
from PIL import Image

from browser import embedded_images, pil_decode
from fairseq_headprune.report.document import Document, data_uri, inline_html, to_html, to_markdown


@pytest.fixture
def figure(tmp_path):
    path = tmp_path / "figs" / "plot.png"
    path.parent.mkdir()
    image = Image.new("RGBA", (7, 5), (10, 20, 30, 255))
    image.putpixel((6, 4), (200, 100, 50, 255))  # the last pixel: a body cut short would lose it
    image.save(path)
    return path


def sample(figure) -> Document:
    doc = Document("Heads of `model.pt`: <report>")
    doc.heading("Claims & verdicts")
    doc.paragraph("A **bold** claim with `a|b <code>` and 1 < 2")
    doc.table(["id", "value | unit"], [["C1", "**supported**"], ["C2", "line\nbreak"]],
              row_classes=["verdict-supported", ""])
    doc.image(str(figure), "I_h per head <layer>")
    doc.code("fairseq-headprune report DATA --path m.pt\n\n")
    doc.bullets(["first `x`", "second"])
    return doc


def test_markdown(figure, tmp_path):
    md = to_markdown(sample(figure), str(tmp_path))
    assert md == (
        "# Heads of `model.pt`: <report>\n\n"
        "## Claims & verdicts\n\n"
        "A **bold** claim with `a|b <code>` and 1 < 2\n\n"
        "| id | value \\| unit |\n|---|---|\n| C1 | **supported** |\n| C2 | line break |\n\n"
        "![I_h per head <layer>](figs/plot.png)\n\n*I_h per head <layer>*\n\n"
        "```\nfairseq-headprune report DATA --path m.pt\n```\n\n"
        "- first `x`\n- second\n"
    )


def test_html_escapes_and_marks_up(figure):
    page = to_html(sample(figure))
    assert "<title>Heads of `model.pt`: &lt;report&gt;</title>" in page
    assert "<h1>Heads of <code>model.pt</code>: &lt;report&gt;</h1>" in page
    assert '<h2 id="claims-verdicts">Claims &amp; verdicts</h2>' in page
    assert "<p>A <strong>bold</strong> claim with <code>a|b &lt;code&gt;</code> and 1 &lt; 2</p>" in page
    assert ('<tr class="verdict-supported"><td>C1</td><td><strong>supported</strong></td></tr>'
            '<tr><td>C2</td><td>line\nbreak</td></tr>') in page
    assert "<pre><code>fairseq-headprune report DATA --path m.pt</code></pre>" in page
    assert "<ul><li>first <code>x</code></li><li>second</li></ul>" in page
    assert 'alt="I_h per head &lt;layer&gt;"' in page
    # self-contained: no reference to a file or another site
    assert not re.search(r'(src|href)="(?!data:)', page)


def test_html_embeds_the_figure_byte_for_byte(figure):
    page = to_html(sample(figure))
    images = embedded_images(page)
    assert images == [figure.read_bytes()]
    assert pil_decode(images[0])[:2] == (7, 5)
    assert data_uri(str(figure)) == "data:image/png;base64," + base64.b64encode(figure.read_bytes()).decode()


def test_inline_markup_does_not_bold_inside_code_and_escapes_everything_else():
    assert inline_html("`**x**` **y** <b>") == "<code>**x**</code> <strong>y</strong> &lt;b&gt;"


def test_only_images_can_be_embedded(tmp_path):
    other = tmp_path / "data.csv"
    other.write_text("a,b\n")
    with pytest.raises(ValueError, match="not a PNG, JPEG or SVG"):
        data_uri(str(other))
