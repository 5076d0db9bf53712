"""`python -m bench.cli`: the capbench command under a named interpreter (a campaign's `python:` that needs
capbench's SGLang patches runs `PYTHON -m bench.cli sglang-launch ...`)."""

from bench.cli import main

main()
