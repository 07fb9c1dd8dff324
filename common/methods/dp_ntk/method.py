"""DP-NTK as the shells see it: DP-MERF's one-shot release with the tangent features as φ."""

from __future__ import annotations

from typing import TYPE_CHECKING

from common.methods.dp_merf.messages import MerfRelease, MerfRequest
from common.methods.dp_merf.method import DpMerf

from . import options
from .features import TANGENT

if TYPE_CHECKING:
    from common.methods import ExperimentConfig

MSG_EMBED = "train.dpntk"  # its own message type: the registry finds a method by its messages


class DpNtk(DpMerf):
    name = "dp-ntk"
    title = "DP-NTK"
    options = options.Options
    messages = {MSG_EMBED: (MerfRequest, MerfRelease)}
    family = TANGENT

    def validate(self, cfg: ExperimentConfig) -> None:
        options.validate(cfg)  # the shared release options are checked by DP-MERF's section


METHOD = DpNtk()
