"""MI300X's roofline factors fitted per organisation fold: for each organisation with MI300X cases in the goal, fit
multipliers of MI300X's hbm_eff and kernel_us (scipy least_squares, bounded, soft-L1 loss) on the other
organisation's MI300X cases (each case with the factors fitted without its own organisation, as `validate --rescore`
does), and print the held-out cases' median |log(predicted / published)| of output tok/s and TPOT before and after.

    python -m bench.benchmarks.mi300x_folds
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time

import numpy as np
from scipy.optimize import least_squares

from bench.model import corpus, fit, validate

BOUNDS = ([0.2, 0.2], [1.3, 8.0])  # hbm_eff and kernel_us multipliers


def residuals(cases: list, mult: list[float], by_org: dict, default: dict) -> np.ndarray:
    out = []
    for c in cases:
        eff = fit.scaled(c.gpu, by_org.get(c.source.org, default))
        eff = dataclasses.replace(eff, hbm_eff=min(1.0, eff.hbm_eff * mult[0]), kernel_us=eff.kernel_us * mult[1])
        r = validate.replay(c, eff)
        out += [math.log1p(r.errors[f]) for f in ("output_tok_s", "tpot_ms") if f in r.errors]
    return np.array(out)


def main() -> int:
    by_org = fit.stored_validation()["out_of_sample"]["scales_by_left_out_org"]
    default = json.loads(fit.CORPUS_CALIBRATION.read_text())["scale"]
    cases = [c for c in corpus.load() if c.gpu == "mi300x" and fit.in_goal(c) is None and c.kind == "throughput"]
    for org in sorted({c.source.org for c in cases}):
        train = [c for c in cases if c.source.org != org]
        held = [c for c in cases if c.source.org == org]
        t0 = time.perf_counter()
        res = least_squares(lambda m, tr=train: residuals(tr, list(m), by_org, default), [1.0, 1.0], bounds=BOUNDS,
                            loss="soft_l1", f_scale=0.3, diff_step=0.05)
        before = np.median(np.abs(residuals(held, [1.0, 1.0], by_org, default)))
        after = np.median(np.abs(residuals(held, list(res.x), by_org, default)))
        at_bound = [n for n, x, lo, hi in zip(("hbm_eff", "kernel_us"), res.x, *BOUNDS, strict=True)
                    if math.isclose(x, lo) or math.isclose(x, hi)]
        print(f"{org} held out ({len(held)} cases; fitted on {len(train)}): hbm_eff x{res.x[0]:.2f}, "
              f"kernel_us x{res.x[1]:.2f}{' (at its bound: ' + ', '.join(at_bound) + ')' if at_bound else ''}; "
              f"held-out median |log error| {before:.2f} -> {after:.2f} ({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
