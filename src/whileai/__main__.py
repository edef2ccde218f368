import sys

from whileai.cli import main

sys.exit(main())
