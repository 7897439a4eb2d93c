"""The shrink stage: the chosen heads (and decoder layers, FFN units) removed and the model reconstructed with
compress's recipe (compress.stages.shrink_recipe), written as a fairseq checkpoint; the choice's own shrink of the
same heads with the same options reused where it made one."""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from typing import Dict, Optional

from fairseq_headprune.compress.stages.contract import Context, Inputs, Results, Stage
from fairseq_headprune.compress.stages.elsewhere import left_at_stop
from fairseq_headprune.compress.stages.results import Shrunk
from fairseq_headprune.compress.stages.shrink_recipe import settings, shrink_heads
from fairseq_headprune.records.identity import file_sha256


@dataclass(frozen=True)
class ShrinkInputs(Inputs):
    """What the shrink reads: the recipe's settings (shrink_recipe.settings) and the chosen heads, kept layers and
    FFN share; its identity {"options": {...}}, as its records have held it."""
    settings: Dict
    heads: str
    layers_kept: Optional[Dict] = None
    ffn_percent: Optional[float] = None

    def identity(self) -> Dict:
        return {"options": {**self.settings, "heads": self.heads,
                            **({"layers_kept": self.layers_kept} if self.layers_kept else {}),
                            **({"ffn_percent": self.ffn_percent} if self.ffn_percent is not None else {})}}


def inputs(context: Context, results: Results) -> ShrinkInputs:
    chosen = results["choice"].chosen
    narrowed = chosen.shape.ffn_percent if chosen.shape.ffn_percent < 100 else None
    return ShrinkInputs(settings(context.loaded, context.options), chosen.heads, chosen.layers_kept, narrowed)


def build(folder: str, inputs: ShrinkInputs, context: Context, results: Results) -> Shrunk:
    """The chosen shape shrunk (or the choice's own shrink of it, reused)."""
    probe = results["choice"].shrunk
    if probe and os.path.exists(probe["checkpoint"]) and file_sha256(probe["checkpoint"]) == probe["checkpoint_sha256"]:
        path = os.path.join(folder, "model.pt")  # the choice shrank these heads with these options
        shutil.copyfile(probe["checkpoint"], path)
        shutil.copyfile(os.path.splitext(probe["checkpoint"])[0] + ".json", os.path.join(folder, "model.json"))
        context.log("shrink: the choice's shrink of these heads, reused")
        return Shrunk.of({**probe, "checkpoint": path})
    ffn = 100.0 if inputs.ffn_percent is None else inputs.ffn_percent
    return Shrunk.of(shrink_heads(folder, context.loaded, context.shipped(results), inputs.heads, inputs.layers_kept,
                                  ffn))


STAGE = Stage("shrink", inputs, build, Shrunk, after=left_at_stop)  # --stop-after shrink: the recovery's folder
