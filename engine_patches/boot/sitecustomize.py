"""Run at the start of every Python process whose PYTHONPATH the capbench launcher set (SGLang's server,
its spawned schedulers and detokenizer): hook capbench's patches onto the SGLang modules they attach to.
Then run the sitecustomize this one shadows, if any. See engine_patches/launch.py."""

import importlib.machinery
import importlib.util
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))

try:
    from engine_patches.launch import install_hooks

    install_hooks()
except Exception as e:  # a broken patch must say so, not kill every Python process silently
    print(f"capbench: patches not installed in pid {os.getpid()}: {e!r}", file=sys.stderr)
    raise

_others = [p for p in sys.path if os.path.abspath(p or ".") != _here]
_spec = importlib.machinery.PathFinder.find_spec("sitecustomize", _others)
if _spec is not None and _spec.loader is not None:
    _spec.loader.exec_module(importlib.util.module_from_spec(_spec))
