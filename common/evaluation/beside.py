"""The figure beside a run's headline ε (summary.json's ``epsilon_amplified``), named for what it is.

The key is historical: through GS-WGAN in the clear it holds the amplified ε (an assumption that the
server samples clients uniformly), through Fed-Avg GAN in the clear the user-level ε against a trusted
server, through a secure-sum channel the worst client's ε against a server that deviates from the
secure sum, where no client sampling is relied on. Its ``kind`` says which (``common/methods/base.py``
privacy_report), and plots and captions name it by that kind: calling every one "amplified" claimed an
assumption that a secure run never made (issue 43).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# common/privacy/statement.py's KIND_AMPLIFIED, as summary.json spells it (a test keeps them equal);
# not imported, so that plotting a run directory never loads the privacy package and torch.
AMPLIFIED_KIND = "amplified, trusted sampling"
AMPLIFIED_LABEL = "trusted sampling (assumption)"
AMPLIFIED_CAPTION = "the amplified ε, which assumes the server samples clients uniformly (trusted sampling)"
# common/privacy/statement.py's KIND_PER_CLIENT (a test keeps them equal): the headline's kind of a summary
# written before kinds were recorded, and of a run in the clear.
HEADLINE_KIND = "per client, untrusted server"


def headline_kind(summary: dict) -> str:
    """What the run's headline ε is against (summary.json's ``epsilon_kind``), e.g. "per client,
    server runs the secure sum": every figure that draws the headline names it in these words."""
    return str(summary.get("epsilon_kind") or HEADLINE_KIND)


@dataclass(frozen=True)
class BesideFigure:
    """What the figure beside the headline is: its ``kind`` and the ``assumption`` it rests on."""

    kind: str = AMPLIFIED_KIND
    assumption: str = ""

    @classmethod
    def of(cls, summary: dict) -> BesideFigure:
        """From a summary; one written before kinds were recorded held the amplified ε."""
        entry = summary.get("epsilon_amplified") or {}
        return cls(str(entry.get("kind", AMPLIFIED_KIND)), str(entry.get("assumption") or ""))

    @property
    def amplified(self) -> bool:
        """Whether the figure rests on the server sampling clients (so sampling could lower it)."""
        return self.kind == AMPLIFIED_KIND

    @property
    def name(self) -> str:
        """How a legend names it: 'amplified ε, trusted sampling (assumption)' or 'ε <kind>'."""
        if self.amplified:
            return f"amplified ε, {AMPLIFIED_LABEL}"
        return f"ε {self.kind}" if self.kind else "ε beside the headline"

    def legend(self, epsilon: float) -> str:
        """The legend entry of a line drawn at ``epsilon``."""
        if self.amplified:
            return f"amplified ε = {epsilon:.4g}, {AMPLIFIED_LABEL}"
        return f"{self.name} = {epsilon:.4g}"

    @property
    def caption(self) -> str:
        """A caption's words for it, with the assumption it rests on."""
        if self.amplified:
            return AMPLIFIED_CAPTION
        return self.name + (f" — {self.assumption}" if self.assumption else "")


def epsilon_captions(summary: dict) -> dict[str, str]:
    """report.html's captions of the two figures that draw ε, in the run's own terms: the headline's
    kind, and the figure beside it named for what it is (dashed only where it is a number)."""
    beside = BesideFigure.of(summary)
    epsilon = (summary.get("epsilon_amplified") or {}).get("epsilon")
    drawn = isinstance(epsilon, (int, float)) and math.isfinite(epsilon)
    kind = headline_kind(summary)
    return {
        "epsilon_per_client": f"ε {kind}: each client's own answered queries composed, no amplification."
        + (f" Dashed: {beside.caption}." if drawn else ""),
        "training_curves": f"ε (max and median over clients; dotted, where recorded: {beside.name}) and the "
        "critic's Wasserstein estimate over generator steps.",
    }
