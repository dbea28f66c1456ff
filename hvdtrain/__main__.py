import sys

from hvdtrain.cli.main import main

sys.exit(main())
