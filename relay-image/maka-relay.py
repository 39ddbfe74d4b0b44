"""The relay bundle's entry point: PyInstaller freezes this into bin/maka-relay.

The same program as `python -m maka_eval.relay`, with its own interpreter, standard
library and dependencies beside it (bin/_internal), so it runs in task images that have
no Python at all. relay-image/build-bundle.sh builds it.
"""

import sys

from maka_eval.relay.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
