"""`python -m scaleladder ...` is the same as `scaleladder ...` (torchrun needs a module or a script)."""

import sys

from scaleladder.cli import main

sys.exit(main())
