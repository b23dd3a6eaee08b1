"""The seeds' library (eval-ai-library 0.8.2) pins its own LiteLLM, so it lives in a venv of its own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PEERS_VENV = Path(__file__).resolve().parents[1] / ".venv-peers"
EVAL_LIB = "eval-ai-library==0.8.2"


def peers_python() -> Path | None:
    """The peers' interpreter, creating the venv on first use; None when it cannot be installed here."""
    python = PEERS_VENV / "bin" / "python"
    marker = PEERS_VENV / ".installed"
    if marker.exists():
        return python
    try:
        subprocess.run([sys.executable, "-m", "venv", str(PEERS_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", EVAL_LIB], check=True, timeout=900)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        print(f"bench: could not install {EVAL_LIB}: {exc}", file=sys.stderr)
        return None
    marker.touch()
    return python
