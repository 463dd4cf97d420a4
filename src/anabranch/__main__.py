import sys

from anabranch.cli import main

sys.exit(main())
