import sys

from axengine.cli import main

sys.exit(main())
