"""`uv pip install|uninstall ARGS` into the virtual environment this interpreter belongs to, under the machine's pip
configuration (adapters/uv_install.py). scripts/bootstrap.sh runs it before the project is installed."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from adapters.uv_install import find_uv, uv_pip  # noqa: E402

if __name__ == "__main__":
    command, args = sys.argv[1], sys.argv[2:]
    proc = uv_pip(find_uv(), command, ["--python", sys.executable, *args])
    sys.stdout.write(proc.stdout)
    sys.stderr.write(proc.stderr)
    sys.exit(proc.returncode)
