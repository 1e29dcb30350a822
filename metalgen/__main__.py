"""`python -m metalgen ...` is the `metalgen` command."""

import sys

from .cli import main

sys.exit(main())
