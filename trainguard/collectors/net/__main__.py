import sys

from trainguard.collectors.net.cli import main

sys.exit(main())
