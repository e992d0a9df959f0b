"""Privacy-utility of the release mechanisms at correctly counted budgets (issue 6, Deliver 2-3).

Synthetic covariate shift (K = 6 owners, Dirichlet(0.5) weights over 8 Gaussian components in
20 dimensions, 100k points, target = components 0 and 1 at 0.7/0.3, m = 500 validation points,
5,000 test points) and the appendix G digits split; p in {50, 100, 200}; seeds 0-4. Per row:
MMD^2 (exact RBF, to the test set) of exact greedy, uniform sampling and the private protocol;
gap closed = (uniform - private) / (uniform - greedy); LinearSVC accuracy; the worst epsilon per
owner and of the validation set over the seeds (ledger, dp-accounting PLD, delta 1e-5); distinct
points the curator received. Mechanisms (actors/harness/utility.py, MECHANISMS): "paper" (Table 1:
MWEM h2, paper auction; its budget is not met and its auction has no finite epsilon), and,
planned to eps_owner <= 1 and eps_validation <= 3 by protocol/release_plan.plan_releases:
"gaussian", "tree", "herding" (every bidder asked) and "herding-pure" (calibrated pure auction).

    python benchmarks/utility.py            # full grid (about 15 minutes on 2 cores)
    python benchmarks/utility.py --quick    # seed 0, p in {50, 100}, paper / tree / herding

Last line: {"benchmark": "utility", "rows": [{"dataset", "mechanism", "p", "gap_closed",
"mmd2_private", "mmd2_greedy", "mmd2_uniform", "svm_private", "svm_uniform", "svm_greedy",
"eps_owner", "eps_validation", "delta"}, ...]}.
"""

from __future__ import annotations

import sys

from dpmarket.actors.commands.evaluate import utility_main

if __name__ == "__main__":
    # a benchmark is a simulation on bundled public data: its numbers must repeat, so its
    # noise follows a public seed (actors/randomness.py; never in a deployed run)
    sys.exit(utility_main(["--reproducible-noise", *sys.argv[1:]]))
