"""The HTML report in a real browser (Debian's Chromium, headless) and every embedded image decoded completely.

Two independent decoders look at each `data:image/png;base64,...` image:
- PIL: `verify()` (chunk CRCs, structure) then `load()` (the whole zlib stream, every row);
- Chromium: once the page has loaded, a probe script draws each image onto a canvas and sums the pixels it gets
  back (RGBA values and the number of non-transparent pixels); a broken image cannot be drawn at all.
A PNG whose body is truncated or has zeroed bytes still has a valid header: the browser reports its size and
draws what it could decode (the top rows), so only the drawn pixels compared with a complete decode show it.
"""
from __future__ import annotations

import base64
import html as html_lib
import io
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
DATA_URI = re.compile(r'<img [^>]*src="data:image/png;base64,([A-Za-z0-9+/=]+)"')
PROBE = """<script>
window.addEventListener("load", () => {
  const all = Array.from(document.images);
  const images = all.map(img => {
    let drawn = null;
    try {  // drawing a loaded image draws what the browser decoded of it
      const canvas = document.createElement("canvas");
      canvas.width = img.naturalWidth; canvas.height = img.naturalHeight;
      const ctx = canvas.getContext("2d");
      ctx.drawImage(img, 0, 0);
      const d = ctx.getImageData(0, 0, canvas.width, canvas.height).data;
      let opaque = 0, sum = 0;
      for (let k = 0; k < d.length; k += 4) {
        sum += d[k] + d[k + 1] + d[k + 2] + d[k + 3];
        if (d[k + 3] > 0) opaque++;
      }
      drawn = [opaque, sum];
    } catch (e) { drawn = String(e); }
    return {complete: img.complete, width: img.naturalWidth, height: img.naturalHeight, drawn: drawn};
  });
  document.body.setAttribute("data-probe", JSON.stringify({images: images, title: document.title,
                                                           tables: document.querySelectorAll("table").length}));
});
</script>"""


def embedded_images(html: str) -> List[bytes]:
    """The bytes of every PNG embedded in an <img> of the page, in document order."""
    return [base64.b64decode(b64) for b64 in DATA_URI.findall(html)]


def pil_decode(data: bytes) -> Tuple[int, int, int, int]:
    """(width, height, non-transparent pixels, sum of RGBA values) of a PNG decoded completely by PIL; raises
    (OSError, SyntaxError, ValueError...) if any part of it is damaged."""
    import numpy as np
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        im.verify()  # structure and CRCs; the image must be reopened after verify
    with Image.open(io.BytesIO(data)) as im:
        im.load()  # inflates every row: a truncated or corrupted stream raises here
        rgba = np.asarray(im.convert("RGBA"), dtype=np.int64)
    return rgba.shape[1], rgba.shape[0], int((rgba[..., 3] > 0).sum()), int(rgba.sum())


def browser_probe(html_path: Path, tmp: Path) -> dict:
    """Load a copy of the page (with the probe script) in headless Chromium; what the browser decoded and drew."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"Chromium not found at {CHROMIUM}: the HTML report is checked in a real browser. Install "
                    "Debian's chromium (`apt-get install -y chromium`; `make test` does it when run as root) or "
                    "set CHROMIUM to a Chromium/Chrome binary.")
    page = tmp / "probe.html"
    page.write_text(html_path.read_text(encoding="utf-8").replace("</body>", PROBE + "\n</body>"), encoding="utf-8")
    profile = tmp / "chromium-profile"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
           "--virtual-time-budget=10000", "--dump-dom", page.resolve().as_uri()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    found = re.search(r'data-probe="([^"]*)"', proc.stdout)
    assert found, f"chromium did not run the page (exit {proc.returncode}): {proc.stderr[-2000:]}"
    return json.loads(html_lib.unescape(found.group(1)))


def pil_problems(images: List[bytes]) -> Dict[int, str]:
    """The images PIL cannot decode completely, by index, with its error."""
    problems = {}
    for i, data in enumerate(images):
        try:
            pil_decode(data)
        except Exception as e:  # noqa: BLE001 - any decoder error is the finding
            problems[i] = f"PIL: {type(e).__name__}: {e}"
    return problems


def browser_problems(expected: List[bytes], probe: dict) -> Dict[int, str]:
    """The images the browser did not decode and draw exactly as a complete decode of `expected` (the intact
    PNGs the page should show, in order), by index; -1 if it saw another number of images."""
    problems: Dict[int, str] = {}
    if len(probe["images"]) != len(expected):
        problems[-1] = f"the browser saw {len(probe['images'])} images, expected {len(expected)}"
    for i, (data, seen) in enumerate(zip(expected, probe["images"])):
        width, height, opaque, total = pil_decode(data)
        if not (seen["complete"] and seen["width"] > 0):
            problems[i] = f"not decoded ({seen['width']}x{seen['height']}, drawn: {seen['drawn']})"
        elif (seen["width"], seen["height"]) != (width, height):
            problems[i] = f"{seen['width']}x{seen['height']}, the PNG is {width}x{height}"
        elif seen["drawn"] != [opaque, total]:
            problems[i] = f"drew {seen['drawn']} (opaque pixels, RGBA sum), a complete decode {[opaque, total]}"
    return problems
