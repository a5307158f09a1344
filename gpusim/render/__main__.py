"""``python -m gpusim.render``: see :func:`gpusim.render.cli.main`."""

import sys

from gpusim.render.cli import main

if __name__ == "__main__":
    sys.exit(main())
