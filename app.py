"""Web demo launcher: `python app.py [--pair P | --target T --draft D] [--device cpu] [--host H --port N]`.

Thin on purpose: everything lives in `asr_app.ui` (see docs/ui.md).
"""

import sys

from asr_app.ui import main

if __name__ == "__main__":
    sys.exit(main())
