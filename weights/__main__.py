import sys

from weights.convert import main

sys.exit(main())
