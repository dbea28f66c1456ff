import sys

from hvdtrain.cli import main

sys.exit(main())
