"""A market that understates its secure sums' L2 sensitivities 20x (issue 36, "Done when").

    python tests/integration/lying_market.py run MARKET.toml --out OUT

is ``dpmarket run MARKET.toml --out OUT`` (the CLI's own main, same arguments) with one lie:
the driver's actors/run/phases.py plans every secure-sum round with ``contribution_sensitivity``
divided by :data:`UNDERSTATEMENT`. ``SecureSumPlan.calibrated`` then calibrates each round's
sigma to the understated sensitivity, so the offer is consistent with itself: every declared
noise multiplier (sigma over the declared sensitivity) looks as honest as an honest market's,
while the noise is 20x too small for what an owner actually sends. Only an owner that derives the
sensitivity itself from what it sends (protocol/agents/policy.py ``price_rounds``) sees it.
"""

from __future__ import annotations

import sys
from typing import Any

from dpmarket.actors.commands.main import main
from dpmarket.actors.run import phases

UNDERSTATEMENT = 20.0

_honest = phases.contribution_sensitivity


def understated(*args: Any, **kwargs: Any) -> float:
    return _honest(*args, **kwargs) / UNDERSTATEMENT


if __name__ == "__main__":
    phases.contribution_sensitivity = understated
    sys.exit(main(sys.argv[1:]))
