"""`capbench plan --campaign FILE`: the plan's campaign file (bench/model/advice/campaign_file.py) written where
the user said, its workload file beside it, and where it went said in one line."""

from __future__ import annotations

import sys
from pathlib import Path

from bench.errors import BadInput
from bench.model import Plan, for_plan


def write_campaign(result: Plan, out: str) -> None:
    """The plan's campaign file (bench/model/advice/campaign_file.py) at `out`, its workload file beside it; where
    it went on stderr, so the answer stays the first thing on stdout (and --json stays JSON)."""
    made = for_plan(result)
    if made is None:
        raise BadInput("nothing serves this question within the SLO: no campaign file to write")
    path = Path(out).expanduser()
    if not path.parent.is_dir():
        raise BadInput(f"directory of --campaign does not exist: {path.parent}")
    if made.workload_name:
        (path.parent / made.workload_name).write_text(made.workload_text or "")
    path.write_text(made.text)
    print(f"campaign file for this question: {path} (check: capbench campaign {path} --check)",
          file=sys.stderr)
