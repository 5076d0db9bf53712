"""Quality evidence: task suites asked of OpenAI-compatible endpoints, each answer scored by a checker.

suites    the suites by name: HumanEval, BFCL v4 (simple, multiple, parallel, multi-turn), retrieval, long
humaneval coding: the completion run against the problem's tests in the sandbox, pass@1 greedy
bfcl      tool calls through the OpenAI tools API, scored by bfcl-eval's AST and state checkers; unparsed apart
longgen   long generations (agreement and KL by answer position) and retrieval at 32k-120k tokens
sandbox   model-written code in a jail (jail.py): namespaces, read-only view, no network, limits, timeout
client    one chat completion; an endpoint's error is never a wrong answer
data      the suites' data: package version, checksum, the seeded choice of problems
answer    one problem's answer from one endpoint
run       an evaluation: suites x endpoints, pass rates with intervals, the paired A/B and its gate
command   `capbench eval`
"""

from bench.eval.command import Options, eval_command
from bench.eval.run import TWIN_NOTE, evaluate, summary
from bench.eval.sandbox import Limits, why_not

__all__ = ["Options", "eval_command", "TWIN_NOTE", "evaluate", "summary", "Limits", "why_not"]
