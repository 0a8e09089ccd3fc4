"""``python -m robo_resume.cli``: the same as the ``robo-resume`` command."""

import sys

from . import main

sys.exit(main())
